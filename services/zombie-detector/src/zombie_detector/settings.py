"""zombie-detector's settings, read once from GPUMEDIC_DETECTOR_* variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from zombie_detector.logic import Rules


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_DETECTOR_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    idle_util_pct: int = Field(default=5, ge=0, le=100, description="A GPU at or under this utilisation is idle.")
    idle_for_s: float = Field(default=600.0, gt=0, description="How long a held GPU must stay idle to be a zombie.")
    verify_within_s: float = Field(default=60.0, gt=0, description="How long after an action the samples may take to show it worked.")
    action_timeout_s: float = Field(default=300.0, gt=0, description="How long to wait for the remediator's answer.")
    max_attempts: int = Field(default=2, ge=1, le=10, description="Kill attempts before escalating to a person.")
    trace_to_bus: bool = Field(default=False, description="Also carry spans over the bus to the store (embedded mode).")

    def rules(self) -> Rules:
        return Rules(
            idle_util_pct=self.idle_util_pct,
            idle_for_s=self.idle_for_s,
            verify_within_s=self.verify_within_s,
            action_timeout_s=self.action_timeout_s,
            max_attempts=self.max_attempts,
        )
