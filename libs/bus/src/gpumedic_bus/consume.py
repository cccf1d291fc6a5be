"""Consuming typed events from provisioned durable JetStream consumers, safely.

The adapter between FastStream and a service's handler: it validates each message into its
event class, never hands an invalid one to the handler, and keeps what it refuses in the
dead-letter stream with the reason. A handler that raises gets the message back later with
back-off; after the consumer's last delivery but one the message is dead-lettered too. Acks are
explicit. Consumers are bound, never created: `gpumedic_bus.provision` makes them.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Generic, TypeVar

from faststream.middlewares import AckPolicy
from faststream.nats import JStream, NatsBroker, PullSub
from faststream.nats.annotations import NatsMessage
from nats.aio.client import Client as NATS
from opentelemetry.context import Context

from gpumedic_bus.outage import BUS_AWAY, nats_reason
from gpumedic_bus.publish import publish_event
from gpumedic_bus.streams import stream_of
from gpumedic_bus.topology import Durable
from gpumedic_bus.tracing import trace_context
from gpumedic_events import Event, EventDecodeError, MessageRejected
from gpumedic_events.deadletter import MAX_KEPT_PAYLOAD
from gpumedic_telemetry.metrics import ServiceMetrics

log = logging.getLogger(__name__)

PACED_BATCH = 256
"""The most a paced consumer asks for at once; it acknowledges once a batch (AckPolicy.ALL acks all before)."""
BACKLOG_BATCHES = 4
"""A paced consumer or reader behind asks for up to this many batches at once: a quarter of the
round trips, each an idle wait on a busy machine. The largest ask and a late answer to the one
before it fit a paced consumer's `max_ack_pending` (8 batches) and its inbox's limit."""
PACED_EVERY_S = 0.2
"""How often a paced consumer asks for what has come, when it is not behind."""
PACED_ANSWER_S = 5.0
"""How long it waits for a batch's end before asking again (an answer lost to a leader's change)."""
PACED_TURN_S = 0.005
"""The longest a paced consumer works through a backlog before it lets the rest of its service run."""

E = TypeVar("E", bound=Event)


async def ask_on_pace(
    ask: Callable[[int], Awaitable[None]], answered: asyncio.Event, waiting: Callable[[], int], *,
    batch: int, every_s: float, what: str, settle: Callable[[], Awaitable[None]] | None = None,
) -> None:
    """A paced reader's loop, until cancelled: `ask(size)` for a batch (`batch`, or as many as
    `waiting()` said wait after the last answer, up to BACKLOG_BATCHES batches), wait until the
    reply handler sets `answered` (or PACED_ANSWER_S: an answer lost to a leader's change, the
    bus away), then `settle()` (acknowledge what was handled), and ask again at once while more
    wait, else after `every_s`."""
    while True:
        size = min(max(batch, waiting()), BACKLOG_BATCHES * batch)
        answered.clear()
        try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancellation that ends this loop
            await ask(size)
            async with asyncio.timeout(PACED_ANSWER_S):
                await answered.wait()
        except TimeoutError:
            pass  # no answer: ask again
        except Exception as exc:  # noqa: BLE001 (the connection closing or reconnecting: the next turn asks again)
            log.debug("%s: asking for a batch failed: %r", what, exc)
        if settle is not None:
            await settle()
        if not waiting():
            await asyncio.sleep(every_s)


REPLAY_FOR = "Gpumedic-Replay-For"
"""On a dead letter's replay (`gpumedic dead-letters replay`): the durable that refused the
original, the only consumer that handles the copy."""
REPLAY_OF = "Gpumedic-Replay-Of"
"""On a dead letter's replay: the stream sequence of the original the copy repeats."""

RETRY_BACKOFF_S = (1.0, 5.0, 15.0, 30.0, 60.0)
"""Delay before redelivery after the n-th failed attempt (the last value repeats)."""
REPLAY_CHECK_S = 5.0
"""How long a consumer waits for its stream to say whether a replay repeats a stored message."""
WAIT_AT_MOST_S = 5.0
"""While a dependency is down, a waiting message is tried again this often (or at a third of the
consumer's AckWait, if that is shorter), telling JetStream each time that it is still being worked on."""


@dataclass(frozen=True)
class Delivery:
    """What a handler gets besides the event: where it came from and how often it came."""

    subject: str
    headers: Mapping[str, str]
    deliveries: int
    message: NatsMessage | None = None
    stored_at: datetime | None = None
    """When the stream stored the message, by the server's clock (None for a core message)."""

    @property
    def trace_context(self) -> Context:
        return trace_context(self.headers)

    async def still_working(self) -> None:
        """Tell JetStream a long handler is alive, so AckWait does not redeliver meanwhile."""
        if self.message is not None:
            await self.message.in_progress()


Handler = Callable[[E, Delivery], Awaitable[None]]


class _Counts:
    """One consumer's outcome counters and latency, bound to its event type once (the sample path
    is hot: a labels() lookup per message would cost more than the count)."""

    def __init__(self, metrics: ServiceMetrics, event: str) -> None:
        self.ok, self.invalid, self.retried, self.failed = (
            metrics.handled.labels(event, outcome).inc for outcome in ("ok", "invalid", "retried", "failed")
        )
        self.took = metrics.handling.labels(event).observe


class EventConsumer(Generic[E]):
    """Validates, dispatches and acknowledges one durable consumer's messages."""

    def __init__(
        self,
        broker: NatsBroker,
        durable: Durable,
        handler: Handler[E],
        *,
        service: str,
        metrics: ServiceMetrics,
        waits_on: tuple[type[BaseException], ...] = (),
    ) -> None:
        self._broker = broker
        self.durable = durable
        self._event_type: type[E] = durable.event
        self._handler = handler
        self._service = service
        self._counts = _Counts(metrics, durable.event.__name__)
        self._waits_on = waits_on
        self._waiting = metrics.waiting
        self.max_deliver = 1
        """Deliveries this service acts on; set from the provisioned consumer when the service binds."""
        self.ack_wait_s = 30.0
        """The provisioned consumer's AckWait; set when the service binds."""

    async def process(self, msg: NatsMessage) -> None:
        raw = msg.raw_message
        subject = raw.subject
        deliveries = _deliveries(raw)
        headers = dict(raw.headers or {})
        if headers.get(REPLAY_FOR, self.durable.name) != self.durable.name and await self._a_stored_copy(raw, headers):
            log.info("%s: %s is a replay for %s, which refused it; %s had the original", self._service, subject,
                     headers[REPLAY_FOR][:100], self.durable.name)
            await msg.ack()
            return
        try:
            event = self._event_type.from_json(raw.data, subject=self.durable.published_subject(subject))
        except EventDecodeError as exc:
            await self._dead_letter(msg, exc.reason, deliveries, cause="invalid")
            self._counts.invalid()
            return
        started = time.perf_counter()
        try:
            await self._handle_waiting(event, Delivery(subject, headers, deliveries, msg, _stored_at(raw)))
        except Exception as exc:
            self._counts.took(time.perf_counter() - started)
            if deliveries >= self.max_deliver:
                log.exception("%s: giving up on %s after %d deliveries", self._service, subject, deliveries)
                await self._dead_letter(msg, f"handler failed {deliveries} times: {exc!r}"[:2000], deliveries, cause="failed")
                self._counts.failed()
                return
            self._counts.retried()
            delay = RETRY_BACKOFF_S[min(deliveries, len(RETRY_BACKOFF_S)) - 1]
            log.warning(
                "%s: handling %s failed (delivery %d of %d), retrying in %.0fs: %r",
                self._service, subject, deliveries, self.max_deliver, delay, exc,
            )
            await msg.nack(delay=delay)
            return
        self._counts.took(time.perf_counter() - started)
        await msg.ack()
        self._counts.ok()

    async def _handle_waiting(self, event: E, delivery: Delivery) -> None:
        """The handler, tried again for as long as what it raises says a dependency is down (the
        store): the message is not at fault, so it is neither counted as a failed delivery nor
        dead-lettered. It stays in progress, and since the consumer fetches its next batch only
        once this batch is done, the service takes nothing new meanwhile; JetStream keeps it."""
        every_s = min(WAIT_AT_MOST_S, self.ack_wait_s / 3)
        waited = False
        try:
            while True:
                try:
                    return await self._handler(event, delivery)
                except self._waits_on as exc:
                    if not waited:
                        log.warning("%s: %s; %s waits until it is back, and nothing new is taken meanwhile",
                                    self._service, exc, delivery.subject)
                        self._waiting.inc()
                        waited = True
                await delivery.still_working()
                await asyncio.sleep(every_s)
        finally:
            if waited:
                self._waiting.dec()
                log.info("%s: %s went on after waiting", self._service, delivery.subject)

    async def _a_stored_copy(self, raw, headers: Mapping[str, str]) -> bool:
        """Whether `raw` repeats, subject and bytes, a message its stream stored before it (at the
        sequence `REPLAY_OF` names): only such a copy is skipped as another consumer's replay, so no
        producer can keep a new message from this consumer by naming another in the header."""
        stored = _stored_as(raw)
        try:
            seq = int(headers.get(REPLAY_OF, ""))
            if stored is None or not 0 < seq < stored[1]:
                return False
            original = await self._broker.connection.jetstream(timeout=REPLAY_CHECK_S).get_msg(stored[0], seq=seq)
        except Exception as exc:  # noqa: BLE001 (not a number, not stored, the bus away: handled as any message)
            log.debug("%s: the replay header on %s names no stored original: %r", self._service, raw.subject, exc)
            return False
        return original.subject == raw.subject and original.data == raw.data

    async def _dead_letter(self, msg: NatsMessage, reason: str, deliveries: int, *, cause: str) -> None:
        raw = msg.raw_message
        # If the dead-letter stream cannot take it, this raises: the message is not acked and
        # comes back later, so nothing is lost.
        await keep_rejected(self._broker, self._service, raw, reason, deliveries, cause=cause)
        await msg.reject()


async def keep_rejected(broker: NatsBroker, service: str, raw, reason: str, deliveries: int, *, cause: str) -> None:
    """Log and dead-letter one refused message (`raw`: the nats-py message); the consumer counts it."""
    log.warning("%s rejected a message on %s (%s): %s", service, raw.subject, cause, reason)
    stored = _stored_as(raw)
    record = rejection(service, raw.subject, raw.data, reason, deliveries, stored=stored)
    # One dead letter per stored message and service, however many of its instances refuse it (two
    # report-builder consoles both read every sample): the stream keeps the first within its
    # duplicate window.
    await publish_event(broker, record, msg_id=f"rejected:{service}:{stored[0]}:{stored[1]}" if stored else None)


def _stored_as(raw) -> tuple[str, int] | None:
    """The stream and sequence that hold a message; None for one no stream holds (a request)."""
    try:
        meta = raw.metadata
    except Exception:  # noqa: BLE001 (nats-py raises its own error for a non-JetStream message)
        return None
    return meta.stream, meta.sequence.stream


def rejection(
    service: str, subject: str, data: bytes, reason: str, deliveries: int, *, stored: tuple[str, int] | None = None
) -> MessageRejected:
    """The dead-letter record of one refused message (`stored`: its stream and sequence)."""
    kept = data[:MAX_KEPT_PAYLOAD].decode("utf-8", errors="replace")[:MAX_KEPT_PAYLOAD]
    return MessageRejected(
        source=service,
        service=service,
        original_subject=subject[:512],
        reason=reason[:2000],
        deliveries=max(deliveries, 1),
        payload_bytes=len(data),
        payload_sha256=hashlib.sha256(data).hexdigest(),
        payload=kept,
        payload_truncated=len(data) > MAX_KEPT_PAYLOAD,
        stream=stored[0] if stored else None,
        stream_sequence=stored[1] if stored else None,
    )


def _deliveries(raw) -> int:
    try:
        return int(raw.metadata.num_delivered)
    except Exception:  # core (non-JetStream) message
        return 1


def _stored_at(raw) -> datetime | None:
    try:
        return raw.metadata.timestamp.astimezone(UTC)
    except Exception:  # core (non-JetStream) message
        return None


async def undecoded(msg: NatsMessage) -> bytes:
    """FastStream's decoder for every subscriber here: none. FastStream would parse JSON bodies
    itself before the handler runs, and a body its parser chokes on (nesting deeper than Python
    recurses, an integer of more digits than `int()` takes) then fails outside the project's
    handling: retried with a traceback and dropped, never dead-lettered, a request never answered.
    The events library decodes each body inside the handling, where every failure has a reason."""
    return msg.body


def subscribe(
    broker: NatsBroker,
    durable: Durable,
    handler: Handler[E],
    *,
    service: str,
    metrics: ServiceMetrics,
    inbox_prefix: str,
    batch_size: int = 16,
    fetch_within_s: float = 1.0,
    waits_on: tuple[type[BaseException], ...] = (),
) -> EventConsumer[E]:
    """Attach `handler` to a provisioned durable pull consumer.

    Each fetched batch is handled concurrently (FastStream runs the batch in one task group) and
    the next fetch waits until the whole batch is done, so `batch_size` bounds how many messages
    this instance handles at once. A fetch that got its first message waits for the rest of its
    batch until `fetch_within_s` is up (nats-py's fetch), so that bounds how late a lone message is
    handled. Instances sharing the durable split the work. Fetched
    messages come back on the user's own `inbox_prefix` (FastStream does not take the connection's).
    What `waits_on` lists, raised by the handler, means a dependency is down: the message waits
    (see `EventConsumer._handle_waiting`).
    """
    consumer: EventConsumer[E] = EventConsumer(broker, durable, handler, service=service, metrics=metrics, waits_on=waits_on)

    @broker.subscriber(
        durable.filter_subject,
        stream=JStream(durable.stream, declare=False),
        durable=durable.name,
        pull_sub=PullSub(batch_size=batch_size, timeout=fetch_within_s),
        inbox_prefix=f"{inbox_prefix}.".encode(),
        ack_policy=AckPolicy.MANUAL,
        decoder=undecoded,
        title=f"{service}:{durable.event.__name__}",
        description=(durable.event.__doc__ or "").strip(),
    )
    async def _on_message(msg: NatsMessage) -> None:
        await consumer.process(msg)

    return consumer


EventHandler = Callable[[E], Awaitable[None]]


@dataclass(frozen=True)
class Lag:
    """How far behind its stream a sample consumer is, as it knows itself: a fact it publishes (its
    heartbeat, its metrics), and what the silence of a node is judged against."""

    durable: str
    pending: int
    """Messages waiting for it: those the stream holds that it has not been given yet (as the
    server last said) and those delivered that its handler has not reached."""
    behind_s: float
    """While any wait: the age of the newest message it has handled (it grows while nothing comes);
    0 when none waits."""

    def behind(self, limit_s: float) -> bool:
        return self.behind_s > limit_s


class PacedConsumer(Generic[E]):
    """A durable consumer for a high-volume, disposable event (node samples), asked for in batches.

    Measured on the sample path (`make bench`): FastStream's per-message dispatch and nats-py's
    pull fetch cost far more than the validation itself, so this path takes messages straight
    from a plain subscription to its own inbox, validates each into its event class (or only
    into the fields a `view` of it names: `gpumedic_events.views`), and acknowledges once a
    batch (the consumer acks all up to the last). Invalid messages are dead-lettered like
    anywhere else; a handler error is logged and the stream moves on, since the node's next
    sample supersedes this one.

    Paced, not pushed: every `every_s` it asks for what has come since (up to `batch`, answered
    at once: `no_wait`); after a full batch whose last sample says more wait (a backlog), it asks
    again at once, for as many as wait, up to `BACKLOG_BATCHES` batches. A push
    consumer delivered each sample as it was published, 2,000 a second at 10,000 nodes, and each
    one woke the process on its own: `sample_path`'s comparison at that rate measured 165 us of
    CPU to receive and decode a sample pushed, 40 us paced. A sample waits at most `every_s` more;
    a node samples every few seconds.

    A consumer behind by a backlog must not hold its service still, as it did under overload:
    every answer the service waited for (its lease's renewal, a KV write, a publish's ack) queued
    on the one connection behind those samples, and nats-py hands a queue to the callback without
    returning to the event loop. The lease was lost, the process stopped, and its samples waited
    out AckWait. So the samples come on a connection of their own (`connect`), and the consumer
    gives the loop a turn at least every `PACED_TURN_S`.
    """

    def __init__(
        self,
        broker: NatsBroker,
        durable: Durable,
        handler: EventHandler[E],
        *,
        connect: Callable[[], Awaitable[NATS]],
        service: str,
        metrics: ServiceMetrics,
        batch: int = PACED_BATCH,
        every_s: float = PACED_EVERY_S,
        view: type | None = None,
    ) -> None:
        self._broker = broker
        self._connect = connect
        self._nc: NATS | None = None
        self.durable = durable
        self._event_type: type[E] = durable.event
        self.view: type = view or durable.event
        """What each message is decoded into: the event, or a view of it."""
        self._published = stream_of(durable.event).as_published  # looked up once: the path is hot
        self._handler = handler
        self._service = service
        self._counts = _Counts(metrics, durable.event.__name__)
        self._batch = batch
        self._every_s = every_s
        self._last = None
        self._sub = None
        self._puller: asyncio.Task | None = None
        self._owed = 0
        """What the batch asked for still to come."""
        self._answered = asyncio.Event()
        """The batch asked for has come: whole, or short and ended by the server's status."""
        self._full = False
        self._pending = 0
        self._newest_stored: float | None = None
        """When the stream stored the newest message handled (epoch seconds, the server's clock)."""
        self._newest = None
        """The newest message handled, its metadata not read yet: read only when the lag is asked
        for (about once a second), not for each of thousands of samples a second."""
        self._turn_began = time.perf_counter()

    async def start(self) -> None:
        if self._nc is None:
            self._nc = await self._connect()
        # Bound, never created: a consumer not provisioned stops the start here, by its name.
        info = await self._nc.jetstream().consumer_info(self.durable.stream, self.durable.name)
        if info.config.deliver_subject:
            raise ValueError(f"{self.durable.name} on {self.durable.stream} is a push consumer of an older release: run gpumedic-provision")
        inbox = self._nc.new_inbox()
        # Never more than the consumer lets wait unacknowledged: nats-py drops what overflows, and
        # an ack of a later sample would then ack the dropped ones too.
        self._sub = await self._nc.subscribe(inbox, cb=self._on_delivery, pending_msgs_limit=8 * PACED_BATCH)
        subject = f"$JS.API.CONSUMER.MSG.NEXT.{self.durable.stream}.{self.durable.name}"

        async def ask_for_a_batch(size: int) -> None:
            self._owed, self._full = size, False
            await self._nc.publish(subject, json.dumps({"batch": size, "no_wait": True}).encode(), reply=inbox)

        self._puller = asyncio.create_task(
            ask_on_pace(ask_for_a_batch, self._answered, lambda: self._pending if self._full else 0, batch=self._batch,
                        every_s=self._every_s, what=self.durable.name, settle=self._ack),
            name=f"{self.durable.name}-asks",
        )

    async def stop(self) -> None:
        if self._puller is not None:
            self._puller.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._puller
            self._puller = None
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        await self._ack()
        if self._nc is not None:
            nc, self._nc = self._nc, None
            await nc.close()

    async def _on_delivery(self, msg) -> None:
        headers = msg.headers
        if headers and not msg.data and "Status" in headers:
            self._answered.set()  # the server ends a short batch with a status (404: no more now)
            return
        await self.on_message(msg)
        self._owed -= 1
        if self._owed == 0:
            self._full = True
            self._read_newest()  # how many more wait: the next batch's size
            self._answered.set()

    @property
    def started(self) -> bool:
        return self._sub is not None

    def lag(self, now: float | None = None) -> Lag:
        """How far behind it is now (`now`: epoch seconds; the stream's stored time is the server's
        clock, so a skew between the two machines adds to it)."""
        now = time.time() if now is None else now
        self._read_newest()
        # Delivered but not yet handled counts too: a handler held up (by a lock, a slow write) has
        # its samples queue on the connection while the server says none waits.
        waiting = self._pending + (self._sub.pending_msgs if self._sub is not None else 0)
        behind = 0.0 if not waiting or self._newest_stored is None else max(0.0, now - self._newest_stored)
        return Lag(self.durable.name, waiting, behind)

    def saw_pending(self, pending: int) -> None:
        """What the server says waits (consumer info), for a stall in which no message tells it."""
        self._read_newest()  # older than the server's answer
        self._pending = pending

    def _read_newest(self) -> None:
        msg, self._newest = self._newest, None
        if msg is None:
            return
        try:
            meta = msg.metadata
            self._pending, self._newest_stored = meta.num_pending, meta.timestamp.timestamp()
        except Exception:  # noqa: BLE001 (not a JetStream message: nothing to learn from it)
            pass

    async def on_message(self, msg) -> None:
        """One message, as the consumer's subscription hands it."""
        self._newest = msg
        try:
            event = self._event_type.decode_as(self.view, msg.data, subject=self._published(msg.subject))
        except EventDecodeError as exc:
            self._counts.invalid()
            try:
                await keep_rejected(self._broker, self._service, msg, exc.reason, _deliveries(msg), cause="invalid")
            except Exception:
                log.exception("%s: could not dead-letter a message from %s", self._service, msg.subject)
        else:
            started = time.perf_counter()
            try:
                await self._handler(event)
            except BUS_AWAY as exc:  # what the handler publishes cannot be stored now: one line
                self._counts.failed()
                log.warning("%s: handling %s failed (%s); moving on to newer samples", self._service, msg.subject, nats_reason(exc))
            except Exception:
                self._counts.failed()
                log.exception("%s: handling %s failed; moving on to newer samples", self._service, msg.subject)
            else:
                self._counts.ok()
            self._counts.took(time.perf_counter() - started)
        self._last = msg
        if time.perf_counter() - self._turn_began > PACED_TURN_S:
            await asyncio.sleep(0)  # the rest of the service runs; then the backlog goes on
            self._turn_began = time.perf_counter()

    async def _ack(self) -> None:
        msg, self._last = self._last, None
        if msg is not None:
            with contextlib.suppress(Exception):  # unacked samples are redelivered: harmless
                await msg.ack()
