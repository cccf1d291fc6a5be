"""What every service's composition root shares: the broker, tracing, streams, heartbeat.

`ServiceRuntime` builds the NATS broker with long-running settings (unlimited reconnects, a
short ping), a tracer provider (OTEL_* exporters, plus the bus span recorder when asked), and
a FastStream app whose start declares the streams and starts the heartbeat and the service's
own background loops, and whose stop hands in-flight work back cleanly.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import uuid
from collections.abc import Awaitable, Callable

import nats
from faststream import FastStream
from faststream.nats import NatsBroker, NatsUserPassword
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from gpumedic_bus.consume import EventHandler, PushConsumer, RejectionStats
from gpumedic_bus.publish import publish_event
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.streams import ensure_streams
from gpumedic_bus.tracing import BusSpanRecorder
from gpumedic_events import ServiceHeartbeat
from gpumedic_telemetry import create_tracer_provider

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 5.0

BackgroundLoop = Callable[[], Awaitable[None]]


def connect_options(settings: NatsSettings, name: str) -> dict:
    """nats-py connection options for a service that must outlive any NATS restart."""
    options: dict = {
        "servers": settings.servers,
        "name": name,
        "allow_reconnect": True,
        "max_reconnect_attempts": -1,
        "reconnect_time_wait": settings.reconnect_wait_s,
        "ping_interval": settings.ping_interval_s,
        "max_outstanding_pings": settings.max_outstanding_pings,
    }
    if settings.user:
        options["user"] = settings.user
        options["password"] = settings.password.get_secret_value() if settings.password else None
    return options


def _security(settings: NatsSettings) -> NatsUserPassword | None:
    if not settings.user:
        return None
    return NatsUserPassword(settings.user, settings.password.get_secret_value() if settings.password else "")


class ServiceRuntime:
    """The broker, tracer and lifecycle of one service process."""

    def __init__(self, service: str, nats_settings: NatsSettings, *, trace_to_bus: bool = False) -> None:
        self.service = service
        self.nats = nats_settings
        self.instance_id = uuid.uuid4()
        self.rejections = RejectionStats()
        self.ready = asyncio.Event()
        self._span_recorder = BusSpanRecorder(service) if trace_to_bus else None
        self.tracer_provider: TracerProvider = create_tracer_provider(
            service, processors=[self._span_recorder] if self._span_recorder else []
        )
        self.tracer: Tracer = self.tracer_provider.get_tracer(service)
        options = connect_options(nats_settings, service)
        for key in ("servers", "name", "user", "password"):
            options.pop(key, None)
        self.broker = NatsBroker(
            nats_settings.servers,
            graceful_timeout=nats_settings.graceful_timeout_s,
            log_level=logging.DEBUG,  # per-message Received/Processed lines stay out of INFO
            logger=logging.getLogger(f"{service}.bus"),  # plain lines in the service's log, no colour codes
            security=_security(nats_settings),
            **options,
        )
        self._loops: list[BackgroundLoop] = []
        self._startup: list[Callable[[], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task] = []
        self._push_consumers: list[PushConsumer] = []

    def on_startup(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` once streams exist and before consumers start (e.g. open a KV bucket)."""
        self._startup.append(hook)

    def consume_fast(self, event_type, handler: EventHandler, *, durable: str) -> PushConsumer:
        """Consume a high-volume disposable event (samples) through a push consumer; see PushConsumer."""
        consumer = PushConsumer(
            self.broker, event_type, handler, service=self.service, durable=durable, settings=self.nats, stats=self.rejections
        )
        self._push_consumers.append(consumer)
        return consumer

    def background(self, loop: BackgroundLoop) -> None:
        """Run `loop` while the service runs (periodic probes, evaluations)."""
        self._loops.append(loop)

    def app(self) -> FastStream:
        app = FastStream(self.broker, logger=logging.getLogger(self.service))
        app.on_startup(self._declare)
        app.after_startup(self._started)
        app.on_shutdown(self._stopping)
        app.after_shutdown(self._stopped)
        app.runtime = self  # callers (tests, the embedded stack) reach readiness and stats here
        return app

    async def _declare(self) -> None:
        nc = await nats.connect(**{**connect_options(self.nats, f"{self.service}-setup"), "max_reconnect_attempts": 3})
        try:
            await ensure_streams(nc.jetstream())
        finally:
            await nc.close()
        for hook in self._startup:
            await hook()

    async def _started(self) -> None:
        for consumer in self._push_consumers:
            await consumer.start()
        self._tasks.append(asyncio.create_task(self._heartbeat(), name=f"{self.service}-heartbeat"))
        if self._span_recorder is not None:
            self._tasks.append(asyncio.create_task(self._span_recorder.run(self._publish), name="spans"))
        for loop in self._loops:
            self._tasks.append(asyncio.create_task(_logged(loop, self.service), name=getattr(loop, "__name__", "loop")))
        self.ready.set()
        log.info("%s ready (instance %s)", self.service, self.instance_id)

    async def _stopping(self) -> None:
        self.ready.clear()
        for consumer in self._push_consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
        with contextlib.suppress(Exception):
            await publish_event(self.broker, self._heartbeat_event("stopping"))

    async def _stopped(self) -> None:
        if self._span_recorder is not None:
            self.tracer_provider.force_flush()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._span_recorder.flush(self._publish), 2)
        self.tracer_provider.shutdown()

    def _heartbeat_event(self, state: str) -> ServiceHeartbeat:
        return ServiceHeartbeat(source=self.service, service=self.service, instance_id=self.instance_id, state=state)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await publish_event(self.broker, self._heartbeat_event("ready"))
            except Exception as exc:
                log.warning("%s: heartbeat not published (%r); the bus may be reconnecting", self.service, exc)
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    async def _publish(self, event) -> None:
        await publish_event(self.broker, event)


async def _logged(loop: BackgroundLoop, service: str) -> None:
    """A background loop that dies is logged loudly instead of vanishing."""
    try:
        await loop()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s: background loop %s stopped", service, getattr(loop, "__name__", loop))
        raise
