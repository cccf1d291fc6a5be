"""autoscaler's settings, read once from GPUMEDIC_AUTOSCALER_* variables."""

from __future__ import annotations

from pydantic import Field, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from autoscaler.demand import DemandConfig
from autoscaler.scaling import ScalingPolicy
from gpumedic_bus import NatsSettings
from gpumedic_events import SubjectToken
from gpumedic_incidents import FLEET_NODE, PolicySettings
from gpumedic_providers.base import Provider
from gpumedic_providers.config import ProviderConfig, open_provider
from gpumedic_webhook import read_token


class Settings(BaseSettings):
    # compose passes an unset variable as "": that is the default, not a value
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_AUTOSCALER_", extra="ignore", env_ignore_empty=True)

    nats: NatsSettings = Field(default_factory=NatsSettings)
    interval_s: float = Field(default=60.0, gt=0, description="How often to evaluate capacity.")
    busy_util_pct: int = Field(default=20, ge=0, le=100, description="A GPU above this utilisation is busy.")
    scale_up_above: float = Field(default=0.9, gt=0, le=1, description="Busy share above which more workers are wanted.")
    scale_down_below: float = Field(default=0.3, ge=0, lt=1, description="Busy share below which fewer are wanted.")
    stale_after_s: float = Field(default=120.0, gt=0, description="Samples older than this do not count.")
    demand: DemandConfig | None = Field(
        default=None, description="Where the task queue is read (JSON: a kind, sql or http, and its fields); none: the busy share decides."
    )
    scaling: ScalingPolicy = Field(default_factory=ScalingPolicy, description="The runbook's knobs, for a queue-driven decision.")
    provider: ProviderConfig | None = Field(
        default=None,
        description="Where the pool's workers are listed (JSON, as the remediator's; a read-only API key is enough); "
        "with a demand source, the service opens the pool's incidents and the remediator acts on them.",
    )
    pool: SubjectToken = Field(default="workers", description="The pool's name: the node of its capacity incidents.")
    policy: PolicySettings = Field(default_factory=PolicySettings)
    trace_to_bus: bool = False

    @field_validator("pool")
    @classmethod
    def _not_the_fleet(cls, value: str) -> str:
        if value == FLEET_NODE:
            raise ValueError(f"{FLEET_NODE!r} names fleet incidents; give the pool another name")
        return value

    def provider_client(self) -> Provider | None:
        """The provider's client, None without one; ValueError if its key file is unusable."""
        if self.provider is None:
            return None
        return open_provider(self.provider, read_token(self.provider.api_key_file, "GPUMEDIC_AUTOSCALER_PROVIDER api_key_file"))
