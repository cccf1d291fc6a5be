"""report-builder's settings, read once from GPUMEDIC_REPORTS_* (and the store's) variables."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_bus import NatsSettings
from gpumedic_store import StoreSettings
from gpumedic_webhook import read_token
from report_builder.notify import Channel


PLACEHOLDER_URL_PARTS = ("change-me", "changeme")
"""What an example's URL holds; "secret" or "password" in a real URL's path is no placeholder."""


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def _check_webhook_url(url: str, name: str) -> None:
    """Where an escalation may be sent: https, or http on loopback only (a Slack URL is its own secret)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    if parts.scheme not in ("https", "http") or not host:
        raise ValueError(f"{name} must be an https:// URL with a host")
    if parts.scheme == "http" and not _loopback(host):
        raise ValueError(f"{name} must use https:// (plain http is allowed on loopback only): it carries incident details")
    if any(p in url.lower() for p in PLACEHOLDER_URL_PARTS):
        raise ValueError(f"{name} still holds a placeholder from an example; put the real webhook URL there")


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_REPORTS_", extra="ignore")

    nats: NatsSettings = Field(default_factory=NatsSettings)
    store: StoreSettings = Field(default_factory=StoreSettings)
    trace_to_bus: bool = Field(default=False, description="Also carry spans over the bus to the store (embedded mode).")

    webhook_url: SecretStr | None = Field(default=None, description="Escalations as JSON to this URL; never logged.")
    webhook_token_file: Path | None = Field(default=None, description="A file holding a bearer token for webhook_url.")
    slack_webhook_url: SecretStr | None = Field(default=None, description="Escalations to a Slack-compatible incoming webhook.")
    console_url: str | None = Field(
        default=None, description="Base URL of the console, for links in notifications; https makes its cookies Secure."
    )
    console_trusted_proxies: tuple[str, ...] = Field(
        default=(), description="Addresses of reverse proxies in front of the console whose X-Forwarded-For (who logs in, for "
        "the login throttle) and X-Forwarded-Proto (https: Secure cookies) are believed; e.g. [\"127.0.0.1\"].",
    )
    console_port: int | None = Field(
        default=None, ge=0, le=65535, description="The web console's port (0: any free one); unset: no console. `gpumedic up` and compose set it."
    )
    console_addr: str = Field(default="127.0.0.1", description="Where the console listens; loopback unless a proxy or compose publishes it.")
    console_token_file: Path | None = Field(
        default=None, description="A file holding the console's token: who types it may silence, mark and reset. None: read-only."
    )
    jaeger_url: str | None = Field(default=None, description="Base URL of a Jaeger UI: incident pages link their trace there.")
    notify_wait_s: float = Field(default=10.0, ge=0, le=600, description="Wait after an escalation before telling anyone.")
    notify_give_up_s: float = Field(default=86_400.0, gt=0, description="Stop retrying a notification this long after the escalation.")
    notify_min_severity: Literal["info", "warning", "critical"] = "warning"
    inventory: Path | None = Field(
        default=None, description="The fleet inventory (the remediator's file): each node's GPUs and price_per_gpu_hour, "
        "which price the GPU time incidents cost. Unset: GPU-hours only, except for rented workers (their provider's price).",
    )
    alertmanager_url: str | None = Field(
        default=None,
        description="Alertmanager(s) to post incidents to as alerts (API v2), comma-separated: firing while open, resolved when "
        "they close, so its routes, grouping, inhibition and silences apply. Unset: none.",
    )
    alertmanager_every_s: float = Field(default=30.0, ge=5, le=300, description="How often open incidents are posted again.")
    history_retention_h: float = Field(
        default=24.0, ge=0, le=24 * 400,
        description="Hours of each node's minute-by-minute history kept in the store (0: none kept). About 100 KiB per 8-GPU node-day.",
    )
    history_prometheus_url: str | None = Field(
        default=None,
        description="A Prometheus server that scrapes the nodes' /metrics (deploy/prometheus.yml): the console's GPU charts come "
        "from its HTTP API, for as long as it keeps them; host figures and processes still come from the store.",
    )
    history_prometheus_node_label: str = Field(
        default="Hostname", pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="The label whose value is the node id on the GPU series (dcgm-exporter's Hostname; relabel if node ids differ).",
    )

    @field_validator(
        "webhook_url", "slack_webhook_url", "webhook_token_file", "console_url", "console_port", "console_token_file", "jaeger_url",
        "history_prometheus_url", "inventory", "alertmanager_url",
        mode="before",
    )
    @classmethod
    def _empty_is_unset(cls, value):
        # compose passes `${VAR:-}` as an empty string when the operator set nothing
        return None if isinstance(value, str) and not value.strip() else value

    @field_validator("console_url", "jaeger_url", "history_prometheus_url")
    @classmethod
    def _http_url(cls, value: str | None, info) -> str | None:
        if value is not None and (urlsplit(value).scheme not in ("http", "https") or not urlsplit(value).hostname):
            raise ValueError(f"GPUMEDIC_REPORTS_{info.field_name.upper()} must be an http(s):// URL")
        return value

    def alertmanagers(self) -> list[str]:
        """The Alertmanagers' base URLs; one that is no http(s) URL stops the start."""
        urls = [u.strip() for u in (self.alertmanager_url or "").split(",") if u.strip()]
        for url in urls:
            if urlsplit(url).scheme not in ("http", "https") or not urlsplit(url).hostname:
                raise ValueError(f"GPUMEDIC_REPORTS_ALERTMANAGER_URL: entry {urls.index(url) + 1} of {len(urls)} is not an "
                                 "http(s):// URL with a host (not repeated here: a URL may carry a password)")
        return urls

    def console_token(self) -> str | None:
        """The console's token, read from its file (a missing or empty file stops the start)."""
        if self.console_token_file is None:
            return None
        token = read_token(self.console_token_file, "GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE")
        if len(token) < 16:
            raise ValueError(f"GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE {self.console_token_file} holds a token of {len(token)} characters; "
                             "use 16 or more (for example: openssl rand -hex 24)")
        return token

    def channels(self) -> list[Channel]:
        """The configured notification channels; a bad URL or a missing token file stops the start.

        The URLs are checked here rather than by a pydantic validator, whose error would quote the
        URL, which for Slack is the secret itself."""
        for name in ("webhook_url", "slack_webhook_url"):
            if (url := getattr(self, name)) is not None:
                _check_webhook_url(url.get_secret_value(), f"GPUMEDIC_REPORTS_{name.upper()}")
        channels = []
        if self.webhook_url is not None:
            token = None
            if self.webhook_token_file is not None:
                token = read_token(self.webhook_token_file, "GPUMEDIC_REPORTS_WEBHOOK_TOKEN_FILE")
            channels.append(Channel("webhook", "json", self.webhook_url.get_secret_value(), token))
        if self.slack_webhook_url is not None:
            channels.append(Channel("slack", "slack", self.slack_webhook_url.get_secret_value()))
        return channels
