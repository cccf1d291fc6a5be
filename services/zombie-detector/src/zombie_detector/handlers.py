"""Adapters between the bus and the detector's pure logic: validate, decide, publish.

Spans are named for the incident's business steps: `detect` starts the incident's trace,
`decide` requests an action, `verify` follows the next samples to resolution or escalation.
The trace context rides the NATS headers to the remediator and back.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from opentelemetry.context import Context
from opentelemetry.trace import Tracer

from gpumedic_bus import Delivery, ServiceRuntime, inject_trace, publish_event, trace_context
from gpumedic_bus.tracing import traceparent_of
from gpumedic_events import ActionCompleted, ActionRequested, NodeSampled
from gpumedic_incidents import IncidentState, IncidentStates
from gpumedic_telemetry import ACTION_ID, INCIDENT_ID, NODE_ID
from zombie_detector.logic import SOURCE, Effect, Escalated, Followed, Opened, Resolved, Retried, ZombieDetector

log = logging.getLogger(__name__)

TICK_EVERY_S = 1.0


def _now() -> datetime:
    return datetime.now(UTC)


class DetectorHandlers:
    def __init__(self, runtime: ServiceRuntime, detector: ZombieDetector) -> None:
        self._runtime = runtime
        self._detector = detector
        self._tracer: Tracer = runtime.tracer
        self.states: IncidentStates | None = None

    async def restore(self, states: IncidentStates) -> None:
        """Take back the open incidents of an earlier run before consuming anything."""
        self.states = states
        for incident in await states.load_all(detector=SOURCE):
            self._detector.adopt(incident)
        if self._detector.incidents:
            log.info("resumed %d open incident(s)", len(self._detector.incidents))

    async def on_sample(self, sample: NodeSampled) -> None:
        effects = self._detector.on_sample(sample, _now())
        if effects:
            await self._apply(effects)

    async def on_action_completed(self, event: ActionCompleted, delivery: Delivery) -> None:
        await self._apply(self._detector.on_action_completed(event, _now(), traceparent_of(delivery.headers)))

    async def tick(self) -> None:
        while True:
            await asyncio.sleep(TICK_EVERY_S)
            try:
                await self._apply(self._detector.on_tick(_now()))
            except Exception:  # the bus may be reconnecting; the next tick tries again
                log.exception("escalating overdue incidents failed; retrying next tick")

    async def _apply(self, effects: list[Effect]) -> None:
        for effect in effects:
            match effect:
                case Opened(incident, opened, action):
                    await self._opened(incident, opened, action)
                case Retried(incident, action):
                    with self._step("verify", incident):
                        await self._save(incident)
                        await self._decide(incident, action)
                case Followed(incident):
                    await self._save(incident)
                case Resolved(incident, event):
                    with self._step("verify", incident, resolution=event.resolution):
                        try:
                            await publish_event(self._runtime.broker, event)
                        except Exception:
                            self._detector.adopt(incident)  # still open: the next sample resolves it again
                            raise
                    await self._require_states().delete(incident)
                    log.info("incident %s on %s resolved (%s)", incident.incident_id, incident.fingerprint, event.resolution)
                case Escalated(incident, event):
                    with self._step("verify", incident, escalated=True):
                        await self._save(incident)
                        await publish_event(self._runtime.broker, event)
                    log.warning("incident %s on %s escalated: %s", incident.incident_id, incident.fingerprint, event.reason)

    async def _opened(self, incident: IncidentState, opened, action: ActionRequested | None) -> None:
        # A new trace per incident: `detect` is its root, whatever consumed the sample.
        with self._tracer.start_as_current_span("detect", context=Context(), attributes=_attrs(incident)):
            incident.traceparent = inject_trace({}).get("traceparent")
            try:
                await self._save(incident)
                await publish_event(self._runtime.broker, opened)
            except Exception:
                # Undone entirely: the GPU is found again after another `idle_for_s`.
                self._detector.forget(incident)
                with contextlib.suppress(Exception):
                    await self._require_states().delete(incident)
                raise
            log.warning("incident %s opened: %s on %s", incident.incident_id, opened.summary, incident.node_id)
            if action is not None:
                await self._decide(incident, action)

    async def _decide(self, incident: IncidentState, action: ActionRequested) -> None:
        attrs = {**_attrs(incident), ACTION_ID: str(action.action_id), "gpumedic.attempt": action.attempt}
        with self._tracer.start_as_current_span("decide", attributes=attrs):
            # The action id is the de-duplication id: a retried publish is stored once.
            await publish_event(self._runtime.broker, action, msg_id=str(action.action_id))

    def _step(self, name: str, incident: IncidentState, **attributes):
        parent = trace_context({"traceparent": incident.traceparent} if incident.traceparent else {})
        return self._tracer.start_as_current_span(name, context=parent, attributes={**_attrs(incident), **attributes})

    async def _save(self, incident: IncidentState) -> None:
        # Saved before anything about it is published: the remediator's gate checks requests against it.
        await self._require_states().save(incident)

    def _require_states(self) -> IncidentStates:
        if self.states is None:
            raise RuntimeError("the incident state bucket is not open yet")
        return self.states


def _attrs(incident: IncidentState) -> dict[str, str | int]:
    return {INCIDENT_ID: str(incident.incident_id), NODE_ID: incident.node_id, "gpumedic.gpu_index": incident.gpu_index}
