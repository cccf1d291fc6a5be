"""autoscaler's settings, read once from GPUMEDIC_AUTOSCALER_* variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from autoscaler.demand import DemandConfig
from autoscaler.scaling import ScalingPolicy
from gpumedic_bus import NatsSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_AUTOSCALER_", extra="ignore")

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
    trace_to_bus: bool = False
