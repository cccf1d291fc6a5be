"""The remediator's settings, read once from GPUMEDIC_REMEDIATOR_* variables.

The defaults are the safe ones: observe mode (decide and record, never act), a small fleet
circuit breaker, requests refused after two minutes, and a few actions at once. How many actions
one node may take in a window comes from the policy file (GPUMEDIC_POLICY_FILE), the one place
every attempt cap is set. The three files (inventory, known_hosts,
client key) are checked when the service starts, not when the settings are built, so tests and
tools can construct settings freely; the client key's path is the only thing about it the
service ever names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import asyncssh
from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_incidents import PolicySettings
from gpumedic_incidents.policy import NodeSelector
from gpumedic_nodes.inventory import InventoryError, load_inventory
from gpumedic_providers.config import ProviderConfig
from gpumedic_store.settings import StoreSettings
from gpumedic_webhook import read_token
from remediator.gate import Mode

_CONFIG_DIR = Path("/etc/gpumedic")


class SettingsError(ValueError):
    """A setting the service cannot start with; the message says which and why."""


class Settings(BaseSettings):
    """How the remediator reaches nodes and when it may act. Read from GPUMEDIC_REMEDIATOR_* variables."""

    # compose passes an unset variable as "": that is the default, not a value
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_REMEDIATOR_", extra="ignore", env_ignore_empty=True)

    nats: NatsSettings = Field(default_factory=NatsSettings, description="GPUMEDIC_NATS_* variables.")
    store: StoreSettings = Field(default_factory=StoreSettings, description="GPUMEDIC_STORE_* variables.")
    policy: PolicySettings = Field(default_factory=PolicySettings, description="GPUMEDIC_POLICY_FILE.")

    inventory: Path = Field(
        default=_CONFIG_DIR / "inventory.yaml",
        description="YAML file naming every node (`nodes: {NODE: {host, port, user, key, jump, group, labels}}`, "
        "with `defaults` and `groups`; see deploy/inventory.example.yaml). Re-read per action.",
    )
    known_hosts: Path = Field(
        default=_CONFIG_DIR / "known_hosts", description="OpenSSH known_hosts; every node's host key is checked."
    )
    client_key: Path = Field(
        default=_CONFIG_DIR / "id_ed25519", description="Private key file for node logins; its content is never logged."
    )
    mode: Mode = Field(
        default="observe",
        description="The master switch. observe: decide and record, never act; enforce: act, for each operation "
        "whose mode in the policy file (`actions`) is enforce.",
    )
    protected_nodes: Annotated[set[str], NoDecode] = Field(
        default_factory=set,
        description="Nodes never acted on: node selectors (NODE, group:NAME, label:KEY=VALUE), comma-separated or a JSON list.",
    )
    breaker_max_nodes: int = Field(
        default=5, ge=1, description="More distinct nodes needing action within the window trips the breaker."
    )
    breaker_max_share: float = Field(
        default=0.25,
        gt=0,
        le=1,
        description="Nor more than this share of the inventory's nodes within the window (one node always may).",
    )
    breaker_window_s: float = Field(default=600.0, gt=0)
    max_request_age_s: float = Field(
        default=120.0,
        gt=0,
        description="A request older than this (by the server's clock, or its own) is refused as stale. "
        "Keep it under the detector's action timeout.",
    )
    max_concurrent_actions: int = Field(
        default=4,
        ge=1,
        le=64,
        description="Requests one instance handles at once (decisions are still taken one at a time; "
        "only actions on different nodes run together).",
    )
    connect_timeout_s: float = Field(default=10.0, gt=0, description="SSH connect, handshake and login.")
    command_timeout_s: float = Field(default=30.0, gt=0, description="One command on a node.")
    verify_timeout_s: float = Field(default=20.0, ge=0, description="How long killed processes have to vanish.")
    ssh_check_interval_s: float = Field(
        default=60.0, ge=0, description="How often every inventory node's SSH login is checked (no command runs); 0: never."
    )
    ssh_check_concurrency: int = Field(default=16, ge=1, le=256, description="Logins checked at once.")
    hook_token_file: Path | None = Field(
        default=None,
        description="A file holding the bearer token for the policy's drain hook (actions.drain_node.hook_url); "
        "read at start, never logged.",
    )
    admin_token_file: Path | None = Field(
        default=None,
        description="A file holding the bearer token for the node services' admin endpoints (actions.http_admin); "
        "read for each call, given to curl on stdin, never logged.",
    )
    provider: ProviderConfig | None = Field(
        default=None,
        description='Where workers are rented and ended (JSON: {"kind": "runpod", "api_key_file": FILE, "image": ...}); '
        "none: spawn_worker and terminate_worker fail with that reason.",
    )
    task_db_url_file: Path | None = Field(
        default=None,
        description="A file holding the SQLAlchemy URL of your task database, where requeue_tasks and "
        "mark_worker_ended run the policy's statements; none: they fail with that reason.",
    )
    trace_to_bus: bool = Field(default=False, description="Also publish finished spans for the embedded trace store.")

    @field_validator("hook_token_file", "admin_token_file", "task_db_url_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    def admin_token(self) -> str | None:
        """The admin endpoints' bearer token, None without a token file; ValueError if the file is unusable."""
        if self.admin_token_file is None:
            return None
        return read_token(self.admin_token_file, "GPUMEDIC_REMEDIATOR_ADMIN_TOKEN_FILE")

    def hook_token(self) -> str | None:
        """The drain hook's bearer token, None without a token file; ValueError if the file is unusable."""
        if self.hook_token_file is None:
            return None
        return read_token(self.hook_token_file, "GPUMEDIC_REMEDIATOR_HOOK_TOKEN_FILE")

    @field_validator("protected_nodes", mode="before")
    @classmethod
    def _split_nodes(cls, value: Any) -> Any:
        if isinstance(value, str):
            text = value.strip()
            if text.startswith("["):
                return json.loads(text)
            return {part.strip() for part in text.split(",") if part.strip()}
        return value

    @field_validator("protected_nodes")
    @classmethod
    def _selectors(cls, value: set[str]) -> set[str]:
        for text in value:
            NodeSelector(text)
        return value

    def check_files(self) -> None:
        """Raise SettingsError unless the inventory, known_hosts and client key are usable."""
        for name, path in (("inventory", self.inventory), ("known_hosts", self.known_hosts), ("client_key", self.client_key)):
            if not path.is_file():
                raise SettingsError(
                    f"{name} file {path} does not exist (set GPUMEDIC_REMEDIATOR_{name.upper()})"
                )
        try:
            nodes = load_inventory(self.inventory)
        except InventoryError as exc:
            raise SettingsError(str(exc)) from None
        node_keys = {address.key for address in nodes.values() if address.key is not None}
        for key in sorted(node_keys):
            try:
                asyncssh.read_private_key(str(key))
            except (OSError, ValueError, asyncssh.Error) as exc:
                raise SettingsError(f"key file {key} named in inventory {self.inventory} is not usable: {type(exc).__name__}") from None
        try:
            self.hook_token()
            self.admin_token()
            if self.provider is not None:
                read_token(self.provider.api_key_file, "GPUMEDIC_REMEDIATOR_PROVIDER api_key_file")
            if self.task_db_url_file is not None:
                read_token(self.task_db_url_file, "GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE")
        except ValueError as exc:
            raise SettingsError(str(exc)) from None
        try:
            asyncssh.read_known_hosts(str(self.known_hosts))
        except (OSError, ValueError, asyncssh.Error) as exc:
            raise SettingsError(f"known_hosts file {self.known_hosts} cannot be used: {type(exc).__name__}") from None
        try:
            asyncssh.read_private_key(str(self.client_key))
        except (OSError, ValueError, asyncssh.Error) as exc:
            # Only the exception type: a parser's message could quote the file.
            raise SettingsError(f"client_key file {self.client_key} is not a usable private key: {type(exc).__name__}") from None
