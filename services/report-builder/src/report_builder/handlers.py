"""Adapters from the bus to the incident store: every incident and action event becomes a row
of its incident's timeline (inside a `record` span of the incident's trace), an escalation also
queues its notifications (report_builder.notify), and spans carried over the bus become rows the
CLI can draw a trace from."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime, timedelta

from opentelemetry import trace
from prometheus_client import CollectorRegistry, Counter
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_bus import Delivery
from gpumedic_bus.topology import NODE_USER_PREFIX
from gpumedic_events import (
    CapacityEvaluated,
    ClusterChecked,
    Event,
    IncidentCosted,
    IncidentEscalated,
    IncidentMarked,
    IncidentResolved,
    SilenceAdded,
    SilenceRemoved,
    SpansExported,
)
from gpumedic_telemetry import INCIDENT_ID, NODE_ID
from report_builder import repository
from report_builder.pricing import Pricing

log = logging.getLogger(__name__)

COSTED = uuid.UUID("5b3f9d2e-6c1a-4e8b-9f7d-2a4c6e8b0d13")
"""Namespace of IncidentCosted's event ids: one per incident and end, so a redelivery is one message."""


class ReportHandlers:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        tracer: trace.Tracer,
        *,
        notify: Sequence[str] = (),
        notify_wait_s: float = 0.0,
        changed: Callable[[], None] | None = None,
        pricing: Pricing | None = None,
        publish: Callable[[Event], Awaitable[None]] | None = None,
        registry: CollectorRegistry | None = None,
        incident_changed: Callable[[], None] | None = None,
    ) -> None:
        """`pricing` prices each incident's lost GPU time (on its row, and as IncidentCosted through
        `publish` once it closes); `incident_changed` is told after each incident or action event
        is stored (Alertmanager hears of it at once)."""
        self._sessions = sessions
        self._tracer = tracer
        self._notify = tuple(notify)
        self._notify_wait = timedelta(seconds=notify_wait_s)
        self._changed = changed or (lambda: None)
        """Told after each commit (the console's live pages)."""
        self._incident_changed = incident_changed or (lambda: None)
        self._pricing = pricing or Pricing()
        self._publish = publish
        registry = registry or CollectorRegistry()
        self._gpu_hours = Counter("gpumedic_incident_gpu_hours_lost", "GPU-hours kept from work by incidents that closed, "
                                  "by kind and provider (the idle time before they opened included).", ["kind", "provider"], registry=registry)
        self._dollars = Counter("gpumedic_incident_cost_dollars", "What incidents that closed cost, by kind and provider "
                                "(those with a known price).", ["kind", "provider"], registry=registry)

    async def on_incident_or_action(self, event, delivery: Delivery) -> None:
        attrs = {INCIDENT_ID: str(event.incident_id), NODE_ID: event.node_id, "gpumedic.event": type(event).__name__}
        with self._tracer.start_as_current_span("record", context=delivery.trace_context, attributes=attrs) as span:
            trace_id = format(span.get_span_context().trace_id, "032x") if delivery.headers.get("traceparent") else None
            async with self._sessions() as session:
                recorded = await repository.record_event(session, event=event, subject=delivery.subject, trace_id=trace_id)
                incident = await repository.update_cost(
                    session, incident_id=str(event.incident_id), price=self._pricing.price(event.node_id), now=datetime.now(UTC),
                )
                if recorded and isinstance(event, IncidentEscalated):
                    # In the same transaction: an escalation is never kept without its notifications.
                    now = datetime.now(UTC)
                    await repository.queue_notifications(
                        session, incident_id=str(event.incident_id), reason=event.reason, channels=self._notify,
                        now=now, due_at=now + self._notify_wait,
                    )
                elif recorded and isinstance(event, IncidentResolved):
                    # Whoever was told of its escalation is told it is over (the notifier sends it
                    # only where the escalation itself was delivered).
                    channels = await repository.escalation_channels(session, incident_id=str(event.incident_id))
                    now = datetime.now(UTC)
                    await repository.queue_notifications(
                        session, incident_id=str(event.incident_id), reason=event.summary or event.resolution, channels=channels,
                        now=now, due_at=now, event="resolved",
                    )
                await session.commit()
            self._changed()
            self._incident_changed()
            if not recorded:
                log.debug("%s %s was already recorded", type(event).__name__, event.event_id)
            if isinstance(event, IncidentResolved | IncidentEscalated) and incident is not None and incident.closed_at == event.occurred_at:
                await self._costed(incident, counted=recorded)

    async def _costed(self, incident, *, counted: bool) -> None:
        """Say what a closed incident cost. A redelivered end is said again (its id is the same, so
        the bus keeps one) but counted once."""
        cost = incident.cost or {}
        provider = cost.get("provider") or ""
        if counted:
            self._gpu_hours.labels(incident.kind, provider).inc(cost.get("gpu_hours") or 0.0)
            if cost.get("usd") is not None:
                self._dollars.labels(incident.kind, provider).inc(cost["usd"])
        if self._publish is None:
            return
        await self._publish(IncidentCosted(
            event_id=uuid.uuid5(COSTED, f"{incident.id}/{incident.closed_at.isoformat()}"), source="report-builder",
            incident_id=incident.id, node_id=incident.node_id, kind=incident.kind, gpu_index=incident.gpu_index,
            opened_at=incident.opened_at, closed_at=incident.closed_at, gpu_hours=cost.get("gpu_hours") or 0.0, usd=cost.get("usd"),
            price_per_gpu_hour=cost.get("price_per_gpu_hour"), price_from=(cost.get("price_from") or "")[:200],
            provider=(cost.get("provider") or None), what=(cost.get("what") or "")[:1000],
        ))

    async def on_silence(self, event: SilenceAdded | SilenceRemoved, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_silence(session, event=event)
            await session.commit()
        self._changed()

    async def on_marked(self, event: IncidentMarked, delivery: Delivery) -> None:
        """An operator's mark from the CLI (the console keeps its own directly)."""
        async with self._sessions() as session:
            await repository.mark(
                session, incident_id=str(event.incident_id), verdict=event.verdict, reason=event.reason, by=event.marked_by,
                now=event.occurred_at,
            )
            await session.commit()
        self._changed()
        if event.verdict == "acknowledged":
            self._incident_changed()  # Alertmanager shows who looks at it

    async def on_cluster_checked(self, event: ClusterChecked, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_cluster_check(session, event=event)
            await session.commit()
        self._changed()

    async def on_capacity_evaluated(self, event: CapacityEvaluated, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_capacity_check(session, event=event)
            await session.commit()
        self._changed()

    async def on_spans(self, event: SpansExported, delivery: Delivery) -> None:
        spans = event.spans
        if event.service.startswith(NODE_USER_PREFIX):  # a node speaks for its own sampler only
            spans = tuple(span for span in spans if span.service == "node-sampler")
        async with self._sessions() as session:
            await repository.record_spans(session, spans=spans)
            await session.commit()
        self._changed()
