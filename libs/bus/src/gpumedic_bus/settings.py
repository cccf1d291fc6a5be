"""Connection settings every service composes into its own settings."""

from __future__ import annotations

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict


class NatsSettings(BaseSettings):
    """How to reach NATS. Read from GPUMEDIC_NATS_* variables."""

    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_NATS_", extra="ignore")

    url: str = Field(default="nats://127.0.0.1:4222", description="Server URL(s), comma-separated.")
    user: str | None = Field(default=None, description="User name, where the server has accounts.")
    password: SecretStr | None = Field(default=None, description="Password for `user`; never logged.")
    ping_interval_s: int = Field(default=5, ge=1, description="Ping often: a dead link is seen in seconds.")
    max_outstanding_pings: int = Field(default=3, ge=1)
    reconnect_wait_s: float = Field(default=1.0, gt=0)
    ack_wait_s: float = Field(default=30.0, gt=0, description="JetStream AckWait for durable consumers.")
    max_deliver: int = Field(default=5, ge=1, le=100, description="Deliveries before a message is dead-lettered.")
    graceful_timeout_s: float = Field(default=10.0, ge=0, description="How long shutdown waits for handlers.")

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]
