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
from pathlib import Path

import pytest

from gpumedic_sim.demo import run_demo

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
SHOTS = Path(__file__).resolve().parents[2] / "build" / "console-screenshots"

pytestmark = pytest.mark.skipif(not Path(CHROMIUM).exists(), reason="needs Debian's chromium (apt-get install chromium; .ci/run does)")


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

            for path, name in (("cluster", "cluster"), ("capacity", "capacity")):
                await page.goto(stack.console_url + path)
                await page.screenshot(path=SHOTS / f"{name}.png", full_page=True)
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
    assert "sim-node-01" in str(seen["silences"]) and "alice" in str(seen["silences"])
    assert errors == [], errors
    assert sorted(p.name for p in SHOTS.glob("*.png")) >= ["capacity.png", "cluster.png", "fleet.png", "incident.png", "incidents.png", "ledger.png"]


async def _line_in(path: Path, text: str, *, timeout_s: float) -> str:
    """The first line of a log that holds `text`, waiting for it up to `timeout_s`."""
    for _ in range(int(timeout_s * 10)):
        for line in path.read_text(errors="replace").splitlines():
            if text in line:
                return line
        await asyncio.sleep(0.1)
    return ""
