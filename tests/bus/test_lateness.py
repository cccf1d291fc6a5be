"""How late a service's own loop runs, measured on the real event loop, and where its cgroup's PSI is."""

from __future__ import annotations

import asyncio
import time

from gpumedic_bus.lateness import LAGGING_AFTER_S, LoopLag, own_cgroup_pressure, read_pressure
from gpumedic_events import CpuPressure


async def test_a_loop_blocked_past_the_bound_is_lagging_and_one_that_is_not_is_not():
    lag = LoopLag(every_s=0.05)
    task = asyncio.create_task(lag.run())
    try:
        await asyncio.sleep(0.3)
        quiet_from = time.monotonic() - 0.25
        assert lag.worst_since(quiet_from) < 0.2
        assert not lag.lagging_since(quiet_from)

        blocked_at = time.monotonic()
        time.sleep(LAGGING_AFTER_S + 0.3)  # a GC pause, a CPU taken by a neighbour: nothing on the loop runs
        assert lag.lagging_since(blocked_at)  # the timer under way already says so
        await asyncio.sleep(0.2)
        assert lag.worst_since(blocked_at) >= LAGGING_AFTER_S
        assert lag.worst(10.0) >= LAGGING_AFTER_S  # what the heartbeat says
        assert not lag.lagging_since(time.monotonic() - 0.1)  # what is timed from now on is judged again
    finally:
        task.cancel()


def test_the_own_cgroups_pressure_file(tmp_path):
    cgroup = tmp_path / "cgroup"
    group = tmp_path / "sys" / "system.slice" / "gpumedic-node-sampler.service"
    group.mkdir(parents=True)
    (group / "cpu.pressure").write_text("some avg10=42.00 avg60=0 avg300=0 total=1\nfull avg10=7.00 avg60=0 avg300=0 total=1\n")
    cgroup.write_text("0::/system.slice/gpumedic-node-sampler.service\n")
    path = own_cgroup_pressure(cgroup, tmp_path / "sys")
    assert path == group / "cpu.pressure"
    assert read_pressure(path) == CpuPressure(some_avg10_pct=42.0, full_avg10_pct=7.0)

    for text in ("0::/\n", "4:memory:/docker/abc\n", "0::/../../etc\n"):  # the root (the host's figure), cgroup v1, a way out
        cgroup.write_text(text)
        assert own_cgroup_pressure(cgroup, tmp_path / "sys") is None
    assert own_cgroup_pressure(tmp_path / "missing", tmp_path / "sys") is None
    assert read_pressure(tmp_path / "missing") is None
