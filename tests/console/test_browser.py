"""The console in a real browser (Debian's Chromium, headless, driven by Playwright) on the embedded
stack as `make demo` runs it: the fleet page shows the demo's nodes, the incident list shows the
zombie incident live as the detector opens it (the page is never reloaded), its page shows the
timeline and draws the trace, a write without the token is refused, and an operator who logs in
with the stack's token silences a node from the ledger: the silence goes over the bus to the
detector, and comes back through report-builder's store onto the page.

Screenshots of each page are kept as test artefacts in build/console-screenshots/."""

from __future__ import annotations

import asyncio
import shutil
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from gpumedic_incidents.policy import SAMPLER_UNIT
from gpumedic_sim.runs.demo import run_demo
from tests.fixtures.real import needs

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"

LEGIBILITY = """() => {
  // The smallest text drawn (an SVG's text at the size its scaling draws it), the tallest table row,
  // and every box whose content is wider than it without a scroll cue (a shadow at its edge).
  let smallest = {px: 1e9, text: ""}, tallest = {px: 0, text: ""};
  const walker = document.createTreeWalker(document.body, NodeFilter.SHOW_TEXT);
  while (walker.nextNode()) {
    const node = walker.currentNode, el = node.parentElement;
    if (!node.textContent.trim() || !el || el.closest("title, script, style") || !el.getClientRects().length) continue;
    let px = parseFloat(getComputedStyle(el).fontSize);
    if (el instanceof SVGElement) px *= el.getScreenCTM().a;
    if (px < smallest.px) smallest = {px, text: node.textContent.trim().slice(0, 40)};
  }
  for (const row of document.querySelectorAll("tr")) {
    const h = row.getBoundingClientRect().height;
    if (h > tallest.px) tallest = {px: h, text: row.innerText.replace(/\\s+/g, " ").slice(0, 60)};
  }
  const uncued = [];
  for (const el of document.querySelectorAll("main *")) {
    const style = getComputedStyle(el);
    if (el.scrollWidth > el.clientWidth + 1 && ["auto", "scroll"].includes(style.overflowX) && !style.backgroundImage.includes("gradient"))
      uncued.push(el.tagName + "." + el.className);
  }
  return {smallest, tallest, uncued};
}"""
"""Read in the page at a phone's width: text smaller than 10 px, rows that wrap to a column of
words, or a box that hides its width with nothing to say so fail the checks below."""


def _legible(name: str, seen: dict) -> None:
    assert seen["smallest"]["px"] >= 10, f"{name}: text drawn at {seen['smallest']['px']:.1f} px: {seen['smallest']['text']!r}"
    assert seen["tallest"]["px"] <= 120, f"{name}: a table row {seen['tallest']['px']:.0f} px tall: {seen['tallest']['text']!r}"
    assert not seen["uncued"], f"{name}: wider than its box with no scroll cue: {seen['uncued']}"
SHOTS = Path(__file__).resolve().parents[2] / "build" / "console-screenshots"

pytestmark = needs(Path(CHROMIUM).exists(), "Debian's chromium (apt-get install chromium; .ci/run does)")


@pytest.mark.long
@pytest.mark.timeout(240)
async def test_the_console_follows_the_demo_live_and_an_operator_silences_from_it(tmp_path):
    from playwright.async_api import async_playwright

    SHOTS.mkdir(parents=True, exist_ok=True)
    seen: dict[str, object] = {}
    lines: list[str] = []

    async with async_playwright() as p:
        browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        page = await browser.new_page(viewport={"width": 1280, "height": 900})
        errors: list[str] = []
        page.on("pageerror", lambda exc: errors.append(str(exc)))
        page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)

        async def watch_the_list(stack) -> None:
            await page.goto(stack.console_url + "incidents?kind=zombie_job")
            await page.evaluate("window.loadedOnce = true")  # gone if the page were reloaded
            assert "no incident matches" in await page.inner_text("#incident-list")
            seen["watching"] = asyncio.create_task(page.wait_for_selector("#incident-list a[href^='/incidents/']", timeout=90_000))

        async def after_the_story(stack) -> None:
            await seen["watching"]
            seen["live"] = await page.evaluate("window.loadedOnce === true")
            await page.screenshot(path=SHOTS / "incidents.png", full_page=True)

            await page.click("#incident-list a[href^='/incidents/']")
            await page.wait_for_selector("svg.waterfall rect")
            seen["incident url"] = page.url
            seen["bars"] = await page.locator("svg.waterfall rect").count()
            seen["incident"] = await page.inner_text("main")
            seen["timeline"] = await page.inner_text("#timeline")
            await page.screenshot(path=SHOTS / "incident.png", full_page=True)

            await page.goto(stack.console_url)
            seen["fleet"] = await page.inner_text("#fleet")
            await page.screenshot(path=SHOTS / "fleet.png", full_page=True)

            await page.goto(stack.console_url + "ledger")
            refused = await page.request.post(stack.console_url + "breaker/reset", form={"csrf": "guessed"})
            seen["without token"] = (refused.status, await refused.text())
            await page.click("summary:has-text('log in to act')")
            await page.fill("input[name=name]", "alice")
            await page.fill("input[name=token]", stack.console_token_file.read_text().strip())
            await page.click("form.login button")
            await page.wait_for_selector("#silence-form")
            await page.fill("#silence-form input[name=node]", "sim-node-01")
            await page.fill("#silence-form input[name=reason]", "driver upgrade")
            await page.click("#silence-form button")
            await page.wait_for_selector("p.done")
            # SilenceAdded goes over the bus; report-builder stores it and the live part shows it.
            await page.wait_for_selector("#silences td:has-text('driver upgrade')", timeout=30_000)
            seen["silences"] = await page.inner_text("#silences")
            seen["detector"] = await _line_in(stack.logs / "zombie-detector.log", "driver upgrade", timeout_s=20)
            await page.screenshot(path=SHOTS / "ledger.png", full_page=True)
            # a fleet operation from its form, asked over the bus as report-builder's own user (a dry run: the box is ticked)
            await page.select_option("#rollout-form select[name=operation]", "restart_unit")
            await page.fill("#rollout-form input[name=unit]", SAMPLER_UNIT)
            await page.fill("#rollout-form input[name=nodes]", "sim-node-01 sim-node-02")
            await page.click("#rollout-form button")
            await page.wait_for_selector("h1:has-text('a dry run')", timeout=30_000)
            seen["rollout"] = await page.inner_text("main")
            await page.screenshot(path=SHOTS / "rollout.png", full_page=True)

            for path, name in (("cluster", "cluster"), ("capacity", "capacity")):
                await page.goto(stack.console_url + path)
                await page.screenshot(path=SHOTS / f"{name}.png", full_page=True)
            # the node page reads the node's last sample from the samples stream (report-builder's own login)
            await page.goto(stack.console_url + "nodes/sim-node-02")
            seen["node"] = await page.inner_text("#node-now")
            await page.screenshot(path=SHOTS / "node-live.png", full_page=True)
            # the same pages, full of the demo's story, on a phone
            incident_url = seen["incident url"]
            await page.set_viewport_size({"width": 390, "height": 844})
            for name, url in (("fleet-live", stack.console_url), ("incident-live", incident_url), ("node-live", stack.console_url + "nodes/sim-node-02")):
                await page.goto(url)
                seen[f"{name} at 390"] = await page.evaluate("document.documentElement.scrollWidth")
                seen[f"{name} legible"] = await page.evaluate(LEGIBILITY)
                await page.screenshot(path=SHOTS / f"{name}-390.png", full_page=True)
            await page.goto("about:blank")  # closes the live stream before the stack stops

        try:
            code = await run_demo(tmp_path / "var", nodes=2, gpus=1, duration_s=120, say=lines.append,
                                  on_ready=watch_the_list, on_done=after_the_story)
        finally:
            await browser.close()

    assert code == 0, "\n".join(lines)
    assert seen["live"], "the incident appeared only after a reload"
    assert seen["bars"] >= 5, f"the trace has {seen['bars']} spans drawn"  # detect, decide, act, verify, and the records
    assert "opened: GPU 0 at 0%" in str(seen["timeline"]) and "resolved (fixed)" in str(seen["timeline"])
    assert seen["without token"][0] == 403 and "log in" in seen["without token"][1]
    assert "silence" in str(seen["detector"]), "the silence did not reach zombie-detector"
    assert "zombie_job on sim-node-02 GPU 0" in str(seen["incident"]) and "kill_gpu_processes" in str(seen["incident"])
    assert "sim-node-01" in str(seen["fleet"]) and "sim-node-02" in str(seen["fleet"])
    assert "GPUs" in str(seen["node"]) and "Busiest processes now" in str(seen["node"]) and "No sample" not in str(seen["node"])
    assert "Containers now" in str(seen["node"]) and "64.0 GiB (9% used)" in str(seen["node"])  # docker stats, from the cgroups
    for name in ("fleet-live", "incident-live", "node-live"):
        assert seen[f"{name} at 390"] <= 390, f"{name} is {seen[f'{name} at 390']} px wide on a 390 px screen"
        _legible(name, seen[f"{name} legible"])
    assert "sim-node-01" in str(seen["silences"]) and "alice" in str(seen["silences"])
    assert "restart_unit on 2 node(s) in 2 batch(es): a dry run, nothing ran" in str(seen["rollout"])
    # sim-node-01 was silenced just before (a driver upgrade): the operation leaves it alone and says so
    assert str(seen["rollout"]).count("planned") == 1 and "silenced by alice (driver upgrade)" in str(seen["rollout"])
    assert "asked by alice" in str(seen["rollout"])
    assert errors == [], errors
    assert {p.name for p in SHOTS.glob("*.png")} >= {"capacity.png", "cluster.png", "fleet.png", "incident.png", "incidents.png", "ledger.png", "node-live.png"}


async def _line_in(path: Path, text: str, *, timeout_s: float) -> str:
    """The first line of a log that holds `text`, waiting for it up to `timeout_s`."""
    for _ in range(int(timeout_s * 10)):
        for line in path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        await asyncio.sleep(0.1)
    return ""


@pytest.mark.long
@pytest.mark.timeout(240)
async def test_charts_a_person_can_read_on_a_desk_and_on_a_phone(tmp_path):
    """A day of a 200-node sim's node, made by the real node-sampler over the simulated node; a
    container death with the hour before it; a cluster's and the pool's history. In Chromium: every
    chart has labelled axes and shows a value under the pointer, a drag zooms and offers the window
    as a link, the incident page shows host memory and the busiest processes before the death, and
    at 390 px no page is wider than the screen. Screenshots: build/console-screenshots/."""
    from playwright.async_api import async_playwright

    from gpumedic_events import CapacityEvaluated, ClusterChecked, IncidentOpened, SpanRecord
    from gpumedic_events.base import json_examples
    from gpumedic_sim.fleet.nodes import node_ids_for
    from gpumedic_sim.fleet.history import backfill
    from gpumedic_sim.machine.node import SimNode
    from gpumedic_store import create_engine, history, session_factory, upgrade
    from report_builder import repository
    from report_builder.console import Console, ConsoleConfig

    SHOTS.mkdir(parents=True, exist_ok=True)
    TRACE = "c0ffee" * 5 + "00"
    now = datetime.now(UTC)
    node_id = node_ids_for(200)[16]
    node = SimNode(node_id, 8, seed=17)
    minutes = await backfill(node, end=now, minutes=24 * 60)
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)

    def event(cls, **fields):
        return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **fields})

    died = event(IncidentOpened, incident_id=str(uuid.uuid4()), kind="container_died", node_id=node_id, severity="warning",
                 occurred_at=(now - timedelta(minutes=20)).isoformat(), summary="container selfplay-gpu3 exited 137: host out of memory")
    async with sessions() as session, session.begin():
        await history.write(session, {node_id: minutes})
        await repository.record_event(session, event=died, subject=died.subject, trace_id=TRACE)
        t0 = now - timedelta(minutes=20)
        await repository.record_spans(session, spans=[
            SpanRecord(trace_id=TRACE, span_id=f"{i + 1:016x}", parent_span_id=None if i == 0 else f"{1:016x}", name=name,
                       service=service, started_at=t0 + timedelta(milliseconds=40 * i), ended_at=t0 + timedelta(milliseconds=40 * i + 30),
                       status="OK")
            for i, (name, service) in enumerate((("detect container_died", "zombie-detector"), ("post-mortem", "zombie-detector"),
                                                 ("record IncidentOpened", "report-builder")))])
        for m in range(0, 360, 5):
            await repository.record_cluster_check(session, event=event(
                ClusterChecked, occurred_at=(now - timedelta(minutes=m)).isoformat(), leader=None if 100 < m < 130 else "peer-1"))
            await repository.record_capacity_check(session, event=event(
                CapacityEvaluated, occurred_at=(now - timedelta(minutes=m)).isoformat(), queued=m % 40, in_progress=8, cost_per_h=12.5, workers=4))

    console = Console(sessions, ConsoleConfig(port=0), publish=lambda e: asyncio.sleep(0), latest=None)
    await console.start()
    base = console.url.rstrip("/")
    pages = {
        "node-24h": f"/nodes/{node_id}?window=24h",
        "incident-history": f"/incidents/{died.incident_id}",
        "cluster-charts": "/cluster",
        "capacity-charts": "/capacity",
    }
    found: dict[str, object] = {}
    try:
        async with async_playwright() as p:
            browser = await p.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
            page = await browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.on("console", lambda msg: errors.append(msg.text) if msg.type == "error" else None)
            for name, path in pages.items():
                await page.goto(base + path)
                boxes = page.locator(".chart-box")
                count = await boxes.count()
                await page.wait_for_function(f"document.querySelectorAll('.chart-box .plot[data-ready]').length === {count}")
                charts = []
                for i in range(count):
                    box = boxes.nth(i)
                    # uPlot draws its axes on the canvas: their labels are read from the plot drawn
                    axes = await box.locator(".plot").evaluate("el => el.uplot.axes.map(a => a.label)")
                    over = box.locator(".u-over")
                    await over.scroll_into_view_if_needed()
                    area = await over.bounding_box()
                    await page.mouse.move(area["x"] + area["width"] * 0.97, area["y"] + area["height"] / 2)
                    values = await box.locator(".u-legend .u-value").all_inner_texts()
                    charts.append({"title": await box.locator("figcaption").inner_text(), "axes": axes, "values": values})
                found[name] = charts
                await page.screenshot(path=SHOTS / f"{name}.png", full_page=True)

            # a drag over the first chart zooms every chart of the page and offers that window as a link
            await page.goto(base + pages["node-24h"])
            await page.wait_for_selector(".chart-box .plot[data-ready]")
            area = await page.locator(".chart-box .u-over").first.bounding_box()
            await page.mouse.move(area["x"] + area["width"] * 0.5, area["y"] + 20)
            await page.mouse.down()
            await page.mouse.move(area["x"] + area["width"] * 0.75, area["y"] + 20, steps=5)
            await page.mouse.up()
            found["zoom link"] = await page.get_attribute("a.zoomed-window", "href")
            found["zoom hidden"] = await page.locator("a.zoomed-window").is_hidden()
            found["incident text"] = await page.goto(base + pages["incident-history"]) and await page.inner_text("#node-history")

            phone = await browser.new_page(viewport={"width": 390, "height": 844})
            for name, path in {**pages, "fleet": "/", "incidents": "/incidents", "ledger": "/ledger", "cost": "/cost"}.items():
                await phone.goto(base + path)
                await phone.wait_for_load_state("networkidle")
                found[f"{name} at 390"] = await phone.evaluate("document.documentElement.scrollWidth")
                found[f"{name} legible"] = await phone.evaluate(LEGIBILITY)
                await phone.screenshot(path=SHOTS / f"{name}-390.png", full_page=True)
            await browser.close()
    finally:
        await console.stop()
        await engine.dispose()

    assert errors == [], errors
    for name in pages:
        assert found[name], f"{name}: no chart"
        for chart in found[name]:
            assert len(chart["axes"]) == 2 and chart["axes"][0] == "time (UTC)" and chart["axes"][1], (name, chart)
            assert any(v not in ("–", "") for v in chart["values"][1:]), (name, chart)  # a value under the pointer
    titles = [c["title"] for c in found["node-24h"]]
    assert titles[:2] == ["GPU utilisation (%)", "GPU memory used (GiB)"] and "Host memory (GiB)" in titles
    assert "from=" in str(found["zoom link"]) and not found["zoom hidden"]
    assert "Host memory (GiB)" in [c["title"] for c in found["incident-history"]]
    assert "Busiest processes from the hour before" in str(found["incident text"]) and "selfplay" in str(found["incident text"])
    for name in (*pages, "fleet", "incidents", "ledger", "cost"):
        assert found[f"{name} at 390"] <= 390, f"{name} is {found[f'{name} at 390']} px wide on a 390 px screen"
        _legible(name, found[f"{name} legible"])
