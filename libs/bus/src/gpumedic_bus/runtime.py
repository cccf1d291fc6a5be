"""What every service's composition root shares: the broker, tracing, consumers, heartbeat.

`ServiceRuntime` builds the NATS broker with long-running settings (unlimited reconnects, a
short ping, TLS and the user's own inbox where configured), a tracer provider (OTEL_*
exporters, plus the bus span recorder when asked), and a FastStream app whose start checks that
the service's provisioned consumers exist, then starts the heartbeat and the service's own
background loops, and whose stop hands in-flight work back cleanly. A service never creates or
changes a stream or consumer: its NATS user may not (see `gpumedic_bus.topology`).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import signal
import uuid
from collections.abc import Awaitable, Callable

import nats
from faststream import FastStream
from faststream.nats import NatsBroker, NatsSecurity, NatsUserPassword
from faststream.nats.annotations import NatsMessage
from nats.js.errors import NotFoundError
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.trace import Tracer

from gpumedic_bus.connect import connect, connect_options, quiet_tls_eof
from gpumedic_bus.consume import EventConsumer, EventHandler, Handler, Lag, PacedConsumer, subscribe, undecoded
from gpumedic_bus.follow import PacedReader, StreamFollower
from gpumedic_bus.lease import Lease
from gpumedic_bus.lateness import HOST_PRESSURE, LoopLag, own_cgroup_pressure, read_pressure
from gpumedic_bus.outage import BUS_AWAY, nats_reason, ride_out
from gpumedic_bus.publish import publish_event
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.shares import Shares
from gpumedic_bus.streams import stream_of
from gpumedic_bus.tasks import stop_tasks
from gpumedic_bus.topology import LIVE, LOOKUPS, ONE_ACTIVE, ONE_INSTANCE_LOOPS, PACED_READS, PRODUCERS, REPLAYS, REQUESTS, SHARED_LOOPS
from gpumedic_bus.topology import durable as declared_durable
from gpumedic_bus.tracing import BusSpanRecorder
from gpumedic_events import ConsumerLag, Event, EventDecodeError, ServiceHeartbeat
from gpumedic_telemetry import create_tracer_provider
from gpumedic_telemetry.metrics import CONNECTED, ServiceMetrics, metrics_port

log = logging.getLogger(__name__)

HEARTBEAT_EVERY_S = 5.0
STOP_TASKS_WITHIN_S = 10.0
"""How long stopping waits for each background task to end once cancelled."""

BackgroundLoop = Callable[[], Awaitable[None]]


class BusNotProvisioned(RuntimeError):
    """A stream or consumer the service binds to does not exist; the message says what to run."""


INSTANCE_VARIABLE = "GPUMEDIC_INSTANCE_ID"


def instance_id(environ: dict[str, str] | None = None) -> uuid.UUID:
    """This instance's id: GPUMEDIC_INSTANCE_ID when set (a supervisor that restarts an instance
    keeps it, so the instance takes its own lease back at once), else a new one. Two running
    instances must never share one. ValueError names a bad value."""
    value = (os.environ if environ is None else environ).get(INSTANCE_VARIABLE, "").strip()
    if not value:
        return uuid.uuid4()
    try:
        return uuid.UUID(value)
    except ValueError:
        raise ValueError(f"{INSTANCE_VARIABLE}={value!r} is not a UUID") from None


def _security(settings: NatsSettings) -> NatsSecurity | None:
    tls = settings.ssl_context()
    if settings.user:
        password = settings.password.get_secret_value() if settings.password else ""
        return NatsUserPassword(settings.user, password, ssl_context=tls)
    return NatsSecurity(ssl_context=tls) if tls is not None else None


class ServiceRuntime:
    """The broker, tracer and lifecycle of one service process."""

    def __init__(self, service: str, nats_settings: NatsSettings, *, trace_to_bus: bool = False, spans_as: str | None = None) -> None:
        """`spans_as`: the subject its spans go out on, when not the service's (a node's sampler: its
        node's user, the only span subject that node may publish on)."""
        self.service = service
        self.nats = nats_settings
        quiet_tls_eof()
        self.instance_id = instance_id()
        self.metrics = ServiceMetrics(service)
        self._metrics_port = metrics_port()  # GPUMEDIC_METRICS_PORT; a bad one stops the start here
        self.ready = asyncio.Event()
        self._span_recorder = BusSpanRecorder(service, publish_as=spans_as or service) if trace_to_bus else None
        self.tracer_provider: TracerProvider = create_tracer_provider(
            service, processors=[self._span_recorder] if self._span_recorder else []
        )
        self.tracer: Tracer = self.tracer_provider.get_tracer(service)
        options = connect_options(nats_settings, service)
        for key in ("servers", "name", "user", "password", "tls"):
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
        self._alongside: list[BackgroundLoop] = []
        self._alongside_started: list[asyncio.Task] = []
        self._startup: list[Callable[[], Awaitable[None]]] = []
        self._tasks: list[asyncio.Task] = []
        self._consumers: list[EventConsumer] = []
        self._paced_consumers: list[PacedConsumer] = []
        self._replays: list[tuple[tuple[type[Event], ...], EventHandler, asyncio.Event]] = []
        self._replays_after: list[tuple[tuple[type[Event], ...], EventHandler, asyncio.Event]] = []
        self._followers: list[StreamFollower] = []
        self.consumers_missing: set[str] = set()
        """Durable consumers of this service found gone (`_watch_consumers`)."""
        self._live: list[tuple[type[Event], EventHandler, type | None]] = []
        self._live_subs: list = []
        self._readers: list[tuple[PacedReader, nats.NATS]] = []
        self.more_paced_consumers: Callable[[], list[PacedConsumer]] = list
        """Push consumers the service starts and stops itself (a detector cell's partitions), for their lag."""
        self.loop_lag = LoopLag()
        """How late this process's event loop runs: what it times while lagging judges nothing."""
        self._pressure_path = own_cgroup_pressure() or HOST_PRESSURE
        self.lease: Lease | None = None
        """Held while this instance is its service's active one (services in `topology.ONE_ACTIVE`)."""
        self.on_lease_lost: Callable[[str], Awaitable[None] | None] = _stop_this_process
        """What losing the lease does: by default the process stops and its supervisor (compose,
        `gpumedic up`) starts it again, as a standby; tests put their own here."""

    def on_startup(self, hook: Callable[[], Awaitable[None]]) -> None:
        """Run `hook` once the service's consumers are known to exist and before they start (e.g.
        open a KV bucket). A hook the bus fails (see BUS_AWAY) is run again, so it must be repeatable."""
        self._startup.append(hook)

    def consume(
        self, durable: str, handler: Handler, *, batch_size: int = 16, fetch_within_s: float = 1.0,
        waits_on: tuple[type[BaseException], ...] = (),
    ) -> EventConsumer:
        """Handle every event of one of this service's provisioned durable pull consumers.

        At most `batch_size` messages are handled at once; a handler that raises one of `waits_on`
        (the store is down) waits instead of failing; a lone message is handled at most
        `fetch_within_s` after it came (see `gpumedic_bus.consume.subscribe`).
        """
        consumer = subscribe(
            self.broker,
            self._own(durable, "pull"),
            handler,
            service=self.service,
            metrics=self.metrics,
            inbox_prefix=self.nats.inbox_prefix,
            batch_size=batch_size,
            fetch_within_s=fetch_within_s,
            waits_on=waits_on,
        )
        self._consumers.append(consumer)
        return consumer

    def consume_fast(self, durable: str, handler: EventHandler, *, view: type | None = None) -> PacedConsumer:
        """Consume a high-volume disposable event (samples) through a paced consumer; see PacedConsumer.
        With a `view` (`gpumedic_events.views`), only the fields it names are decoded and handed on."""
        consumer = PacedConsumer(self.broker, self._own(durable, "paced"), handler, service=self.service, metrics=self.metrics,
                                connect=self.connect_for(durable), view=view)
        self._paced_consumers.append(consumer)
        return consumer

    def connect_for(self, durable: str) -> Callable[[], Awaitable[nats.NATS]]:
        """How a paced consumer opens the connection of its own its samples come on (see PacedConsumer)."""
        return lambda: connect(self.nats, f"{self.service}.{durable}")

    def follow(self, event_type: type[Event], handler: EventHandler, *, view: type | None = None) -> None:
        """Read `event_type` live (`topology.LIVE`), as a plain subscriber or, for what comes at a
        fleet's rate (`topology.PACED_READS`), a batch at a time from its stream: every instance gets
        every message; none is acknowledged, and one that does not validate is skipped. With a
        `view` (`gpumedic_events.views`), only the fields it names are decoded and handed on."""
        if event_type not in LIVE.get(self.service, ()):
            raise ValueError(f"{self.service} reads {[e.__name__ for e in LIVE.get(self.service, ())]} live, not {event_type.__name__}")
        self._live.append((event_type, handler, view))

    def reads(self, event_type: type[Event]) -> type:
        """What this service decodes `event_type` into: the event itself, or the view its paced
        consumer or live reader names (a message invalid only where the view does not read is
        handled, not refused)."""
        views = [c.view for c in self._paced_consumers if c.durable.event is event_type]
        views += [view for live, _, view in self._live if live is event_type and view is not None]
        return next((v for v in views if v is not event_type), event_type)

    async def _follow(self, event_type: type[Event], handler: EventHandler, view: type | None) -> None:
        skipped = 0
        ok, skip = (self.metrics.handled.labels(event_type.__name__, outcome).inc for outcome in ("ok", "skipped"))

        async def on_message(subject: str, data: bytes) -> None:
            nonlocal skipped
            try:
                event = event_type.decode_as(view or event_type, data, subject=subject)
            except EventDecodeError as exc:
                skip()
                skipped += 1
                if skipped == 1 or skipped % 1000 == 0:  # its durable consumers dead-letter it
                    log.warning("%s: skipped %d live %s message(s) that do not validate; last: %s", self.service, skipped, event_type.__name__, exc.reason)
                return
            try:
                await handler(event)
            except Exception:  # the next message supersedes this one
                log.exception("%s: live %s handler failed", self.service, event_type.__name__)
            ok()

        if event_type in PACED_READS.get(self.service, ()):  # a batch at a time from the stream, on a connection of its own
            stream = stream_of(event_type)
            nc = await self.connect_for(f"{stream.name}-reads")()
            reader = PacedReader(nc, stream.name, stream.stored_filter(event_type), lambda stored, data: on_message(stream.as_published(stored), data))
            self._readers.append((reader, nc))
            await self._patiently(f"reading {stream.name}", reader.start, asyncio.get_running_loop().time() + START_WITHIN_S)
            return

        async def on_live(msg) -> None:
            await on_message(msg.subject, msg.data)

        self._live_subs.append(await self.broker.connection.subscribe(event_type.subject_filter(), cb=on_live, pending_msgs_limit=65536))

    async def latest(self, event_type: type[Event], key: str | None = None) -> Event | None:
        """The last stored `event_type` for `key` (a node id; None: for any key), or None if its
        stream keeps none (`topology.LOOKUPS`). One that does not validate raises EventDecodeError."""
        if event_type not in LOOKUPS.get(self.service, ()):
            raise ValueError(f"{self.service} looks up {[e.__name__ for e in LOOKUPS.get(self.service, ())]}, not {event_type.__name__}")
        try:
            stream = stream_of(event_type)
            subject = stream.stored_filter(event_type) if key is None else stream.stored_subject(event_type, key)
            msg = await self.broker.connection.jetstream().get_last_msg(stream.name, subject)
        except NotFoundError:
            return None
        return event_type.from_json(msg.data, subject=stream.as_published(msg.subject))

    def replay(self, events: tuple[type[Event], ...], handler: EventHandler, *, before_ready: bool = True) -> asyncio.Event:
        """Read every event of these types from the start of their stream when the service starts,
        before any consumer runs, then follow new ones (the few facts that make a service's state,
        such as silences). Declared in `gpumedic_bus.topology.REPLAYS`. A replay the bus breaks
        off during the start begins again, so `handler` must take an event it has seen. With
        `before_ready` False it runs once the service is ready, for a history that grows with the
        fleet's (every incident opened): the service is back within seconds of a restart, and
        what the history decides waits for the event returned, set once it has caught up."""
        allowed = REPLAYS.get(self.service, ())
        if not set(events) <= set(allowed) or len({stream_of(e).name for e in events}) != 1:
            raise ValueError(f"{self.service} may replay {[e.__name__ for e in allowed]} (one stream), not {[e.__name__ for e in events]}")
        caught_up = asyncio.Event()
        (self._replays if before_ready else self._replays_after).append((events, handler, caught_up))
        return caught_up

    async def _replay_after_ready(self, events: tuple[type[Event], ...], handler: EventHandler, caught_up: asyncio.Event) -> None:
        while True:
            try:
                await self._replay(events, handler)
            except Exception as exc:  # noqa: BLE001 (the bus away: begun again, as a start's replay would be)
                log.warning("%s: replaying %s: the bus did not answer (%s); trying again", self.service,
                            "/".join(e.__name__ for e in events), nats_reason(exc))
                await asyncio.sleep(0.5)
                continue
            caught_up.set()
            return

    def _own(self, name: str, delivery: str):
        item = declared_durable(name)
        if item.service != self.service or item.delivery != delivery:
            raise ValueError(f"durable {name!r} is {item.service}'s {item.delivery} consumer, not {self.service}'s {delivery} one")
        return item

    def respond(self, subject: str, handler: Callable[[bytes], Awaitable[bytes]]) -> None:
        """Answer core-NATS requests on one of this service's request subjects (`topology.REQUESTS`):
        each request's body goes to `handler`, whose bytes go back to the asker. The service's
        instances share the requests (a queue group); nothing is stored, so a request that finds
        no instance times out at the asker."""
        if not any(r.subject == subject and r.service == self.service for r in REQUESTS):
            raise ValueError(f"{self.service} answers no requests on {subject!r} (see gpumedic_bus.topology.REQUESTS)")

        @self.broker.subscriber(subject, queue=self.service, decoder=undecoded, title=f"{self.service}:{subject}")
        async def _on_request(msg: NatsMessage) -> bytes:
            return await handler(msg.body)  # FastStream sends it to the asker's reply subject

    def background(self, loop: BackgroundLoop, *, one_instance: str | None = None) -> None:
        """Run `loop` while the service runs (periodic probes, evaluations). With `one_instance`
        (a name in `topology.ONE_INSTANCE_LOOPS`), it runs in one of the service's instances at a
        time, on a lease of its own: the others' copies wait and take over when it stops."""
        if one_instance is not None:
            if one_instance not in ONE_INSTANCE_LOOPS.get(self.service, ()):
                raise ValueError(f"{self.service} has no one-instance loop {one_instance!r} (topology.ONE_INSTANCE_LOOPS)")
            inner, key = loop, f"{self.service}.{one_instance}"

            async def loop() -> None:
                await self._on_lease(key, inner)

            loop.__name__ = getattr(inner, "__name__", one_instance)
        self._loops.append(loop)

    def shares(self, work: str, *, before_giving_back: Callable[[int], Awaitable[None]] | None = None,
               alongside: bool = False) -> Shares:
        """This instance's share of per-node work `work` (a name in `topology.SHARED_LOOPS`) among the
        service's live instances, by the nodes' partitions (`gpumedic_bus.shares`): its loop asks
        `holds(node)` each round, and waits for `settled` before the first. `alongside`: held by
        every instance, a one-active service's standbys too (see `alongside`)."""
        if work not in SHARED_LOOPS.get(self.service, ()):
            raise ValueError(f"{self.service} shares no work {work!r} by partition (topology.SHARED_LOOPS)")
        shares = Shares(f"{self.service}.{work}", str(self.instance_id), before_giving_back=before_giving_back)

        async def hold() -> None:
            await shares.run(self.broker.connection)

        hold.__name__ = f"{work}-shares"
        if alongside:
            self.alongside(hold)
        else:
            self._loops.append(hold)
        return shares

    def alongside(self, loop: BackgroundLoop) -> None:
        """Run `loop` in every instance from its connection on, whether it is its service's active
        one or a standby (every zombie-detector instance runs a detector cell; one decides)."""
        self._alongside.append(loop)

    async def _start_alongside(self) -> None:
        for loop in self._alongside[len(self._alongside_started):]:
            self._alongside_started.append(asyncio.create_task(_logged(loop, self.service), name=getattr(loop, "__name__", "loop")))

    async def _on_lease(self, key: str, loop: BackgroundLoop) -> None:
        said = False

        def waiting(exc: BaseException) -> None:  # one line per outage, not one per try
            nonlocal said
            if not said:
                log.warning("%s: %s waits for its lease bucket: the bus did not answer (%s)", self.service, key, nats_reason(exc))
                said = True

        # The loop starts as the service becomes ready, which may be as the bus goes away: wait
        # for it as long as it takes, as a standby would, rather than let the loop die.
        lease = await ride_out(lambda: Lease.open(self.broker.connection, key, str(self.instance_id)), math.inf,
                               every_s=1.0, on_retry=waiting)
        try:
            while True:  # run the loop while the lease is held; `keep` returns when it is lost
                await lease.acquire()
                running = asyncio.create_task(loop())
                keeping = asyncio.create_task(lease.keep(lambda why: None))
                try:
                    await asyncio.wait({running, keeping}, return_when=asyncio.FIRST_COMPLETED)
                finally:
                    running.cancel()
                    keeping.cancel()
                if running.done() and not running.cancelled() and running.exception() is not None:
                    raise running.exception()
        finally:
            await lease.release()

    def app(self) -> FastStream:
        app = FastStream(self.broker, logger=logging.getLogger(self.service))
        app.on_startup(self._bind)
        app.after_startup(self._started)
        app.on_shutdown(self._stopping)
        app.after_shutdown(self._stopped)
        app.runtime = self  # callers (tests, the embedded stack) reach readiness and stats here
        return app

    async def _bind(self) -> None:
        """Everything a start needs from the bus, step by step: the provisioned consumers checked,
        the lease (one-active services), the startup hooks, the replays, the pull subscriptions. A
        step the bus does not answer (a cluster electing leaders after a server restart) is tried
        again in this process, for up to START_WITHIN_S, rather than failing the whole start."""
        deadline = asyncio.get_running_loop().time() + START_WITHIN_S
        steps: list[tuple[str, Callable[[], Awaitable[object]]]] = [("connecting", self.broker.connect),
                                                                     ("checking its consumers", self._check_consumers)]
        if self._alongside:
            steps.append(("starting what every instance runs", self._start_alongside))
        if self.service in ONE_ACTIVE:
            steps.append(("taking its lease", self._become_active))
        steps += [(f"its startup hook {getattr(hook, '__name__', hook)}", hook) for hook in self._startup]
        steps += [(f"replaying {'/'.join(e.__name__ for e in events)}", functools.partial(self._replay, events, handler))
                  for events, handler, _ in self._replays]
        for what, step in steps:
            await self._patiently(what, step, deadline)
        for _, _, caught_up in self._replays:
            caught_up.set()
        # FastStream starts its subscribers next and keeps a subscription once made; made here,
        # each is retried on its own instead of one lookup that times out failing the start, and
        # all at once: each asks its own consumer's leader, and one may be mid-election.
        await asyncio.gather(*(self._patiently(f"binding {sub.specification.call_name}", sub.start, deadline)
                               for sub in self.broker.subscribers))

    async def _patiently(self, what: str, step: Callable[[], Awaitable[object]], deadline: float) -> None:
        def said(exc: BaseException) -> None:
            log.warning("%s: starting: %s: the bus did not answer (%s); trying again", self.service, what, nats_reason(exc))

        await ride_out(step, deadline - asyncio.get_running_loop().time(), every_s=0.5, on_retry=said)

    async def _check_consumers(self) -> None:
        """Check that every consumer this service binds to is provisioned, and take its settings
        (all at once: each is answered by its own leader, and one may be mid-election)."""
        js = self.broker.connection.jetstream()
        consumers = [*self._consumers, *self._paced_consumers]
        infos = await asyncio.gather(*(self._provisioned(js, c.durable) for c in consumers))
        for consumer, info in zip(consumers, infos, strict=True):
            if isinstance(consumer, EventConsumer):
                # The server redelivers up to max_deliver; we act on all but the last and dead-letter it.
                consumer.max_deliver = max(1, (info.config.max_deliver or 2) - 1)
                consumer.ack_wait_s = info.config.ack_wait or consumer.ack_wait_s

    async def _provisioned(self, js, item):
        try:
            return await _consumer_info(js, item.stream, item.name)
        except NotFoundError:
            raise BusNotProvisioned(
                f"{self.service}: consumer {item.name} on stream {item.stream} does not exist; "
                "run `gpumedic provision` (as the NATS admin) first"
            ) from None
        except nats.errors.TimeoutError:
            raise BusNotProvisioned(
                f"{self.service}: no answer about consumer {item.name} on stream {item.stream} within {CONSUMER_INFO_WITHIN_S:g}s; "
                f"is NATS user {self.nats.user or '(none)'} allowed to use it, and JetStream enabled?"
            ) from None

    async def _become_active(self) -> None:
        """Wait as a standby until this instance holds its service's lease. Its metrics answer
        meanwhile (`gpumedic_active` 0), so a standby is a healthy container too."""
        self._serve_metrics()
        self.lease = await Lease.open(self.broker.connection, self.service, str(self.instance_id))
        await self.lease.acquire()
        # Renewed from now on, not once started: the rest of a start can outlast the TTL.
        self._tasks.append(asyncio.create_task(self.lease.keep(self.on_lease_lost), name="lease"))

    def _serve_metrics(self) -> None:
        if self._metrics_port is None or self.metrics.port is not None:
            return
        self.metrics.gauge(CONNECTED, "1 while this service's NATS connection is up.", [], self._connected)
        self.metrics.gauge("gpumedic_event_loop_lag_seconds", "The worst lateness of this service's event loop over the last 10 s: "
                           "past 1 s, what it times (SSH checks, peer probes, silence) judges nothing.", [],
                           lambda: [((), self.loop_lag.worst())])
        durables = [c.durable.name for c in (*self._consumers, *self._paced_consumers)]
        if durables:
            self.metrics.gauge("gpumedic_consumer_missing", "1 for a durable consumer of this service found gone: it receives "
                               "nothing of it until `gpumedic provision` makes it again.", ["consumer"],
                               lambda: [((name,), 1.0 if name in self.consumers_missing else 0.0) for name in durables])
        if self._paced_consumers:
            self.metrics.gauge("gpumedic_consumer_behind_seconds", "While samples wait for this consumer, the age of the newest one it "
                               "handled (0 when none waits): how far behind its stream it judges.", ["consumer"],
                               lambda: [((lag.durable,), lag.behind_s) for lag in self.lags()])
            self.metrics.gauge("gpumedic_consumer_pending", "Messages waiting for this consumer in its stream.", ["consumer"],
                               lambda: [((lag.durable,), float(lag.pending)) for lag in self.lags()])
        if self.service in ONE_ACTIVE:
            self.metrics.gauge("gpumedic_active", "1 while this instance is its service's active one, 0 on standby.", [],
                               lambda: [((), 1.0 if self.lease is not None and self.lease.held else 0.0)])
        self.metrics.serve(self._metrics_port)

    async def _replay(self, events: tuple[type[Event], ...], handler: EventHandler) -> None:
        """Read the events from their stream's start, then follow new ones in a task of their own
        (`gpumedic_bus.follow`: no consumer is created, so no service needs consumer rights)."""
        await self.broker.connect()
        stream = stream_of(events[0])

        async def on_message(msg) -> None:
            event_type = next((e for e in events if msg.subject == e.subject_prefix or msg.subject.startswith(e.subject_prefix + ".")), None)
            try:
                event = event_type.from_json(msg.data or b"", subject=stream.as_published(msg.subject)) if event_type else None
            except EventDecodeError as exc:
                log.warning("%s: skipped a replayed message on %s: %s", self.service, msg.subject, exc.reason)
                return
            if event is None:
                return
            try:
                await handler(event)
            except Exception:  # one bad fact must not stop the service from following the rest
                log.exception("%s: handling replayed %s failed", self.service, event_type.__name__)

        follower = StreamFollower(self.broker.connection, stream.name, [stream.stored_filter(e) for e in events], on_message,
                                  published=[e.subject_filter() for e in events])
        await follower.listen()  # woken by what comes while it catches up, too
        try:
            replayed = await follower.catch_up()
        except BaseException:  # tried again from the start: this one must not follow too
            await follower.close()
            raise
        self._followers.append(follower)
        self._tasks.append(asyncio.create_task(follower.follow(), name=f"{self.service}-follow-{stream.name}"))
        log.info("%s: replayed %d %s", self.service, replayed, "/".join(e.__name__ for e in events))

    async def _started(self) -> None:
        self._tasks.append(asyncio.create_task(self.loop_lag.run(), name=f"{self.service}-loop-lag"))
        deadline = asyncio.get_running_loop().time() + START_WITHIN_S
        for consumer in self._paced_consumers:
            await self._patiently(f"binding {consumer.durable.name}", consumer.start, deadline)
        for event_type, handler, view in self._live:
            await self._follow(event_type, handler, view)
        if self.service in PRODUCERS[ServiceHeartbeat]:
            self._tasks.append(asyncio.create_task(self._heartbeat(), name=f"{self.service}-heartbeat"))
        if self._consumers or self._paced_consumers:
            self._tasks.append(asyncio.create_task(self._watch_consumers(), name=f"{self.service}-consumers"))
        if self._paced_consumers:
            self._tasks.append(asyncio.create_task(self._watch_lag(), name=f"{self.service}-lag"))
        if self._span_recorder is not None:
            self._tasks.append(asyncio.create_task(self._span_recorder.run(self._publish), name="spans"))
        for events, handler, caught_up in self._replays_after:
            self._tasks.append(asyncio.create_task(self._replay_after_ready(events, handler, caught_up), name=f"{self.service}-replay"))
        for loop in self._loops:
            self._tasks.append(asyncio.create_task(_logged(loop, self.service), name=getattr(loop, "__name__", "loop")))
        self._serve_metrics()
        self.ready.set()
        log.info("%s ready (instance %s)", self.service, self.instance_id)

    def _connected(self):
        connection = self.broker._connection
        yield (), 1.0 if connection is not None and connection.is_connected else 0.0

    async def _stopping(self) -> None:
        self.ready.clear()
        for sub in self._live_subs:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()
        for follower in self._followers:
            await follower.close()
        for reader, nc in self._readers:
            await reader.close()
            with contextlib.suppress(Exception):
                await nc.close()
        self._followers.clear()
        self._live_subs.clear()
        self._readers.clear()
        for consumer in self._paced_consumers:
            with contextlib.suppress(Exception):
                await consumer.stop()
        # Bounded: a loop that swallows its cancellation must not keep the service from stopping.
        for task in await stop_tasks([*self._tasks, *self._alongside_started], STOP_TASKS_WITHIN_S):
            log.warning("%s: %s did not stop within %gs of being cancelled; stopping without it",
                        self.service, task.get_name(), STOP_TASKS_WITHIN_S)
        self._tasks.clear()
        self._alongside_started.clear()
        if self.lease is not None:
            await self.lease.release()  # a standby takes over now, not a TTL later
        if self.service in PRODUCERS[ServiceHeartbeat]:
            with contextlib.suppress(Exception):
                await publish_event(self.broker, self.heartbeat_event("stopping"))

    async def _stopped(self) -> None:
        self.metrics.stop()
        if self._span_recorder is not None:
            self.tracer_provider.force_flush()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._span_recorder.flush(self._publish), 2)
        self.tracer_provider.shutdown()

    def heartbeat_event(self, state: str) -> ServiceHeartbeat:
        """This instance's heartbeat as it would publish it now (with its consumers' lag)."""
        return ServiceHeartbeat(
            source=self.service, service=self.service, instance_id=self.instance_id, state=state,
            consumers_missing=tuple(sorted(self.consumers_missing)),
            lag=tuple(ConsumerLag(durable=lag.durable, pending=lag.pending, behind_s=round(lag.behind_s, 3)) for lag in self.lags()),
            loop_lag_s=round(self.loop_lag.worst(HEARTBEAT_EVERY_S), 3), cpu_pressure=read_pressure(self._pressure_path),
        )

    def lags(self) -> list[Lag]:
        """How far behind its stream each sample consumer this instance runs is now (a standby's: none)."""
        return [consumer.lag() for consumer in (*self._paced_consumers, *self.more_paced_consumers()) if consumer.started]

    async def _watch_lag(self) -> None:
        """Ask the server what waits for each sample consumer every LAG_CHECK_EVERY_S: a consumer that
        is given nothing (a stall) learns from no message that it is behind."""
        js = self.broker.connection.jetstream()
        while True:
            await asyncio.sleep(LAG_CHECK_EVERY_S)
            for consumer in self._paced_consumers:
                try:
                    info = await js.consumer_info(consumer.durable.stream, consumer.durable.name, timeout=2)
                except Exception as exc:  # the bus away: the messages' own counts stand meanwhile
                    log.debug("%s: lag of %s not looked up: %s", self.service, consumer.durable.name, nats_reason(exc))
                    continue
                consumer.saw_pending(info.num_pending)

    async def _watch_consumers(self) -> None:
        """Look up this service's durable consumers every CONSUMER_CHECK_EVERY_S: one that is gone
        (deleted by hand, or lost with a server's data) means the service silently receives nothing
        of it. It says so in one line, in `gpumedic_consumer_missing` and in its heartbeat (which
        `gpumedic report` and the console read), and once more when it is back."""
        js = self.broker.connection.jetstream()
        while True:
            await asyncio.sleep(CONSUMER_CHECK_EVERY_S)
            for item in [c.durable for c in (*self._consumers, *self._paced_consumers)]:
                try:
                    await js.consumer_info(item.stream, item.name, timeout=2)
                except NotFoundError:
                    if item.name not in self.consumers_missing:
                        self.consumers_missing.add(item.name)
                        log.error("%s: consumer %s on stream %s is gone: this service receives no %s until it is made again "
                                  "(run `gpumedic provision` as the NATS admin)", self.service, item.name, item.stream, item.event.__name__)
                except Exception as exc:  # the bus away: no verdict this round
                    log.debug("%s: consumer %s not looked up: %s", self.service, item.name, nats_reason(exc))
                else:
                    if item.name in self.consumers_missing:
                        self.consumers_missing.discard(item.name)
                        log.warning("%s: consumer %s on stream %s is back", self.service, item.name, item.stream)

    async def _heartbeat(self) -> None:
        while True:
            try:
                await publish_event(self.broker, self.heartbeat_event("ready"))
            except Exception as exc:  # sooner than the next beat: the first one says the service is back
                log.warning("%s: heartbeat not published (%s); the bus may be reconnecting", self.service, nats_reason(exc))
                await asyncio.sleep(1.0)
                continue
            await asyncio.sleep(HEARTBEAT_EVERY_S)

    async def _publish(self, event) -> None:
        await publish_event(self.broker, event)


LAG_CHECK_EVERY_S = 2.0
"""How often a service asks the server how many samples wait for each of its sample consumers."""
CONSUMER_CHECK_EVERY_S = 30.0
"""How often a service looks up its durable consumers: a lost one is noticed within a minute."""
START_WITHIN_S = 60.0
"""How long a starting service tries a step again that the bus does not answer, before it gives up
(and exits, for its supervisor to start it again)."""
CONSUMER_INFO_WITHIN_S = 30.0
"""How long a starting service asks after one of its consumers: a cluster that lost a server
answers nothing for a few seconds while it elects, which is no reason to give up."""


async def _consumer_info(js, stream: str, name: str):
    try:  # answered in ms by a consumer that has a leader
        return await ride_out(lambda: js.consumer_info(stream, name, timeout=2), CONSUMER_INFO_WITHIN_S, every_s=0.5)
    except BUS_AWAY:
        raise nats.errors.TimeoutError from None


async def _logged(loop: BackgroundLoop, service: str) -> None:
    """A background loop that dies is logged loudly instead of vanishing."""
    try:
        await loop()
    except asyncio.CancelledError:
        raise
    except Exception:
        log.exception("%s: background loop %s stopped", service, getattr(loop, "__name__", loop))
        raise


def _stop_this_process(why: str) -> None:
    """A lost lease stops the process as SIGTERM would (FastStream stops gracefully); whoever
    supervises it starts it again, and it waits as a standby."""
    signal.raise_signal(signal.SIGTERM)
