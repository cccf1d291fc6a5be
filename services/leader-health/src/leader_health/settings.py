"""leader-health's settings, read once from GPUMEDIC_LEADER_* variables."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_events import SubjectToken
from gpumedic_incidents import PolicySettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_LEADER_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings, description="GPUMEDIC_POLICY_FILE: the cluster kinds' thresholds and ladders.")
    cluster: SubjectToken = Field(default="default", description="Name of the peer cluster watched.")
    peers: list[str] = Field(default_factory=list, description="Status URLs of the peers, e.g. http://10.0.0.7:8770/status (JSON list in the env).")
    inventory: Path | None = Field(
        default=None, description="The fleet's inventory (the remediator's): a peer the daemons count as a member that it does "
        "not name, by node id or host, is a stranger (unknown_peer). Unset: not judged.",
    )
    interval_s: float = Field(default=30.0, gt=0, description="How often to check the cluster.")
    connect_timeout_s: float = Field(default=2.0, gt=0, description="No TCP answer within this: the peer's host is unreachable.")
    http_timeout_s: float = Field(
        default=10.0, gt=0, description="TCP accepted but no HTTP answer within this: the peer's event loop is blocked. "
        "Above the policy's kinds.slow_peer.slower_than_s (5 s), so that a slow answer is told apart from none.",
    )
    probe_concurrency: int = Field(default=64, ge=1, le=1024, description="Peers probed at once.")
    trace_to_bus: bool = False

    @field_validator("inventory", mode="before")
    @classmethod
    def _empty_is_unset(cls, value: object) -> object:
        return None if value == "" else value
