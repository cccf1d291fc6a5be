"""Adapters from the bus to the incident store: every incident and action event becomes a row
of its incident's timeline (inside a `record` span of the incident's trace), an escalation also
queues its notifications (report_builder.notify), and spans carried over the bus become rows the
CLI can draw a trace from."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

from opentelemetry import trace
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_bus import Delivery
from gpumedic_events import (
    CapacityEvaluated,
    ClusterChecked,
    IncidentEscalated,
    IncidentMarked,
    SilenceAdded,
    SilenceRemoved,
    SpansExported,
)
from gpumedic_telemetry import INCIDENT_ID, NODE_ID
from report_builder import repository

log = logging.getLogger(__name__)


class ReportHandlers:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        tracer: trace.Tracer,
        *,
        notify: Sequence[str] = (),
        notify_wait_s: float = 0.0,
        changed: Callable[[], None] | None = None,
    ) -> None:
        self._sessions = sessions
        self._tracer = tracer
        self._notify = tuple(notify)
        self._notify_wait = timedelta(seconds=notify_wait_s)
        self._changed = changed or (lambda: None)
        """Told after each commit (the console's live pages)."""

    async def on_incident_or_action(self, event, delivery: Delivery) -> None:
        attrs = {INCIDENT_ID: str(event.incident_id), NODE_ID: event.node_id, "gpumedic.event": type(event).__name__}
        with self._tracer.start_as_current_span("record", context=delivery.trace_context, attributes=attrs) as span:
            trace_id = format(span.get_span_context().trace_id, "032x") if delivery.headers.get("traceparent") else None
            async with self._sessions() as session:
                recorded = await repository.record_event(session, event=event, subject=delivery.subject, trace_id=trace_id)
                if recorded and isinstance(event, IncidentEscalated):
                    # In the same transaction: an escalation is never kept without its notifications.
                    now = datetime.now(UTC)
                    await repository.queue_notifications(
                        session, incident_id=str(event.incident_id), reason=event.reason, channels=self._notify,
                        now=now, due_at=now + self._notify_wait,
                    )
                await session.commit()
            self._changed()
            if not recorded:
                log.debug("%s %s was already recorded", type(event).__name__, event.event_id)

    async def on_silence(self, event: SilenceAdded | SilenceRemoved, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_silence(session, event=event)
            await session.commit()
        self._changed()

    async def on_marked(self, event: IncidentMarked, delivery: Delivery) -> None:
        """An operator's verdict from the CLI (the console keeps its own directly)."""
        async with self._sessions() as session:
            await repository.mark_false_positive(
                session, incident_id=str(event.incident_id), reason=event.reason, by=event.marked_by, now=event.occurred_at
            )
            await session.commit()
        self._changed()

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
        async with self._sessions() as session:
            await repository.record_spans(session, spans=event.spans)
            await session.commit()
        self._changed()
