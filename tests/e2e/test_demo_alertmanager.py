"""`gpumedic demo` told to post to Debian's real Alertmanager: the demo's zombie arrives there as a
firing alert, reaches a webhook receiver through Alertmanager's own routing, and resolves there
when gpumedic has fixed it, as an operator's existing routes would see it."""

from __future__ import annotations

import asyncio
import os
import sys
from pathlib import Path

import pytest
from tests.report_builder.test_alertmanager import ALERTMANAGER, _alertmanager, _until, hook_receiver
from tests.fixtures.real import needs

pytestmark = [
    pytest.mark.slow,
    needs(ALERTMANAGER, "Debian's prometheus-alertmanager (.ci/run installs it)"),
]


@pytest.mark.timeout(240)
async def test_the_demos_zombie_fires_and_resolves_through_alertmanager(tmp_path):
    async with hook_receiver() as (hook_port, notified):
        process, am_url = await _alertmanager(tmp_path, hook_port)
        try:
            env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}
            env |= {"GPUMEDIC_REPORTS_ALERTMANAGER_URL": am_url, "GPUMEDIC_REPORTS_ALERTMANAGER_EVERY_S": "5"}
            demo = await asyncio.create_subprocess_exec(
                str(Path(sys.executable).parent / "gpumedic"), "demo", "--var", str(tmp_path / "var"), "--nodes", "3", "--duration", "90",
                env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
            )
            out = (await asyncio.wait_for(demo.communicate(), 180))[0].decode()
            assert demo.returncode == 0, out
            zombie = [a for n in notified for a in n["alerts"] if a["labels"]["alertname"] == "zombie_job"]
            assert zombie and zombie[0]["labels"]["node"] == "sim-node-02" and zombie[0]["labels"]["gpu"] == "0", notified
            assert zombie[0]["status"] == "firing" and zombie[0]["annotations"]["summary"]
            # resolved at Alertmanager as the demo fixed it (its group waits out group_interval, 1 s)
            await _until(lambda: any(a["status"] == "resolved" for n in notified for a in n["alerts"]
                                     if a["labels"]["alertname"] == "zombie_job"), "resolved notification")
        finally:
            process.terminate()
            process.wait(10)
