"""report-builder's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import functools
import logging
from datetime import timedelta

from faststream import FastStream

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_bus.service import run_service
from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    NodeSampled,
    ServiceHeartbeat,
    SilenceAdded,
    SilenceRemoved,
)
from gpumedic_events.views import SampleFigures
from gpumedic_store import StoreUnavailable, create_engine, session_factory
from report_builder.alertmanager import AlertmanagerPush
from report_builder.console import Console, ConsoleConfig
from report_builder.handlers import ReportHandlers
from report_builder.history import HistoryRecorder, PrometheusHistory
from report_builder.notify import Notifier
from report_builder.pricing import Pricing
from report_builder.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "report-builder"
RECORDED = (IncidentOpened, IncidentUpdated, IncidentResolved, IncidentEscalated, ActionRequested, ActionCompleted)


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    engine = create_engine(settings.store.url)
    sessions = session_factory(engine)
    channels = settings.channels()
    push = None
    if alertmanagers := settings.alertmanagers():
        push = AlertmanagerPush(sessions, alertmanagers, console_url=settings.console_url, every_s=settings.alertmanager_every_s)
        runtime.background(push.loop, one_instance="alertmanager")
        log.info("report-builder: incidents go to Alertmanager at %s", ", ".join(alertmanagers))
    console = None
    if settings.console_port is not None:
        config = ConsoleConfig(
            host=settings.console_addr, port=settings.console_port, token=settings.console_token(), jaeger_url=settings.jaeger_url,
            public_url=settings.console_url, trusted_proxies=settings.console_trusted_proxies,
            history_retention_h=settings.history_retention_h,
        )
        prometheus = None
        if settings.history_prometheus_url:
            prometheus = PrometheusHistory(settings.history_prometheus_url, node_label=settings.history_prometheus_node_label)
        console = Console(
            sessions, config, publish=lambda event: publish_event(runtime.broker, event),
            latest=lambda node: runtime.latest(NodeSampled, node), prometheus=prometheus,
            incident_changed=push.poke if push else None,
            ask=lambda subject, body, timeout_s: _ask(runtime, subject, body, timeout_s),
        )
    pricing = Pricing(settings.inventory)
    handlers = ReportHandlers(
        sessions, runtime.tracer, notify=[c.name for c in channels], notify_wait_s=settings.notify_wait_s,
        changed=console.changes.bump if console else None, pricing=pricing,
        publish=lambda event: publish_event(runtime.broker, event), registry=runtime.metrics.registry,
        incident_changed=push.poke if push else None,
    )
    # While the store is down its events wait in JetStream, none is dead-lettered for it.
    stored = functools.partial(runtime.consume, waits_on=(StoreUnavailable,))
    for event_type in RECORDED:
        stored(f"report-builder-{event_type.__name__}", handlers.on_incident_or_action)
    stored("report-builder-spans", handlers.on_spans)
    stored("report-builder-ClusterChecked", handlers.on_cluster_checked)
    stored("report-builder-CapacityEvaluated", handlers.on_capacity_evaluated)
    stored("report-builder-IncidentMarked", handlers.on_marked)
    for event_type in (SilenceAdded, SilenceRemoved):
        stored(f"report-builder-{event_type.__name__}", handlers.on_silence)
    if channels:
        notifier = Notifier(
            sessions, channels, console_url=settings.console_url, give_up_s=settings.notify_give_up_s,
            min_severity=settings.notify_min_severity,
        )
        runtime.background(notifier.loop)
        log.info("report-builder: escalations go to %s", ", ".join(f"{c.name} ({c.host})" for c in channels))
    recorder = None
    if settings.history_retention_h > 0:
        recorder = HistoryRecorder(
            sessions, retention=timedelta(hours=settings.history_retention_h), provider_of=lambda node: pricing.price(node).provider,
        )
        runtime.background(recorder.loop, one_instance="history")
    readers = [r.on_sample for r in (console, recorder, pricing) if r is not None]

    async def on_sample(sample: NodeSampled) -> None:
        for read in readers:
            await read(sample)

    runtime.follow(NodeSampled, on_sample, view=SampleFigures)  # only what the readers keep is decoded
    if console is not None:
        runtime.follow(ServiceHeartbeat, console.on_heartbeat)
        runtime.on_startup(console.start)
    app = runtime.app()
    app.console = console  # the embedded stack and tests read its URL here
    if console is not None:
        app.after_shutdown(console.stop)
    app.after_shutdown(engine.dispose)
    return app


async def _ask(runtime: ServiceRuntime, subject: str, body: bytes, timeout_s: float) -> bytes:
    """One request to the remediator over the service's own connection (its inbox, its rights:
    `topology.REQUESTS` lets report-builder ask for a rollout, for the console's fleet operations)."""
    return (await runtime.broker.connection.request(subject, body, timeout=timeout_s)).data


def run() -> None:
    """Console script `gpumedic-report-builder`; a missing token file stops the start, with its name."""
    run_service(SERVICE, Settings, create_app)
