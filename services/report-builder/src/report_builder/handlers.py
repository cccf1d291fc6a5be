"""Adapters from the bus to the incident store: every incident and action event becomes a row
of its incident's timeline (inside a `record` span of the incident's trace), and spans carried
over the bus become rows the CLI can draw a trace from."""

from __future__ import annotations

import logging

from opentelemetry import trace
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_bus import Delivery
from gpumedic_events import SilenceAdded, SilenceRemoved, SpansExported
from gpumedic_telemetry import INCIDENT_ID, NODE_ID
from report_builder import repository

log = logging.getLogger(__name__)


class ReportHandlers:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], tracer: trace.Tracer) -> None:
        self._sessions = sessions
        self._tracer = tracer

    async def on_incident_or_action(self, event, delivery: Delivery) -> None:
        attrs = {INCIDENT_ID: str(event.incident_id), NODE_ID: event.node_id, "gpumedic.event": type(event).__name__}
        with self._tracer.start_as_current_span("record", context=delivery.trace_context, attributes=attrs) as span:
            trace_id = format(span.get_span_context().trace_id, "032x") if delivery.headers.get("traceparent") else None
            async with self._sessions() as session:
                recorded = await repository.record_event(session, event=event, subject=delivery.subject, trace_id=trace_id)
                await session.commit()
            if not recorded:
                log.debug("%s %s was already recorded", type(event).__name__, event.event_id)

    async def on_silence(self, event: SilenceAdded | SilenceRemoved, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_silence(session, event=event)
            await session.commit()

    async def on_spans(self, event: SpansExported, delivery: Delivery) -> None:
        async with self._sessions() as session:
            await repository.record_spans(session, spans=event.spans)
            await session.commit()
