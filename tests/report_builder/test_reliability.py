"""The reliability report from what report-builder keeps: two owned nodes and a provider's machine
that two rented workers ran on one after the other. Each figure is checked against the arithmetic
of what was fed in: GPU-days from the nodes' day rows (made by the history recorder from real
minute folds), incidents per 100 GPU-days, time to detect and to repair, availability from the
GPU time lost, goodput from the busy GPU-minutes; the second rental's incident counts for the same
machine. Then `gpumedic report reliability` writes it as JSON, Markdown and an HTML file that
Chromium renders."""

from __future__ import annotations

import asyncio
import json
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpumedic_bus import Delivery
from gpumedic_events import GpuSample, IncidentOpened, IncidentResolved, NodeSampled
from gpumedic_events.base import json_examples
from gpumedic_store import create_engine, session_factory, upgrade
from gpumedic_store.reliability import reliability
from report_builder.handlers import ReportHandlers
from report_builder.history import HistoryRecorder
from report_builder.pricing import Pricing
from tests.fixtures.real import needs

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
DAY = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0) - timedelta(days=2)


def _event(cls, **fields):
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **fields})


def _sample(node: str, at: datetime, utils: list[int]) -> NodeSampled:
    return NodeSampled(source="test", occurred_at=at, node_id=node, interval_s=60.0,
                       gpus=tuple(GpuSample(index=i, utilization_gpu_pct=u) for i, u in enumerate(utils)))


async def _seed(tmp_path: Path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {price_per_gpu_hour: 2.0, gpus: 2, labels: {provider: acme}}\n"
                         "nodes:\n  own-1: {host: 10.0.0.1}\n  own-2: {host: 10.0.0.2}\n")
    pricing = Pricing(inventory)
    clock = {"now": DAY}
    recorder = HistoryRecorder(sessions, retention=timedelta(days=3), now=lambda: clock["now"], provider_of=lambda n: pricing.price(n).provider)
    # 600 minutes each: own-1 busy on both GPUs half the time, own-2 on one GPU throughout; the two
    # workers 300 minutes each on one GPU, idle
    for minute in range(600):
        at = DAY + timedelta(minutes=minute)
        await recorder.on_sample(_sample("own-1", at, [90, 90] if minute < 300 else [0, 0]))
        await recorder.on_sample(_sample("own-2", at, [50, 0]))
        await recorder.on_sample(_sample("pod-a" if minute < 300 else "pod-b", at, [0]))
        if minute % 60 == 59:
            clock["now"] = at + timedelta(minutes=1, seconds=20)
            await recorder.flush()
    handlers = ReportHandlers(sessions, _tracer(), pricing=pricing)
    incidents = (
        # node, kind, opened (min after DAY), lasted (min), evidence
        ("own-1", "zombie_job", 100, 30, {"idle_seconds": 600.0}),
        ("own-1", "zombie_job", 400, 60, {"idle_seconds": 1200.0}),
        ("pod-a", "stuck_spawning", 10, 20, {"gpus": 1, "price_per_h": 3.0, "billed_s": 300, "provider": "runpod", "host_id": "machine-7"}),
        ("pod-b", "stale_heartbeat", 350, 10, {"gpus": 1, "price_per_h": 3.0, "heartbeat_age_s": 120, "provider": "runpod", "host_id": "machine-7"}),
    )
    for node, kind, opened, lasted, evidence in incidents:
        incident = str(uuid.uuid4())
        start = DAY + timedelta(minutes=opened)
        for event in (
            _event(IncidentOpened, incident_id=incident, node_id=node, kind=kind, gpu_index=0 if kind == "zombie_job" else None,
                   occurred_at=start.isoformat(), evidence=evidence, severity="warning"),
            _event(IncidentResolved, incident_id=incident, node_id=node, kind=kind, gpu_index=0 if kind == "zombie_job" else None,
                   occurred_at=(start + timedelta(minutes=lasted)).isoformat()),
        ):
            await handlers.on_incident_or_action(event, Delivery(event.subject, {}, 1))
    await engine.dispose()
    return url


def _tracer():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider().get_tracer("test")


async def test_each_figure_is_the_arithmetic_of_what_was_kept(tmp_path):
    url = await _seed(tmp_path)
    engine = create_engine(url)
    async with session_factory(engine)() as session:
        report = await reliability(session, DAY - timedelta(hours=1), DAY + timedelta(days=1))
    await engine.dispose()
    hosts = {f.group: f for f in report.hosts}
    assert set(hosts) == {"own-1", "own-2", "machine-7"}
    own1, machine = hosts["own-1"], hosts["machine-7"]
    assert own1.gpu_minutes == 1200 and own1.gpu_days == pytest.approx(1200 / 1440)
    assert own1.incident_count == 2 and own1.per_100_gpu_days == pytest.approx(2 / (1200 / 1440) * 100)
    assert own1.mttd_s == pytest.approx(900.0) and own1.mttr_s == pytest.approx(45 * 60)
    lost = ((10 + 30) + (20 + 60)) / 60  # each zombie's GPU from when it went idle to its fix
    assert own1.lost_gpu_hours == pytest.approx(lost) and own1.availability == pytest.approx(1 - lost / 20)
    assert own1.goodput == pytest.approx(0.5) and own1.provider == "acme"
    # both rentals on one machine: their GPU-minutes and incidents are the machine's
    assert machine.nodes == {"pod-a", "pod-b"} and machine.gpu_minutes == 600 and machine.incident_count == 2
    assert machine.provider == "runpod" and machine.goodput == 0.0
    assert machine.lost_gpu_hours == pytest.approx((5 + 20) / 60 + (2 + 10) / 60)
    assert hosts["own-2"].incident_count == 0 and hosts["own-2"].goodput == pytest.approx(0.5)
    assert [f.group for f in report.hosts][0] in ("own-1", "machine-7")  # the least reliable first
    providers = {f.group: f for f in report.providers}
    assert providers["acme"].gpu_minutes == 2400 and providers["runpod"].incident_count == 2
    assert report.fleet.incident_count == 4 and report.fleet.gpu_minutes == 3000


@needs(Path(CHROMIUM).exists(), "Debian's chromium")
async def test_gpumedic_report_reliability_writes_json_markdown_and_html_a_browser_renders(tmp_path, capsys):
    from playwright.async_api import async_playwright

    from gpumedic.cli import main

    url = await _seed(tmp_path)

    async def gpumedic(*argv: str) -> int:
        return await asyncio.to_thread(main, list(argv))

    assert await gpumedic("report", "reliability", "--store", url, "--since", "7d", "--format", "json") == 0
    doc = json.loads(capsys.readouterr().out)
    assert {h["group"] for h in doc["hosts"]} == {"own-1", "own-2", "machine-7"} and doc["fleet"]["incidents"] == 4
    assert await gpumedic("report", "reliability", "--store", url) == 0
    markdown = capsys.readouterr().out
    assert "| machine-7 | runpod | 0.42 | 2 |" in markdown and "**own-1**: zombie_job 2" in markdown
    page = tmp_path / "reliability.html"
    assert await gpumedic("report", "reliability", "--store", url, "--format", "html", "-o", str(page)) == 0
    assert "3 host(s), 2 provider(s)" in capsys.readouterr().out
    assert await gpumedic("report", "reliability", "--store", url, "--since", "forever") == 2
    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        tab = await browser.new_page(viewport={"width": 1280, "height": 900})
        await tab.goto(page.as_uri())
        hosts = await tab.locator("table").nth(1).locator("tbody tr td:first-child").all_inner_texts()
        shots = Path(__file__).resolve().parents[2] / "build" / "console-screenshots"
        shots.mkdir(parents=True, exist_ok=True)
        await tab.screenshot(path=shots / "reliability-report.png", full_page=True)
        await browser.close()
    assert set(hosts) == {"own-1", "own-2", "machine-7"}
