"""Each service's Prometheus endpoint, scraped as Prometheus would, over the thin path: the text
parses with the Prometheus client's own parser, and the figures say what happened (samples
handled, a message refused, the zombie opened and fixed, the kill succeeded, the breaker shut)."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

import nats
from prometheus_client.parser import text_string_to_metric_families

from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.test_thin_path import detector, remediator_settings, wait_for_incident

ROOT = Path(__file__).resolve().parents[2]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of the endpoint: (name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as answer:
        assert answer.headers["Content-Type"].startswith("text/plain")
        text = answer.read().decode()
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def value(figures, name: str, **labels: str) -> float:
    return figures.get((name, tuple(sorted(labels.items()))), 0.0)


async def test_the_detector_and_the_remediator_serve_what_they_did_as_prometheus_text(
    nats_settings, store_url, fleet, sampling, apps, monkeypatch,
):
    monkeypatch.setenv("GPUMEDIC_METRICS_PORT", "0")  # a free port each
    monkeypatch.setenv("GPUMEDIC_METRICS_ADDR", "127.0.0.1")
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, trace_to_bus=True)))
    remediator = await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    zombie_detector = await apps.start(detector(nats_settings))
    nc = await nats.connect(nats_settings.url)
    await nc.jetstream().publish("gpumedic.v1.node.sampled.sim-node-01", b"{not json")
    await nc.close()

    fleet.node("sim-node-02").inject_zombie(0)
    await wait_for_incident(store_url, "resolved")
    await asyncio.sleep(0.5)

    seen = scrape(zombie_detector.runtime.metrics.port)
    assert value(seen, "gpumedic_service_info", service="zombie-detector") == 1
    assert value(seen, "gpumedic_events_handled_total", event="NodeSampled", outcome="ok") >= 10
    assert value(seen, "gpumedic_events_handled_total", event="NodeSampled", outcome="invalid") == 1
    assert value(seen, "gpumedic_event_handling_seconds_count", event="NodeSampled") >= 10
    assert value(seen, "gpumedic_incidents_total", kind="zombie_job", transition="opened", resolution="") == 1
    assert value(seen, "gpumedic_incidents_total", kind="zombie_job", transition="resolved", resolution="fixed") == 1
    assert value(seen, "gpumedic_events_handled_total", event="ActionCompleted", outcome="ok") == 1
    assert value(seen, "process_resident_memory_bytes") > 0

    acted = scrape(remediator.runtime.metrics.port)
    assert value(acted, "gpumedic_service_info", service="remediator") == 1
    assert value(acted, "gpumedic_actions_total", operation="kill_gpu_processes", outcome="succeeded") == 1
    assert value(acted, "gpumedic_events_handled_total", event="ActionRequested", outcome="ok") == 1
    assert value(acted, "gpumedic_breaker_open") == 0 and value(acted, "gpumedic_remediation_paused") == 0
    assert value(acted, "gpumedic_breaker_nodes_in_window") == 0  # the request itself is not counted

    # The shipped dashboard asks only for figures the services serve.
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "gpumedic.json").read_text())
    asked = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"\b(?:gpumedic|process)_\w+", t["expr"])}
    served = {name for name, _ in [*seen, *acted]} | {"gpumedic_incidents_open"}  # open incidents: the next test
    assert asked and asked <= served, asked - served


async def test_a_pause_shows_on_the_remediators_metrics(nats_settings, store_url, fleet, apps, monkeypatch):
    """`gpumedic pause` opens the breaker on purpose: a dashboard tells it from a trip."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, create_engine, session_factory

    monkeypatch.setenv("GPUMEDIC_METRICS_PORT", "0")
    monkeypatch.setenv("GPUMEDIC_METRICS_ADDR", "127.0.0.1")
    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        await breaker.pause(session=session, reason="driver upgrade to 570", by="alice", now=datetime.now(UTC))
        await session.commit()
    await engine.dispose()
    remediator = await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    for _ in range(50):
        acted = scrape(remediator.runtime.metrics.port)
        if value(acted, "gpumedic_remediation_paused") == 1:
            break
        await asyncio.sleep(0.1)
    assert value(acted, "gpumedic_remediation_paused") == 1 and value(acted, "gpumedic_breaker_open") == 1


async def test_open_incidents_are_a_gauge_by_kind_and_phase(nats_settings, store_url, fleet, sampling, apps, monkeypatch):
    """With no remediator the zombie's kill is never answered: the incident stays open, acting."""
    monkeypatch.setenv("GPUMEDIC_METRICS_PORT", "0")
    zombie_detector = await apps.start(detector(nats_settings))
    fleet.node("sim-node-02").inject_zombie(0)
    for _ in range(120):
        seen = scrape(zombie_detector.runtime.metrics.port)
        if value(seen, "gpumedic_incidents_open", kind="zombie_job", phase="acting") == 1:
            break
        await asyncio.sleep(0.25)
    assert value(seen, "gpumedic_incidents_open", kind="zombie_job", phase="acting") == 1, seen
