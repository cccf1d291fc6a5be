"""A node's history on both backends: samples folded into minutes (means of utilisation and power,
peaks of memory, temperature, swap and disks, each busy process's peaks), written by report-builder's
recorder, read back as charts; a late sample dropped and counted, a store outage waited out with
nothing lost, minutes past the retention forgotten, and a long window merged into few points."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import func, select

from gpumedic_events import DiskUsage, GpuSample, HostSample, NodeSampled, TopProcess
from gpumedic_store import create_engine, history, session_factory
from gpumedic_store.models import NodeHour, NodeMinute
from report_builder.history import HistoryRecorder

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


def sample(at: datetime, *, util: int, mem_avail_mib: int = 100_000, temp: int = 60, disk_pct: float = 40.0,
           top: tuple[TopProcess, ...] = (), node: str = "n1") -> NodeSampled:
    return NodeSampled(
        source="test", occurred_at=at, node_id=node, interval_s=5.0,
        gpus=(
            GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=1000 + util, memory_total_mib=81_920, temperature_c=temp, power_w=100.0 + util),
            GpuSample(index=1, utilization_gpu_pct=0, memory_used_mib=0, memory_total_mib=81_920, temperature_c=30, power_w=60.0),
        ),
        host=HostSample(
            memory_total_mib=200_000, memory_available_mib=mem_avail_mib, swap_total_mib=0, swap_used_mib=0, load_1m=3.5, cpus=32,
            disks=(DiskUsage(path="/", total_bytes=100, used_bytes=int(disk_pct), available_bytes=100 - int(disk_pct), used_pct=disk_pct),),
            top_processes=top,
        ),
    )


def test_a_minute_is_each_figure_s_mean_or_peak_over_the_samples_that_had_it():
    folder = history.MinuteFolder(T0)
    first = sample(T0, util=10, temp=70)
    folder.add(first)
    # GPU 0 without utilisation or power (a read that failed), a GPU 2 that appeared; host memory down
    folder.add(NodeSampled(
        source="test", occurred_at=T0 + timedelta(seconds=5), node_id="n1", interval_s=5.0,
        gpus=(GpuSample(index=0, memory_used_mib=500, memory_total_mib=81_920, temperature_c=65),
              GpuSample(index=2, utilization_gpu_pct=40, temperature_c=33)),
        host=HostSample(memory_total_mib=200_000, memory_available_mib=50_000, load_1m=9.0),
    ))
    folder.add(sample(T0 + timedelta(seconds=10), util=30, temp=60))
    minute = folder.minute_figures()
    f = minute.figures
    assert minute.samples == 3
    assert (f["gpu0.util_pct"], f["gpu0.power_w"]) == (20.0, 120.0)  # the mean of the two that had them
    assert (f["gpu0.memory_used_mib"], f["gpu0.temperature_c"], f["gpu0.processes"]) == (1030, 70, 0)  # peaks
    assert (f["gpu2.util_pct"], f["gpu2.temperature_c"]) == (40.0, 33)
    assert "gpu2.power_w" not in f and "gpu2.memory_used_mib" not in f  # no sample had them
    assert (f["host.memory_used_mib"], f["host.load_1m"]) == (150_000, 9.0)
    assert list(f) == sorted(f)


class Clock:
    def __init__(self, at: datetime) -> None:
        self.at = at

    def __call__(self) -> datetime:
        return self.at


async def test_samples_become_minutes_and_charts(sessions):
    clock = Clock(T0)
    recorder = HistoryRecorder(sessions, retention=timedelta(hours=24), now=clock)
    trainer = TopProcess(pid=41, command="python train.py", user="ml", cpu_pct=380.0, memory_rss_mib=12_000)
    leak = lambda rss: TopProcess(pid=77, command="python leak.py", user="bob", cpu_pct=5.0, memory_rss_mib=rss)  # noqa: E731
    for minute in range(3):
        for k in range(12):
            at = T0 + timedelta(minutes=minute, seconds=5 * k)
            # minute 1: utilisation 10..120 -> mean 65; host memory dips to 20,000 available once
            util = min(100, 10 * (k + 1)) if minute == 1 else 50
            await recorder.on_sample(sample(at, util=util, mem_avail_mib=20_000 if (minute, k) == (1, 6) else 100_000,
                                            temp=90 if (minute, k) == (2, 3) else 60, top=(trainer, leak(1000 * (minute + 1) + k))))
    clock.at = T0 + timedelta(minutes=3, seconds=20)
    assert await recorder.flush() == 3
    await recorder.on_sample(sample(T0 + timedelta(minutes=2, seconds=59), util=0))  # its minute is stored: late
    assert recorder.late == 1
    assert await recorder.flush() == 0

    async with sessions() as session:
        h = await history.read(session, "n1", T0, T0 + timedelta(minutes=3))
    assert h.minutes == 3 and h.step_s == 60
    assert h.times[:3] == [int((T0 + timedelta(minutes=i)).timestamp()) for i in range(3)]
    util = h.chart("gpu_util")
    assert [s.label for s in util.series] == ["GPU 0", "GPU 1"]
    assert util.series[0].values[:3] == [50.0, round(sum(min(100, 10 * (k + 1)) for k in range(12)) / 12, 1), 50.0]
    assert h.chart("gpu_temperature").series[0].values[:3] == [60, 60, 90]  # a peak, not a mean
    memory = h.chart("host_memory").series[0]
    assert memory.values[:3] == [round(100_000 / 1024, 2), round(180_000 / 1024, 2), round(100_000 / 1024, 2)]
    assert h.chart("disks").series[0].label == "/"
    assert h.chart("host_load").unit == ""
    by_pid = {p.pid: p for p in h.top}
    assert by_pid[41].cpu_pct == 380.0
    assert by_pid[77].memory_rss_mib == 3011  # its peak over the window: minute 2, last sample


async def test_the_store_down_loses_nothing(sessions):
    clock = Clock(T0)
    recorder = HistoryRecorder(sessions, retention=timedelta(hours=24), now=clock)
    await recorder.on_sample(sample(T0, util=70))
    await recorder.on_sample(sample(T0 + timedelta(minutes=1), util=80))

    down = create_engine("postgresql+asyncpg://gpumedic@127.0.0.1:9/gpumedic")  # nothing listens on port 9
    recorder._db = session_factory(down)
    clock.at = T0 + timedelta(minutes=2, seconds=30)
    assert await recorder.flush() == 0
    await down.dispose()
    recorder._db = sessions
    assert await recorder.flush() == 2
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(NodeMinute)) == 2  # each minute a row until its hour is folded
        assert (await history.read(session, "n1", T0, T0 + timedelta(minutes=5))).minutes == 2


async def test_an_hour_that_ended_is_folded_into_one_row_and_reads_the_same(sessions):
    """A finished minute is written as a row of its own (rewriting the hour's row every minute
    cost an hour's encoding per node per minute); once the hour has ended its minutes become the
    hour's one row, a few node-hours per flush, and a window reads the same before and after."""
    clock = Clock(T0 + timedelta(minutes=50))
    recorder = HistoryRecorder(sessions, retention=timedelta(hours=24), now=clock)
    for node in ("n1", "n2"):
        for minute in range(50, 70):  # 10:50 to 11:09
            await recorder.on_sample(sample(T0 + timedelta(minutes=minute), util=minute, node=node))
    clock.at = T0 + timedelta(minutes=70, seconds=20)
    await recorder.flush()  # the first hour ended 10 minutes ago: folded now
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(NodeHour)) == 2  # 10:00 of each node
        assert await session.scalar(select(func.count()).select_from(NodeMinute)) == 2 * 10  # 11:00 to 11:09
        folded = await history.read(session, "n1", T0 + timedelta(minutes=40), T0 + timedelta(minutes=70))
    assert folded.minutes == 20  # 10:50 to 11:09, across the folded hour and the minutes after it
    assert folded.chart("gpu_util").series[0].values[10:30] == [float(m) for m in range(50, 70)]
    # Another writer's minute of an hour already folded (a lease taken over) is read among the
    # hour's minutes, and folded into its row again.
    async with sessions() as session, session.begin():
        again = history.MinuteFolder(T0 + timedelta(minutes=55))
        again.add(sample(T0 + timedelta(minutes=55), util=99))
        await history.write(session, {"n1": [again.minute_figures()]})
        assert (await history.read(session, "n1", T0, T0 + timedelta(minutes=70))).chart("gpu_util").series[0].values[55] == 99.0
    assert await recorder.fold() == 1
    async with sessions() as session:
        assert (await history.read(session, "n1", T0, T0 + timedelta(minutes=70))).chart("gpu_util").series[0].values[55] == 99.0
        assert await session.scalar(select(func.count()).select_from(NodeMinute).where(NodeMinute.minute < T0 + timedelta(hours=1))) == 0


async def test_old_minutes_are_forgotten_and_long_windows_merged(sessions):
    async with sessions() as session, session.begin():
        for i in range(0, 48 * 60, 10):  # two days, a minute every ten
            folder = history.MinuteFolder(T0 + timedelta(minutes=i))
            folder.add(sample(T0 + timedelta(minutes=i), util=i % 100))
            await history.write(session, {"n1": [folder.minute_figures()]})
    clock = Clock(T0 + timedelta(hours=48))
    recorder = HistoryRecorder(sessions, retention=timedelta(hours=24), now=clock)
    await recorder.flush()
    async with sessions() as session:
        left = min(await session.scalar(select(func.min(NodeHour.hour))), await session.scalar(select(func.min(NodeMinute.minute))))
        h = await history.read(session, "n1", T0 + timedelta(hours=24), T0 + timedelta(hours=48), max_points=100)
    assert left >= T0 + timedelta(hours=23)  # hours that ended before the retention's start are gone
    assert h.step_s == 15 * 60 and len(h.times) == 96
    values = h.chart("gpu_util").series[0].values
    assert all(v is not None for v in values)  # every 15 min bucket holds one or two stored minutes
    empty = await _read(sessions, "nobody")
    assert empty.empty and empty.charts == []


async def _read(sessions, node: str) -> history.History:
    async with sessions() as session:
        return await history.read(session, node, T0, T0 + timedelta(hours=1))
