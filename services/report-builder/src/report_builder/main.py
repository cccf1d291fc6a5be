"""report-builder's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from gpumedic_bus import ServiceRuntime
from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    SilenceAdded,
    SilenceRemoved,
)
from gpumedic_store import create_engine, session_factory
from report_builder.handlers import ReportHandlers
from report_builder.settings import Settings

SERVICE = "report-builder"
RECORDED = (IncidentOpened, IncidentUpdated, IncidentResolved, IncidentEscalated, ActionRequested, ActionCompleted)


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    engine = create_engine(settings.store.url)
    handlers = ReportHandlers(session_factory(engine), runtime.tracer)
    for event_type in RECORDED:
        runtime.consume(f"report-builder-{event_type.__name__}", handlers.on_incident_or_action)
    runtime.consume("report-builder-spans", handlers.on_spans)
    for event_type in (SilenceAdded, SilenceRemoved):
        runtime.consume(f"report-builder-{event_type.__name__}", handlers.on_silence)
    app = runtime.app()
    app.after_shutdown(engine.dispose)
    return app


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(create_app().run())
