"""A detector between the bus and its incident logic: decide, commit, then persist and publish.

Every detector (zombie-detector over node facts, leader-health over its peer cluster) runs its
findings through the shared lifecycle (`book`, `lifecycle`) and applies the resulting
transitions here. Spans are named for the incident's business steps (`Span`): `detect` starts
the incident's trace, `decide` requests an action, `verify` follows the findings to resolution or
escalation, `update` records repeats and links. The trace context rides the NATS headers to the
remediator and back.

Deciding runs under one lock: two inputs about one fault (a lost GPU's event and the sample that
shows it) arriving together must not both find no incident and open two. The lock covers the
decision and the book only: each transition is swapped into the book at once, so the next input
sees it, and queued for one applier that persists it (with its events in the state's outbox: the
remediator's gate checks requests against the state), publishes its events (each waiting out a
bus that does not answer for a while), then empties the outbox, in the order decided. So a flood
of incidents, each a KV write and a publish or two, never holds the sample path; an input that
must not be acknowledged before its outcome is stored (an action's result, a node event) waits
for its transitions to be applied. A detector that dies in between publishes the outbox when it
resumes; a transition that fails for good is taken back out of the book with every later one of
the same incident, and the next finding decides again.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
from collections import Counter, deque
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Protocol

from opentelemetry.context import Context
from opentelemetry.trace import Span as OtelSpan
from opentelemetry.trace import Status, StatusCode, Tracer, use_span
from prometheus_client import Counter as PromCounter

from gpumedic_bus import Delivery, ServiceRuntime, inject_trace, publish_event, trace_context
from gpumedic_bus.follow import GET_TIMEOUT_S
from gpumedic_bus.outage import BUS_AWAY, nats_reason, ride_out
from gpumedic_bus.tracing import traceparent_of
from gpumedic_events import (
    EVENT_TYPES,
    ActionCompleted,
    Event,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    SilenceAdded,
    SilenceRemoved,
)
from gpumedic_incidents.book import IncidentBook
from gpumedic_incidents.lifecycle import Transition
from gpumedic_incidents.state import IncidentState, Unpublished
from gpumedic_incidents.store import IncidentStates
from gpumedic_telemetry import ACTION_ID, INCIDENT_ID, NODE_ID

log = logging.getLogger(__name__)

EVENTS_BY_NAME: dict[str, type[Event]] = {e.__name__: e for e in EVENT_TYPES}

TICK_EVERY_S = 1.0
PUBLISH_PATIENCE_S = 15.0
"""How long each write of a transition (a state saved, an event published) waits out a bus that
does not answer before the transition fails."""
MAX_UNAPPLIED = 10_000
"""Transitions decided and not yet applied; past it deciding waits for the applier (a bus that
stopped answering holds the detector rather than its memory growing without end)."""


@dataclasses.dataclass(eq=False)
class _Unapplied:
    transition: Transition
    detect: OtelSpan | None
    """The incident's first span, started when it was decided (its trace id is in the state)."""
    done: asyncio.Future[None]


def _now() -> datetime:
    return datetime.now(UTC)


class IncidentLogic(Protocol):
    """What a detector's logic offers besides its own inputs."""

    book: IncidentBook

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]: ...

    def on_tick(self, now: datetime) -> list[Transition]: ...


class Detector:
    """One detector's incidents on the bus; `decide` is how its own inputs reach its logic."""

    def __init__(self, runtime: ServiceRuntime, logic: IncidentLogic, source: str) -> None:
        self._runtime = runtime
        self.logic = logic
        self.source = source
        self._tracer: Tracer = runtime.tracer
        self.states: IncidentStates | None = None
        self._deciding = asyncio.Lock()
        self._unapplied: deque[_Unapplied] = deque()
        self._wake = asyncio.Event()
        self._applying: _Unapplied | None = None
        self._applier: asyncio.Task | None = None
        metrics = runtime.metrics
        self._transitions = PromCounter(
            "gpumedic_incidents", "Incident transitions this detector published, by kind and what happened: "
            "opened, resolved (by resolution), escalated.", ["kind", "transition", "resolution"], registry=metrics.registry,
        )
        metrics.gauge("gpumedic_incidents_open", "Incidents open now, by kind and phase.", ["kind", "phase"], self._open_counts)

    def _open_counts(self) -> list[tuple[tuple[str, str], float]]:
        # Read from the metrics server's thread: list() copies the dict's values at once.
        counts = Counter((s.kind.value, s.phase) for s in list(self.logic.book.incidents.values()))
        return [(key, n) for key, n in sorted(counts.items())]

    def attach(self, actions_durable: str) -> None:
        """Wire the detector into its service: its open incidents taken back from the state bucket
        at start, the silences replayed and followed, the remediator's results consumed, the tick."""
        runtime = self._runtime

        async def _restore() -> None:
            # Provisioned with the streams (gpumedic provision); only opened here. Each read at start
            # gives up after GET_TIMEOUT_S: a server bouncing never answers, and the start tries
            # again sooner than the client's 5 s would (chaos: leader-health back in 16 s, not 10).
            nc = runtime.broker.connection
            reader = await IncidentStates.open(nc.jetstream(timeout=GET_TIMEOUT_S))
            await self.resume(await IncidentStates.open(nc.jetstream()), await reader.load_all(detector=self.source))

        runtime.on_startup(_restore)
        runtime.replay((SilenceAdded, SilenceRemoved), self.on_silence)
        runtime.consume(actions_durable, self.on_action_completed)
        runtime.background(self.tick)

    async def restore(self, states: IncidentStates) -> None:
        """Take back the open incidents of an earlier run before consuming anything."""
        await self.resume(states, await states.load_all(detector=self.source))

    async def resume(self, states: IncidentStates, opened: list[IncidentState]) -> None:
        """Go on with `opened`, the open incidents of an earlier run, read from `states`."""
        self.states = states
        restored = []
        for state in opened:
            if state.outbox:  # saved, then this detector stopped before publishing all of it
                for item in state.outbox:
                    await self._send(EVENTS_BY_NAME[item.event].model_validate_json(item.body))
                log.info("%s: published %s of incident %s, which an earlier run saved but did not publish",
                         self.source, ", ".join(i.event for i in state.outbox), state.incident_id)
                state = state.model_copy(update={"outbox": ()})
                await states.save(state)
            restored.append(state)
        self.logic.book.adopt(restored)
        if self.logic.book.incidents:
            log.info("%s resumed %d open incident(s)", self.source, len(self.logic.book.incidents))

    async def decide(self, decision: Callable[[datetime], list[Transition]], *, wait: bool = True) -> None:
        """Run `decision` (the logic's answer to one input, at the current time), take its
        transitions into the book and queue them to be applied; with `wait`, return once they are
        (raising what failed them). A sample need not wait: the next one decides again."""
        async with self._deciding:
            if self._applier is None or self._applier.done():
                self._applier = asyncio.create_task(self._apply_all(), name=f"{self.source}-apply")
            while len(self._unapplied) >= MAX_UNAPPLIED:
                await asyncio.sleep(0.05)
            now = _now()
            queued = [self._commit(t, now) for t in decision(now)]
            self._unapplied.extend(queued)
            self._wake.set()
        if wait and queued:
            await asyncio.gather(*(item.done for item in queued))

    async def settled(self) -> None:
        """Return once everything decided so far is applied (or failed)."""
        pending = [item.done for item in (self._applying, *self._unapplied) if item is not None]
        await asyncio.gather(*pending, return_exceptions=True)

    def _commit(self, t: Transition, now: datetime) -> _Unapplied:
        detect = None
        if t.spans and t.spans[0].name == "detect" and t.after is not None:
            # A new trace per incident, whatever consumed the input; its id goes into the state now,
            # so a later transition of the incident (decided before this one is applied) continues it.
            detect = self._tracer.start_span("detect", context=Context(), attributes=_attrs(t.after))
            with use_span(detect, end_on_exit=False):
                t = dataclasses.replace(t, after=t.after.model_copy(update={"traceparent": inject_trace({}).get("traceparent")}))
        self.logic.book.commit(t, now)
        return _Unapplied(t, detect, asyncio.get_running_loop().create_future())

    async def _apply_all(self) -> None:
        """The one applier: each transition in the order decided."""
        while True:
            if not self._unapplied:
                self._wake.clear()
                await self._wake.wait()
                continue
            item = self._applying = self._unapplied.popleft()
            try:
                await self._apply_one(item)
            except Exception as exc:  # noqa: BLE001 - said to whoever waits, or logged
                self._take_back(item, exc)
            else:
                item.done.set_result(None)
            finally:
                self._applying = None

    def _take_back(self, failed: _Unapplied, exc: Exception) -> None:
        """A transition that failed for good leaves the book as it was before it, and so do the
        later ones of the same incident (each decided from it)."""
        fingerprint = failed.transition.state.fingerprint
        later = [item for item in self._unapplied if item.transition.state.fingerprint == fingerprint]
        for item in later:
            self._unapplied.remove(item)
        book = self.logic.book
        book.commit(Transition(book.get(fingerprint), failed.transition.before))
        reason = nats_reason(exc) if isinstance(exc, BUS_AWAY) else f"{type(exc).__name__}: {exc}"
        for item in (failed, *later):
            if item.detect is not None and item is not failed:  # the failed one's ended as it failed
                item.detect.set_status(Status(StatusCode.ERROR, reason))
                item.detect.end()
            item.done.set_exception(exc)
            item.done.exception()  # retrieved here: whoever waits is told, nobody else must be
        log.warning("%s: incident %s on %s not applied (%s)%s; the next finding decides again", self.source,
                    failed.transition.state.incident_id, _where(failed.transition.state), reason,
                    f", nor {len(later)} later change(s) of it" if later else "")

    async def on_action_completed(self, event: ActionCompleted, delivery: Delivery) -> None:
        await self.decide(lambda now: self.logic.on_action_completed(event, now, traceparent_of(delivery.headers)))

    async def on_silence(self, event: SilenceAdded | SilenceRemoved) -> None:
        self.logic.book.on_silence(event)
        if isinstance(event, SilenceAdded):
            log.info("silence %s until %s: %s", event.silence_id, event.ends_at.isoformat(timespec="seconds"), event.reason)

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_EVERY_S)
            try:
                await self.decide(self.logic.on_tick)
            except BUS_AWAY as exc:  # the bus is reconnecting or electing: one line, no traceback
                log.warning("applying due deadlines failed (%s); retrying next tick", nats_reason(exc))
            except Exception:
                log.exception("applying due deadlines failed; retrying next tick")

    async def _apply_one(self, item: _Unapplied) -> None:
        t = item.transition
        state = t.after
        persisted = False
        events = [e for span in t.spans for e in span.events]
        if events and state is not None:  # saved with the incident until all are published
            state = state.model_copy(update={"outbox": tuple(Unpublished(event=type(e).__name__, body=e.to_json().decode()) for e in events)})
        with contextlib.ExitStack() as spans:
            for i, span in enumerate(t.spans):
                incident = state or t.state
                if i == 0 and item.detect is not None:
                    spans.enter_context(use_span(item.detect, end_on_exit=True))
                else:
                    # the first continues the incident's trace; each later one nests in the step before
                    parent = trace_context({"traceparent": incident.traceparent} if incident.traceparent else {}) if i == 0 else None
                    attributes = _attrs(incident)
                    if span.name == "decide" and incident.pending_action is not None:
                        attributes |= {ACTION_ID: str(incident.pending_action.action_id), "gpumedic.attempt": incident.attempt}
                    spans.enter_context(self._tracer.start_as_current_span(span.name, context=parent, attributes=attributes))
                if not persisted:
                    await self._persist(t.before, state)
                    persisted = True
                for event in span.events:
                    await self._publish(event, incident)
            if not persisted:
                await self._persist(t.before, state)
        if state is not None and state.outbox:
            await self._persist(t.before, state.model_copy(update={"outbox": ()}))

    async def _persist(self, before: IncidentState | None, after: IncidentState | None) -> None:
        states = self._require_states()
        if after is not None:
            await ride_out(lambda: states.save(after), PUBLISH_PATIENCE_S)
        elif before is not None:
            await ride_out(lambda: states.delete(before), PUBLISH_PATIENCE_S)

    async def _send(self, event: Event) -> None:
        # Patient: a transition that stopped between two of its events (an incident announced,
        # its action not yet asked for) would be decided afresh by the next finding, as a second
        # incident. A stream electing its leader answers again within seconds. The de-duplication
        # id is the event id, kept in the outbox, so a retry or the outbox published again on resume
        # is stored once. Not the action id: that can be predicted, and a forgery sent first under
        # it would have the stream drop the real request as its duplicate.
        await publish_event(self._runtime.broker, event, patience_s=PUBLISH_PATIENCE_S)

    async def _publish(self, event: Event, incident: IncidentState) -> None:
        await self._send(event)  # an ActionRequested inside `decide`: the remediator's `act` becomes its child
        if isinstance(event, IncidentOpened | IncidentResolved | IncidentEscalated):
            transition = {IncidentOpened: "opened", IncidentResolved: "resolved", IncidentEscalated: "escalated"}[type(event)]
            self._transitions.labels(event.kind.value, transition, getattr(event, "resolution", "") or "").inc()
        if isinstance(event, IncidentOpened):
            log.warning("incident %s opened: %s on %s: %s", event.incident_id, event.kind.value, _where(incident), event.summary)
        elif isinstance(event, IncidentResolved):
            log.info("incident %s on %s resolved (%s)", event.incident_id, incident.fingerprint, event.resolution)
        elif isinstance(event, IncidentEscalated):
            log.warning("incident %s on %s escalated: %s", event.incident_id, incident.fingerprint, event.reason)

    def _require_states(self) -> IncidentStates:
        if self.states is None:
            raise RuntimeError("the incident state bucket is not open yet")
        return self.states


def _attrs(incident: IncidentState) -> dict[str, str | int]:
    attrs: dict[str, str | int] = {INCIDENT_ID: str(incident.incident_id), NODE_ID: incident.node_id, "gpumedic.kind": incident.kind.value}
    if incident.gpu_index is not None:
        attrs["gpumedic.gpu_index"] = incident.gpu_index
    return attrs


def _where(incident: IncidentState) -> str:
    return incident.node_id if incident.gpu_index is None else f"{incident.node_id} GPU {incident.gpu_index}"
