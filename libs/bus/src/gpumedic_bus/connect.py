"""A connection to NATS that outlives any NATS restart: nats-py's options, its callbacks as one
log line per change of state, and a plain connection for tools and set-up."""

from __future__ import annotations

import logging

import nats

from gpumedic_bus.outage import nats_reason
from gpumedic_bus.settings import NatsSettings


class _TlsEofNoise(logging.Filter):
    """asyncio warns "returning true from eof_received() has no effect when using ssl" for every
    nats-py TLS connection that closes; it says nothing about gpumedic and alarms whoever reads it."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "eof_received() has no effect when using ssl" not in record.getMessage()


def quiet_tls_eof() -> None:
    asyncio_log = logging.getLogger("asyncio")
    if not any(isinstance(f, _TlsEofNoise) for f in asyncio_log.filters):
        asyncio_log.addFilter(_TlsEofNoise())


class BusState:
    """nats-py's connection callbacks as one log line per change of state: nats-py's default logs
    a whole traceback on every reconnect try while the server is away. (Disconnection is not
    logged by itself: a deliberate close disconnects too; the error that caused one is logged.)"""

    def __init__(self, name: str) -> None:
        self._log = logging.getLogger(f"{name}.bus")
        self._last = ""

    async def error(self, exc: Exception) -> None:
        reason = nats_reason(exc)
        if reason != self._last:
            self._log.warning("bus: %s (reconnecting)", reason)
            self._last = reason
        else:
            self._log.debug("bus: %s again", reason)

    async def reconnected(self) -> None:
        self._log.info("bus: reconnected to NATS")
        self._last = ""


def connect_options(settings: NatsSettings, name: str) -> dict:
    """nats-py connection options for a client that must outlive any NATS restart."""
    state = BusState(name)
    options: dict = {
        "error_cb": state.error,
        "reconnected_cb": state.reconnected,
        "servers": settings.servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "ping_interval": settings.ping_interval_s,
        "max_outstanding_pings": settings.max_outstanding_pings,
        "inbox_prefix": settings.inbox_prefix,
    }
    if settings.user:
        options["user"] = settings.user
        options["password"] = settings.password.get_secret_value() if settings.password else None
    tls = settings.ssl_context()
    if tls is not None:
        options["tls"] = tls
    return options


async def connect(settings: NatsSettings, name: str, **overrides) -> nats.NATS:
    """A plain nats-py connection with the service's credentials, TLS and inbox (tools, setup)."""
    quiet_tls_eof()
    return await nats.connect(**{**connect_options(settings, name), **overrides})
