"""report-builder's settings, read once from GPUMEDIC_REPORTS_* (and the store's) variables."""

from __future__ import annotations

from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_store import StoreSettings


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_REPORTS_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    trace_to_bus: bool = Field(default=False, description="Also carry spans over the bus to the store (embedded mode).")
