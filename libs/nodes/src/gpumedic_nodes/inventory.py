"""The fleet inventory: how to reach each node over SSH, and which groups and labels it has.

Rented fleets mix providers, and each provider's pods differ in SSH user, port, key and the
bastion in front of them, so every setting can be given for all nodes (`defaults`), for a group,
or for one node; the most specific wins. `gpus` and `price_per_gpu_hour` are what report-builder
prices an incident's lost GPU time with (a rented worker's own price comes from its provider). `service_manager` says what runs the node's services,
which `restart_unit` goes through: systemd (the default), the supervisor `gpumedic enroll` puts on
a node without systemd (it sets this for the nodes it enrols so, and `gpumedic_dir` where it put
gpumedic elsewhere than ~/.gpumedic), or Docker (a container named like the unit, without `.service`). Groups and labels are what the policy's allow-lists and
the protected nodes refer to (`group:lambda`, `label:role=p2p`).

    defaults: {user: gpumedic}
    groups:
      lambda:
        user: ubuntu
        key: /etc/gpumedic/keys/lambda_ed25519
        jump: {host: bastion.lambda.example, user: jump}
        labels: {provider: lambda}
    nodes:
      gpu-node-01: {host: 10.0.0.7, group: lambda, labels: {role: p2p}}
      gpu-node-02: {host: 203.0.113.9, port: 40123}
      pod-7: {host: 198.51.100.4, port: 22107, user: root, service_manager: supervisor}

The simulated fleet writes this same format, so the remediator reaches simulated and real nodes
alike. The file is read again for every action, so nodes added or moved are picked up without a
restart; a node missing from it fails that action, never the service. `gpumedic inventory check`
tries every node read-only.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpumedic_events.base import SubjectToken

HOST_PATTERN = r"^[A-Za-z0-9]([A-Za-z0-9._:-]{0,251}[A-Za-z0-9])?$"
"""A DNS name, an IPv4 or an IPv6 address: never an option (`-oProxyCommand=...`), never a space."""
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,62}$"
LABEL_VALUE_PATTERN = r"^[A-Za-z0-9_.:/-]{0,63}$"
USER_PATTERN = r"^[a-z_][a-z0-9_.-]{0,31}$"
ServiceManager = Literal["systemd", "supervisor", "docker"]
DIR_PATTERN = r"^/[A-Za-z0-9._/-]{1,200}$"
"""An absolute path of plain characters (and no `..`: checked beside)."""


class InventoryError(Exception):
    """The inventory cannot be read, or does not name the node."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Hop(_Strict):
    """A jump host (bastion) in front of a node; its host key is checked like the node's."""

    host: str = Field(pattern=HOST_PATTERN)
    port: int = Field(default=22, ge=1, le=65535)
    user: str | None = Field(default=None, pattern=USER_PATTERN, description="Default: the node's user.")


class _Settings(_Strict):
    """What `defaults`, a group and a node may each set."""

    user: str | None = Field(default=None, pattern=USER_PATTERN)
    port: int | None = Field(default=None, ge=1, le=65535)
    key: Path | None = Field(default=None, description="Private key for this login; default: the remediator's client key.")
    jump: Hop | None = None
    service_manager: ServiceManager | None = None
    gpumedic_dir: str | None = Field(default=None, pattern=DIR_PATTERN,
                                     description="Where `gpumedic enroll` put gpumedic on the node; default ~/.gpumedic.")
    gpus: int | None = Field(default=None, ge=1, le=64, description="GPUs the node has (what a drain or a loss of the node takes out).")
    price_per_gpu_hour: float | None = Field(
        default=None, ge=0, le=10_000, description="What one of its GPUs costs an hour, in dollars: what an incident's lost GPU time costs."
    )
    labels: dict[str, str] = Field(default_factory=dict)

    @field_validator("gpumedic_dir")
    @classmethod
    def _no_way_up(cls, value: str | None) -> str | None:
        if value is not None and ".." in value.split("/"):
            raise ValueError(f"gpumedic_dir {value[:64]!r}: an absolute path without '..'")
        return value

    @model_validator(mode="after")
    def _label_names(self) -> _Settings:
        for key, value in self.labels.items():
            if not re.fullmatch(NAME_PATTERN, key) or not re.fullmatch(LABEL_VALUE_PATTERN, value):
                raise ValueError(f"label {key[:64]!r}={value[:64]!r}: letters, digits and _.-:/ only")
        return self


class _NodeEntry(_Settings):
    host: str = Field(pattern=HOST_PATTERN)
    group: str | None = Field(default=None, pattern=NAME_PATTERN)


class _InventoryFile(_Strict):
    defaults: _Settings = _Settings()
    groups: dict[str, _Settings] = Field(default_factory=dict)
    nodes: dict[SubjectToken, _NodeEntry] = Field(default_factory=dict)

    @model_validator(mode="after")
    def _groups_exist(self) -> _InventoryFile:
        for node_id, entry in self.nodes.items():
            if entry.group is not None and entry.group not in self.groups:
                raise ValueError(f"node {node_id} names group {entry.group!r}, which `groups` does not define")
        return self


class NodeAddress(BaseModel):
    """One node as the remediator reaches it: the inventory's settings resolved, most specific first."""

    model_config = ConfigDict(frozen=True)

    host: str
    port: int = 22
    user: str = "root"
    key: Path | None = None
    """None: the remediator's client key."""
    jump: Hop | None = None
    service_manager: ServiceManager = "systemd"
    gpumedic_dir: str | None = None
    """None: ~/.gpumedic of the login user."""
    group: str | None = None
    labels: dict[str, str] = Field(default_factory=dict)
    gpus: int | None = None
    price_per_gpu_hour: float | None = None

    @property
    def provider(self) -> str | None:
        """Who rents it out: its `provider` label, else its group."""
        return self.labels.get("provider") or self.group

    def describe(self) -> str:
        via = f" via {self.jump.user or self.user}@{self.jump.host}:{self.jump.port}" if self.jump else ""
        return f"{self.user}@{self.host}:{self.port}{via}"


def _resolve(file: _InventoryFile) -> dict[str, NodeAddress]:
    nodes = {}
    for node_id, entry in file.nodes.items():
        layers = [file.defaults, file.groups[entry.group] if entry.group else _Settings(), entry]

        def first(name: str, layers=layers):
            return next((getattr(layer, name) for layer in reversed(layers) if getattr(layer, name) is not None), None)

        labels: dict[str, str] = {}
        for layer in layers:
            labels.update(layer.labels)
        nodes[node_id] = NodeAddress(
            host=entry.host,
            port=first("port") or 22,
            user=first("user") or "root",
            key=first("key"),
            jump=first("jump"),
            service_manager=first("service_manager") or "systemd",
            gpumedic_dir=first("gpumedic_dir"),
            group=entry.group,
            labels=labels,
            gpus=first("gpus"),
            price_per_gpu_hour=first("price_per_gpu_hour"),
        )
    return nodes


def load_inventory(path: Path) -> dict[str, NodeAddress]:
    """Every node of the inventory file; raises InventoryError naming the file and the problem."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InventoryError(f"inventory {path} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"inventory {path} is not valid YAML: {exc}") from None
    try:
        return _resolve(_InventoryFile.model_validate(raw or {}))
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc'])) or 'inventory'}: {e['msg']}"
            for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise InventoryError(f"inventory {path} is not valid: {problems}") from None


def address_of(path: Path, node_id: str) -> NodeAddress:
    nodes = load_inventory(path)
    try:
        return nodes[node_id]
    except KeyError:
        raise InventoryError(f"unknown node {node_id!r}: not in inventory {path}") from None
