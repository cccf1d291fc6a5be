"""The fleet inventory: how to reach each node over SSH, from a YAML file.

The simulated fleet writes this same format, so the remediator reaches simulated and real
nodes alike:

    nodes:
      gpu-node-01: {host: 127.0.0.1, port: 40123, user: root}

The file is read again for every action, so nodes added or moved are picked up without a
restart; a node missing from it fails that action, never the service.
"""

from __future__ import annotations

from pathlib import Path

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError


class InventoryError(Exception):
    """The inventory cannot be read, or does not name the node."""


class NodeAddress(BaseModel):
    model_config = ConfigDict(frozen=True, extra="ignore")

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(default=22, ge=1, le=65535)
    user: str = Field(default="root", min_length=1, max_length=64)


class _InventoryFile(BaseModel):
    model_config = ConfigDict(extra="ignore")

    nodes: dict[str, NodeAddress] = Field(default_factory=dict)


def load_inventory(path: Path) -> dict[str, NodeAddress]:
    """Every node of the inventory file; raises InventoryError naming the file and the problem."""
    try:
        raw = yaml.safe_load(Path(path).read_text())
    except OSError as exc:
        raise InventoryError(f"inventory {path} cannot be read: {exc.strerror or exc}") from None
    except yaml.YAMLError as exc:
        raise InventoryError(f"inventory {path} is not valid YAML: {exc}") from None
    try:
        return _InventoryFile.model_validate(raw or {}).nodes
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(map(str, e['loc']))}: {e['msg']}" for e in exc.errors(include_url=False, include_input=False)[:5]
        )
        raise InventoryError(f"inventory {path} is not valid: {problems}") from None


def address_of(path: Path, node_id: str) -> NodeAddress:
    nodes = load_inventory(path)
    try:
        return nodes[node_id]
    except KeyError:
        raise InventoryError(f"unknown node {node_id!r}: not in inventory {path}") from None
