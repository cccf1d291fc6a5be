"""Connection settings every service composes into its own settings."""

from __future__ import annotations

import ssl
from pathlib import Path

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import topology

PLACEHOLDER_PASSWORDS = frozenset({"change-me", "changeme", "password", "secret"})
"""Placeholders from examples; a service refuses to start with one (run `gpumedic init`)."""


class NatsSettings(BaseSettings):
    """How to reach NATS. Read from GPUMEDIC_NATS_* variables."""

    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_NATS_", extra="ignore")

    url: str = Field(default="nats://127.0.0.1:4222", description="Server URL(s), comma-separated; tls://... for TLS.")
    user: str | None = Field(default=None, description="User name, where the server has accounts.")
    password: SecretStr | None = Field(default=None, description="Password for `user`; never logged.")
    tls_ca_file: Path | None = Field(
        default=None,
        description="CA certificate(s) that signed the server's certificate; set it to connect over TLS "
        "(the server's certificate and host name are always verified).",
    )
    ping_interval_s: int = Field(default=5, ge=1, description="Ping often: a dead link is seen in seconds.")
    max_outstanding_pings: int = Field(default=3, ge=1)
    reconnect_wait_s: float = Field(default=1.0, gt=0)
    ack_wait_s: float = Field(default=30.0, gt=0, description="JetStream AckWait for durable consumers (at provisioning).")
    max_deliver: int = Field(default=5, ge=1, le=100, description="Deliveries before a message is dead-lettered (at provisioning).")
    start_wait_s: float = Field(default=15.0, ge=0, description="How long a starting service waits for the server before it gives up.")
    graceful_timeout_s: float = Field(default=10.0, ge=0, description="How long shutdown waits for handlers.")

    @field_validator("tls_ca_file", mode="before")
    @classmethod
    def _empty_is_none(cls, value: object) -> object:
        return None if value == "" else value

    @model_validator(mode="after")
    def _real_secret(self) -> NatsSettings:
        if self.password is not None and self.password.get_secret_value().strip().lower() in PLACEHOLDER_PASSWORDS:
            raise ValueError(
                "GPUMEDIC_NATS_PASSWORD is a placeholder from an example; generate real secrets with `gpumedic init`"
            )
        if self.tls_ca_file is not None and not self.tls_ca_file.is_file():
            raise ValueError(f"GPUMEDIC_NATS_TLS_CA_FILE: {self.tls_ca_file} is not a file")
        return self

    @property
    def servers(self) -> list[str]:
        return [u.strip() for u in self.url.split(",") if u.strip()]

    @property
    def inbox_prefix(self) -> str:
        """Replies come back under the user's own inbox subtree, which no other user may read."""
        return topology.inbox_prefix(self.user) if self.user else "_INBOX"

    def ssl_context(self) -> ssl.SSLContext | None:
        """A client context that verifies the server against `tls_ca_file`, or None without TLS."""
        if self.tls_ca_file is None:
            return None
        return ssl.create_default_context(cafile=str(self.tls_ca_file))
