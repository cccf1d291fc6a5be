"""zombie-detector's settings, read once from GPUMEDIC_DETECTOR_* variables; its thresholds and
ladders come from the policy file (GPUMEDIC_POLICY_FILE), shared with every service that decides."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_incidents import PolicySettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_DETECTOR_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    policy: PolicySettings = Field(default_factory=PolicySettings, description="GPUMEDIC_POLICY_FILE.")
    trace_to_bus: bool = Field(default=False, description="Also carry spans over the bus to the store (embedded mode).")
    cells: bool = Field(default=False, description=(
        "GPUMEDIC_DETECTOR_CELLS: every instance runs a detector cell over its share of the nodes' partitions and the "
        "lease holder decides (set for each replica when the service runs in more than one; one instance reads every "
        "sample itself)."))
