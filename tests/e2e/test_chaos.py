"""The chaos run's CI slice (`make chaos` is the whole run): zombie jobs fixed on a three-server
NATS cluster while a random service is killed with SIGKILL every few seconds and one of the
servers is restarted every 5 s; afterwards every zombie has exactly one incident and was fixed, no process was
killed twice, nothing is missing from the store, and every killed service was ready again within
10 s."""

from __future__ import annotations

import pytest

from gpumedic_sim.chaos import run_chaos

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]


async def test_killed_services_and_bounced_servers_lose_nothing_and_double_nothing(tmp_path):
    result = await run_chaos(tmp_path / "var", nodes=40, incidents=120, rate_per_s=4.0, kill_every_s=4.0, bounce_every_s=5.0,
                             say=lambda line: None)
    report = result.render(10.0)
    assert len(result.injected) == 120, report
    assert result.service_kills and result.bounces, report
    assert not result.lost and not result.doubled and not result.unfixed and not result.killed_twice, report
    assert (result.missing_incidents, result.missing_actions) == (0, 0), report
    assert result.ok(10.0), report
