"""The sampling loop: a fixed grid on the monotonic clock, no bursts, and it outlives failures."""

from __future__ import annotations

import asyncio

import pytest

from gpumedic_events import CpuPressure

from node_sampler.readings import JobsReading
from node_sampler.sampler import PUBLISH_WAIT_MIN_S, Sampler
from tests.node_sampler.fakes import FakeProcessTable, table_for_two_gpus, two_gpus


class FakeClock:
    """Time stands still unless the test (or a slow step) moves it; `sleep` moves it exactly."""

    def __init__(self, start: float = 1000.0) -> None:
        self.now = start
        self.sleeps: list[float] = []
        self.wakeups: list[float] = []

    def __call__(self) -> float:
        return self.now

    async def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        self.now += seconds
        self.wakeups.append(self.now)
        await asyncio.sleep(0)


async def _run_until(sampler: Sampler, publish, count: int, published: list) -> None:
    task = asyncio.create_task(sampler.run(publish))
    while len(published) < count:
        await asyncio.sleep(0)
        if task.done():
            task.result()
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_ticks_stay_on_the_grid_despite_slow_samples():
    clock = FakeClock()
    published = []

    async def publish(event):
        clock.now += 0.7  # each interval's own work takes time; it must not push the grid later
        published.append(event)

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, clock=clock, sleep=clock.sleep)
    await _run_until(sampler, publish, 5, published)

    start = 1000.0
    assert clock.wakeups[:4] == [start + 5.0 * k for k in range(1, 5)]
    assert clock.sleeps[:4] == [pytest.approx(4.3)] * 4
    assert sampler.skipped_ticks == 0


async def test_missed_ticks_are_skipped_not_burst():
    clock = FakeClock()
    published = []

    async def publish(event):
        published.append(event)
        if len(published) == 2:
            clock.now += 12.5  # a stall during tick 1 (due at 1005): ticks 2 and 3 are already past

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, clock=clock, sleep=clock.sleep)
    await _run_until(sampler, publish, 4, published)

    assert clock.wakeups[:3] == [1005.0, 1020.0, 1025.0]
    assert sampler.skipped_ticks == 2


async def test_a_starved_sampler_says_how_late_it_is_and_what_it_missed():
    """A node whose job keeps every CPU busy wakes its sampler late: each sample says when it was due
    (the taking time is `occurred_at`) and how many ticks it skipped before it, and the pressure of its
    own cgroup, so the control plane reads a late node, not a silent one."""
    clock = FakeClock()
    published = []
    woken_late = iter([7.5, 0.0, 0.0])

    async def late_sleep(seconds: float) -> None:
        await clock.sleep(seconds + next(woken_late, 0.0))  # the scheduler gives it a CPU this much later

    starved = CpuPressure(some_avg10_pct=87.5, full_avg10_pct=12.0)
    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, clock=clock, sleep=late_sleep, own_pressure=lambda: starved)
    await _run_until(sampler, lambda e: _append(published, e), 4, published)

    late = [(e.occurred_at - e.due_at).total_seconds() for e in published]
    assert late[0] == pytest.approx(0.0, abs=0.01)
    assert late[1] == pytest.approx(7.5, abs=0.01)  # tick 1, due at 1005, taken at 1012.5
    assert late[2] == pytest.approx(0.0, abs=0.01)  # tick 3 at 1015: tick 2 (1010) had passed
    assert [e.missed_ticks for e in published] == [0, 0, 1, 0]
    assert all(e.sampler_cpu_pressure == starved for e in published)
    assert sampler.skipped_ticks == 1


async def _append(into: list, event) -> None:
    into.append(event)


async def test_failed_publish_is_logged_and_the_loop_goes_on(caplog):
    clock = FakeClock()
    attempts = []

    async def publish(event):
        attempts.append(event)
        if len(attempts) <= 2:
            raise ConnectionError("nats down")

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, clock=clock, sleep=clock.sleep)
    with caplog.at_level("WARNING", logger="node_sampler.sampler"):
        await _run_until(sampler, publish, 4, attempts)

    assert len([r for r in caplog.records if "not published" in r.getMessage()]) == 2
    assert clock.wakeups[:3] == [1005.0, 1010.0, 1015.0]
    # each sample says how many of the node's samples the bus did not take: the control plane sees what it never got
    assert [e.unacknowledged for e in attempts[:4]] == [0, 1, 2, 2]


async def test_a_lost_acknowledgement_does_not_stall_the_loop(caplog):
    """A server killed mid-publish never answers: the sample is given up after an interval (at
    least PUBLISH_WAIT_MIN_S), not the bus's full publish timeout, and the next ones go out."""
    published = []

    async def publish(event):
        if not published:
            published.append(None)
            await asyncio.Event().wait()  # the acknowledgement that never comes
        published.append(event)

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 0.05)
    with caplog.at_level("WARNING", logger="node_sampler.sampler"):
        await asyncio.wait_for(_run_until(sampler, publish, 4, published), timeout=PUBLISH_WAIT_MIN_S + 3)
    assert [r for r in caplog.records if "not published" in r.getMessage() and "TimeoutError" in r.getMessage()]


async def test_real_clock_runs_a_few_ticks():
    published = []

    async def publish(event):
        published.append(event)

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 0.05)
    task = asyncio.create_task(sampler.run(publish))
    await asyncio.sleep(0.22)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert 2 <= len(published) <= 6
    assert len({e.event_id for e in published}) == len(published)


async def test_vanished_gpu_process_keeps_its_pid_and_notes_why():
    table = table_for_two_gpus()
    del table.processes[41999]
    sample = await Sampler("n1", two_gpus(), table, [], 5.0).sample()
    gone = next(p for p in sample.gpus[1].processes if p.pid == 41999)
    assert (gone.start_ticks, gone.command) == (None, "")
    assert sample.errors == ("pid 41999: gone",)


class _Probe:
    def __init__(self, result) -> None:
        self.result = result

    async def observe(self):
        if isinstance(self.result, Exception):
            raise self.result
        return self.result


async def test_probes_are_merged_in_order_and_a_raising_probe_is_a_note():
    probes = [
        _Probe(JobsReading(errors=("status probe http://x/status: HTTP 503",))),
        _Probe(RuntimeError("bug")),
        _Probe(JobsReading(running=2)),
        _Probe(JobsReading(output_growing=False)),
        _Probe(JobsReading(running=9, output_growing=True)),
    ]
    sample = await Sampler("n1", two_gpus(), table_for_two_gpus(), probes, 5.0).sample()
    assert (sample.jobs.running, sample.jobs.output_growing) == (2, True)  # the first count; output grew by one measure
    assert sample.errors == ("status probe http://x/status: HTTP 503", "_Probe: RuntimeError")


async def test_the_event_loop_is_not_blocked_by_nvml():
    import threading
    import time

    class SlowNvml(type(two_gpus())):
        def nvmlDeviceGetCount(self):
            assert threading.current_thread() is not threading.main_thread()
            time.sleep(0.2)
            return super().nvmlDeviceGetCount()

    nvml = SlowNvml(two_gpus().gpus)
    ticks = 0

    async def ticker():
        nonlocal ticks
        while True:
            await asyncio.sleep(0.01)
            ticks += 1

    t = asyncio.create_task(ticker())
    await Sampler("n1", nvml, FakeProcessTable(), [], 5.0).sample()
    t.cancel()
    assert ticks >= 3


def test_interval_must_be_positive():
    with pytest.raises(ValueError):
        Sampler("n1", two_gpus(), FakeProcessTable(), [], 0)


async def test_the_health_figures_go_out_first_then_when_they_change_or_to_refresh():
    clock = FakeClock()
    nvml = two_gpus()
    sampler = Sampler(
        "n1", nvml, table_for_two_gpus(), [], 5.0, health_interval_s=30.0, health_refresh_s=120.0, clock=clock, sleep=clock.sleep
    )
    carried = []
    for step in range(30):  # samples at 1000, 1005, ... 1145
        if step == 12:
            nvml.gpus[1].pcie_replay = 40  # GPU 1's link replays: read at 1060, sent then
        sample = await sampler.sample()
        carried.append(tuple(gpu.index for gpu in sample.gpus if gpu.health is not None))
        assert all(gpu.sm_clock_mhz == 1755 for gpu in sample.gpus)  # the fast figures are in every one
        clock.now += 5.0

    sent = {1000 + 5 * step: gpus for step, gpus in enumerate(carried) if gpus}
    # read every 30 s; unchanged, not sent again until 120 s after it last was
    assert sent == {1000: (0, 1), 1060: (1,), 1120: (0,)}
    assert set(sampler.last_health) == {0, 1} and sampler.last_health[1].pcie_replay_count == 40


def test_a_containers_exit_carries_as_many_log_lines_as_set_and_fifty_unless_told():
    watched = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, docker_socket="/run/none.sock")
    told = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 5.0, docker_socket="/run/none.sock", container_log_lines=7)
    assert (watched.containers.log_lines, told.containers.log_lines) == (50, 7)
