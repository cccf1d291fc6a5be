"""A node's history: its sample figures one minute at a time, kept in the store for a day (by
default) where the samples stream keeps ten minutes.

`MinuteFolder` folds one node's samples of a minute into a `Minute`: utilisation, power and
clocks as means; memory, temperatures, swap, load and disk use as peaks (a spike that killed a
job must not be averaged away); the busiest processes as each one's peak CPU and memory. The
store keeps one row per node and hour (`NodeHour`): its minutes as columns, one array per figure,
zlib-compressed JSON, so a day is 24 rows to read and the arrays compress well. A finished minute
is written as a row of its own (`NodeMinute`) and the hour's minutes are folded into its row once
the hour has ended (`fold`): rewriting the hour's row every minute cost the encoding of up to an
hour per node per minute (at 10,000 nodes, a quarter of a core and 1.2 GiB of rows kept to append
to). `read` answers a window of one node from both, merged into at most `max_points` buckets, as
series a chart draws directly.

A figure's name says what it is: `gpu<i>.<figure>`, `host.<figure>`, `disk:<path>` (percent in use).
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
import zlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_events import NodeSampled
from gpumedic_store.models import NodeHour, NodeMinute

GPU_MEANS = ("util_pct", "power_w", "sm_clock_mhz")
"""GPU figures a minute keeps as the mean of its samples; every other figure is the minute's peak."""
TOP_KEEP = 10
"""Processes a minute keeps: its busiest by peak CPU, then by peak memory."""
FORMAT = 2


def minute_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


def hour_of(at: datetime) -> datetime:
    return minute_of(at).replace(minute=0)


def _is_mean(name: str) -> bool:
    return name.startswith("gpu") and name.partition(".")[2] in GPU_MEANS


@dataclass
class ProcessPeak:
    """One process's peaks over a minute or a window."""

    pid: int
    command: str
    user: str
    container_id: str
    cpu_pct: float
    memory_rss_mib: int
    last_seen: datetime

    def merge(self, other: ProcessPeak) -> None:
        self.cpu_pct = max(self.cpu_pct, other.cpu_pct)
        self.memory_rss_mib = max(self.memory_rss_mib, other.memory_rss_mib)
        self.last_seen = max(self.last_seen, other.last_seen)


@dataclass
class Minute:
    """What one node did in one minute: each figure by name, None where no sample had it."""

    minute: datetime
    samples: int = 0
    figures: dict[str, float | None] = field(default_factory=dict)
    top: list[ProcessPeak] = field(default_factory=list)


class MinuteFolder:
    """One node's samples of one minute, folded as they arrive: a comparison or two additions per
    figure, each GPU's figures by position, named once the minute ends (this runs for every sample
    of the fleet)."""

    def __init__(self, minute: datetime) -> None:
        self.minute = minute
        self._n = 0
        self._gpus: dict[int, list] = {}
        """Per GPU index, its figures in `_gpu_names`' order: each mean's sum and count (numbers,
        not a list each: 10,000 nodes' minutes of lists kept Python's garbage collector busy), then
        each peak (None until a sample has it). Named only when the minute ends."""
        self._peaks: dict[str, float] = {}
        """The host's peaks, by name."""
        self._top: dict[tuple[int, str], ProcessPeak] = {}

    def add(self, sample: NodeSampled) -> None:
        self._n += 1
        peaks, gpus = self._peaks, self._gpus
        for gpu in sample.gpus:  # inline, no call per figure: at 10,000 nodes this loop runs 16,000 times a second
            acc = gpus.get(gpu.index)
            if acc is None:
                acc = gpus[gpu.index] = [0, 0, 0, 0, 0, 0, None, None, None, None]
            value = gpu.utilization_gpu_pct
            if value is not None:
                acc[0] += value
                acc[1] += 1
            value = gpu.power_w
            if value is not None:
                acc[2] += value
                acc[3] += 1
            value = gpu.sm_clock_mhz
            if value is not None:
                acc[4] += value
                acc[5] += 1
            for i, value in ((6, gpu.memory_used_mib), (7, gpu.memory_total_mib), (8, gpu.temperature_c), (9, len(gpu.processes))):
                if value is not None and (acc[i] is None or value > acc[i]):
                    acc[i] = value
        host = sample.host
        if host.memory_total_mib is not None and host.memory_available_mib is not None:
            _peak(peaks, "host.memory_used_mib", max(0, host.memory_total_mib - host.memory_available_mib))
        _peak(peaks, "host.memory_total_mib", host.memory_total_mib)
        _peak(peaks, "host.swap_used_mib", host.swap_used_mib)
        _peak(peaks, "host.load_1m", host.load_1m)
        _peak(peaks, "host.cpus", host.cpus)
        _peak(peaks, "host.jobs_running", sample.jobs.running)
        for disk in host.disks:
            _peak(peaks, "disk:" + disk.path, disk.used_pct)
        for p in host.top_processes:
            known = self._top.get((p.pid, p.command))
            if known is None:
                self._top[(p.pid, p.command)] = ProcessPeak(p.pid, p.command, p.user, p.container_id, p.cpu_pct, p.memory_rss_mib, sample.occurred_at)
            else:
                known.cpu_pct = max(known.cpu_pct, p.cpu_pct)
                known.memory_rss_mib = max(known.memory_rss_mib, p.memory_rss_mib)
                known.last_seen = max(known.last_seen, sample.occurred_at)

    def minute_figures(self) -> Minute:
        figures: dict[str, float | None] = {}
        for index, acc in self._gpus.items():
            names = _gpu_names(index)
            for i, name in enumerate(names[: len(GPU_MEANS)]):
                if acc[2 * i + 1]:
                    figures[name] = round(acc[2 * i] / acc[2 * i + 1], 2)
            for name, peak in zip(names[len(GPU_MEANS):], acc[2 * len(GPU_MEANS):], strict=True):
                if peak is not None:
                    figures[name] = peak
        figures.update(self._peaks)
        return Minute(self.minute, self._n, dict(sorted(figures.items())), busiest(self._top.values(), TOP_KEEP))


def _peak(peaks: dict[str, float], name: str, value: float | None) -> None:
    if value is not None:
        old = peaks.get(name)
        if old is None or value > old:
            peaks[name] = value


@functools.cache
def _gpu_names(index: int) -> tuple[str, ...]:
    """A GPU's figure names, in the order `MinuteFolder.add` reads them (its means first)."""
    return tuple(f"gpu{index}.{figure}" for figure in (*GPU_MEANS, "memory_used_mib", "memory_total_mib", "temperature_c", "processes"))


def busiest(processes: Iterable[ProcessPeak], keep: int) -> list[ProcessPeak]:
    """Half by peak CPU, then the rest by peak memory, busiest first; each once."""
    everyone = list(processes)
    by_cpu = sorted((p for p in everyone if p.cpu_pct > 0), key=lambda p: -p.cpu_pct)[: keep // 2]
    chosen = {id(p) for p in by_cpu}
    by_memory = [p for p in sorted(everyone, key=lambda p: -p.memory_rss_mib) if id(p) not in chosen]
    return [*by_cpu, *by_memory][:keep]


@dataclass
class Columns:
    """Minutes of one node as columns: `times` (seconds since the epoch, ascending) and, per
    figure, one value per time (None where that minute lacked it)."""

    times: list[int] = field(default_factory=list)
    samples: list[int] = field(default_factory=list)
    series: dict[str, list[float | None]] = field(default_factory=dict)
    top: list[tuple[int, ProcessPeak]] = field(default_factory=list)
    """(time, process) for each minute's busiest processes."""

    def add(self, minutes: Iterable[Minute]) -> None:
        """Merge minutes in; one already held is replaced (a minute written again)."""
        by_time = {int(m.minute.timestamp()): m for m in minutes}
        if by_time and (not self.times or min(by_time) > self.times[-1]):
            self._append([by_time[t] for t in sorted(by_time)])
            return
        rows = {t: i for i, t in enumerate(self.times)}
        keep = [i for i, t in enumerate(self.times) if t not in by_time]
        new_times = sorted([self.times[i] for i in keep] + list(by_time))
        names = set(self.series) | {n for m in by_time.values() for n in m.figures}
        series: dict[str, list[float | None]] = {}
        for name in sorted(names):
            old = self.series.get(name)
            column: list[float | None] = []
            for t in new_times:
                m = by_time.get(t)
                column.append(m.figures.get(name) if m is not None else (old[rows[t]] if old is not None else None))
            series[name] = column
        self.samples = [by_time[t].samples if t in by_time else self.samples[rows[t]] for t in new_times]
        self.top = sorted([(t, p) for t, p in self.top if t not in by_time] + [(t, p) for t, m in by_time.items() for p in m.top],
                          key=lambda tp: tp[0])
        self.times, self.series = new_times, series

    def _append(self, minutes: list[Minute]) -> None:
        """Minutes that all come after those held, in order (each minute of an hour as it ends)."""
        for m in minutes:
            n = len(self.times)
            for name, column in self.series.items():
                column.append(m.figures.get(name))
            for name in m.figures.keys() - self.series.keys():
                self.series[name] = [None] * n + [m.figures[name]]
            t = int(m.minute.timestamp())
            self.times.append(t)
            self.samples.append(m.samples)
            self.top.extend((t, p) for p in m.top)
        if len(self.series) > 1 and any(a > b for a, b in zip(self.series, list(self.series)[1:], strict=False)):
            self.series = dict(sorted(self.series.items()))

    @classmethod
    def of(cls, minutes: Iterable[Minute]) -> Columns:
        columns = cls()
        columns.add(minutes)
        return columns

    def minutes(self) -> list[Minute]:
        """The columns back as minutes."""
        tops: dict[int, list[ProcessPeak]] = {}
        for t, p in self.top:
            tops.setdefault(t, []).append(p)
        return [
            Minute(datetime.fromtimestamp(t, UTC), self.samples[i],
                   {name: column[i] for name, column in self.series.items() if column[i] is not None}, tops.get(t, []))
            for i, t in enumerate(self.times)
        ]

    def merge(self, other: Columns) -> None:
        """Merge other columns in, after these or among them (a minute held in both: theirs)."""
        if not other.times:
            return
        if not self.times or other.times[0] > self.times[-1]:
            self.extend(other)
        else:
            self.add(other.minutes())

    def extend(self, later: Columns) -> None:
        """Append columns that all come after these (the next hour)."""
        n, m = len(self.times), len(later.times)
        for name in set(self.series) | set(later.series):
            self.series[name] = self.series.get(name, [None] * n) + later.series.get(name, [None] * m)
        self.times += later.times
        self.samples += later.samples
        self.top += later.top

    def encode(self) -> bytes:
        doc = {
            "v": FORMAT, "t": self.times, "n": self.samples, "s": self.series,
            "top": [[t, p.pid, p.command, p.user, p.container_id, p.cpu_pct, p.memory_rss_mib] for t, p in self.top],
        }
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)

    @classmethod
    def decode(cls, blob: bytes) -> Columns:
        doc = json.loads(zlib.decompress(blob))
        if doc.get("v") != FORMAT:
            raise ValueError(f"node history format {doc.get('v')!r}, not {FORMAT}")
        top = [(t, ProcessPeak(pid, cmd, user, cid, cpu, rss, datetime.fromtimestamp(t, UTC))) for t, pid, cmd, user, cid, cpu, rss in doc["top"]]
        return cls(times=doc["t"], samples=doc["n"], series=doc["s"], top=top)


# --- the store ------------------------------------------------------------------------------


HourKey = tuple[str, datetime]
"""(node id, start of the hour): one row of the store."""


async def write(session: AsyncSession, minutes: Mapping[str, Sequence[Minute]]) -> int:
    """Each node's finished minutes as rows of their own (a minute written again replaces
    itself); the rows written. One small blob per minute, whatever its hour holds already."""
    rows = [{"node_id": node, "minute": m.minute, "figures": Columns.of([m]).encode()} for node, these in minutes.items() for m in these]
    by_minute: dict[datetime, list[str]] = {}
    for row in rows:
        by_minute.setdefault(row["minute"], []).append(row["node_id"])
    for minute, nodes in by_minute.items():  # a batch is a minute or two of the fleet
        for at in range(0, len(nodes), 500):
            await session.execute(delete(NodeMinute).where(NodeMinute.minute == minute, NodeMinute.node_id.in_(nodes[at : at + 500])))
    if rows:
        await session.execute(insert(NodeMinute), rows)
    return len(rows)


async def hours_to_fold(session: AsyncSession, before: datetime, limit: int) -> list[HourKey]:
    """Up to `limit` node-hours that ended by `before` and still have minutes of their own."""
    keys: dict[HourKey, None] = {}
    rows = await session.execute(
        select(NodeMinute.node_id, NodeMinute.minute).where(NodeMinute.minute < hour_of(before))
        .order_by(NodeMinute.node_id, NodeMinute.minute).limit(limit * 60)
    )
    for node_id, minute in rows:
        keys[(node_id, hour_of(minute))] = None
        if len(keys) > limit:
            break
    return list(keys)[:limit]


async def fold(session: AsyncSession, keys: Sequence[HourKey]) -> int:
    """Fold each node-hour's minutes into its hour's row (with what that row held), and forget
    them; the minutes folded."""
    folded = 0
    for node_id, hour in keys:
        end = hour + timedelta(hours=1)
        inside = (NodeMinute.node_id == node_id, NodeMinute.minute >= hour, NodeMinute.minute < end)
        blobs = (await session.scalars(select(NodeMinute.figures).where(*inside).order_by(NodeMinute.minute))).all()
        if not blobs:
            continue
        held = await session.scalar(select(NodeHour.figures).where(NodeHour.node_id == node_id, NodeHour.hour == hour))
        columns = Columns.decode(held) if held is not None else Columns()
        for blob in blobs:
            columns.merge(Columns.decode(blob))
        await session.execute(delete(NodeHour).where(NodeHour.node_id == node_id, NodeHour.hour == hour))
        await session.execute(insert(NodeHour), [{"node_id": node_id, "hour": hour, "figures": columns.encode()}])
        await session.execute(delete(NodeMinute).where(*inside))
        folded += len(blobs)
    return folded


async def prune(session: AsyncSession, before: datetime) -> int:
    """Forget every hour that ended before `before` (and minutes before it not yet folded); the
    number of node-hours gone."""
    result = await session.execute(delete(NodeHour).where(NodeHour.hour <= before - timedelta(hours=1)))
    await session.execute(delete(NodeMinute).where(NodeMinute.minute < before))
    return result.rowcount or 0


@dataclass(frozen=True)
class Series:
    label: str
    values: list[float | None]


@dataclass(frozen=True)
class Chart:
    """One chart's data: its lines over the history's shared times."""

    key: str
    title: str
    unit: str
    series: list[Series]


@dataclass(frozen=True)
class History:
    node_id: str
    start: datetime
    end: datetime
    step_s: int
    """Seconds per point: 60 (a minute), more where the window had more minutes than points."""
    times: list[int]
    charts: list[Chart]
    top: list[ProcessPeak]
    """The busiest processes over the whole window, with their peaks."""
    minutes: int
    """Minutes of the window that had samples."""

    source: str = "the store"
    """Where the charts came from; "the store" and Prometheus's URL where it gave the GPU figures."""

    @property
    def empty(self) -> bool:
        return not self.charts and not self.top

    def chart(self, key: str) -> Chart | None:
        return next((c for c in self.charts if c.key == key), None)

    @property
    def first_at(self) -> datetime | None:
        """The first point that has a figure (a young node's history starts late in its window)."""
        for i, at in enumerate(self.times):
            if any(series.values[i] is not None for chart in self.charts for series in chart.series if i < len(series.values)):
                return datetime.fromtimestamp(at, UTC)
        return None

    def replacing(self, charts: Sequence[Chart], source: str) -> History:
        """This history with `charts` in place of the store's charts of the same keys (or added
        before the others, in their order), over the same times."""
        theirs = {c.key for c in charts}
        return dataclasses.replace(self, charts=[*charts, *(c for c in self.charts if c.key not in theirs)], source=source)

    def as_json(self) -> dict[str, Any]:
        return {
            "node_id": self.node_id,
            "start": self.start.isoformat(),
            "end": self.end.isoformat(),
            "step_s": self.step_s,
            "times": self.times,
            "charts": [
                {"id": c.key, "title": c.title, "unit": c.unit, "series": [{"label": s.label, "values": s.values} for s in c.series]}
                for c in self.charts
            ],
        }


async def read(session: AsyncSession, node_id: str, start: datetime, end: datetime, *, max_points: int = 720) -> History:
    blobs = (
        await session.scalars(
            select(NodeHour.figures)
            .where(NodeHour.node_id == node_id, NodeHour.hour >= hour_of(start), NodeHour.hour <= end)
            .order_by(NodeHour.hour)
        )
    ).all()
    minutes = (
        await session.scalars(
            select(NodeMinute.figures)
            .where(NodeMinute.node_id == node_id, NodeMinute.minute >= minute_of(start), NodeMinute.minute <= end)
            .order_by(NodeMinute.minute)
        )
    ).all()
    columns = Columns()
    for blob in [*blobs, *minutes]:  # minutes not folded yet come after their hours, or among them while folding
        columns.merge(Columns.decode(blob))
    return summarise(node_id, start, end, columns, max_points=max_points)


GPU_CHARTS = (
    ("gpu_util", "GPU utilisation", "%", "util_pct", 1.0),
    ("gpu_memory", "GPU memory used", "GiB", "memory_used_mib", 1 / 1024),
    ("gpu_temperature", "GPU temperature", "°C", "temperature_c", 1.0),
    ("gpu_power", "GPU power", "W", "power_w", 1.0),
    ("gpu_clock", "SM clock", "MHz", "sm_clock_mhz", 1.0),
)
HOST_CHARTS = (
    ("host_memory", "Host memory", "GiB", (("used", "host.memory_used_mib"), ("total", "host.memory_total_mib"), ("swap used", "host.swap_used_mib")), 1 / 1024),
    ("host_load", "Load (1 min)", "", (("load", "host.load_1m"), ("CPUs", "host.cpus")), 1.0),
    ("jobs", "Jobs the node reports", "jobs", (("running", "host.jobs_running"),), 1.0),
)


def summarise(node_id: str, start: datetime, end: datetime, columns: Columns, *, max_points: int = 720) -> History:
    """Columns into charts: buckets of `step` minutes from the window's first minute, a mean of the
    means and a peak of the peaks; a bucket without samples is a gap (None), not a zero. A figure
    no minute had (a node without clocks, say) is left out rather than drawn empty."""
    span_min = max(1, math.ceil((end - start).total_seconds() / 60))
    step = max(1, math.ceil(span_min / max_points))
    first = int(minute_of(start).timestamp())
    count = max(1, math.ceil(span_min / step))
    index = [(t - first) // 60 // step for t in columns.times]
    inside = [i for i, b in enumerate(index) if 0 <= b < count]

    def bucketed(name: str, scale: float) -> list[float | None]:
        values = columns.series.get(name)
        if values is None:
            return [None] * count
        mean = _is_mean(name)
        sums: list[float | None] = [None] * count
        counts = [0] * count
        for i in inside:
            v = values[i]
            if v is None:
                continue
            b = index[i]
            s = sums[b]
            if mean:
                sums[b] = v if s is None else s + v
                counts[b] += 1
            elif s is None or v > s:
                sums[b] = v
        if mean:
            return [None if s is None else round(s / c * scale, 2) for s, c in zip(sums, counts, strict=True)]
        return [None if s is None else round(s * scale, 2) for s in sums]

    gpus = sorted({int(name[3:].partition(".")[0]) for name in columns.series if name.startswith("gpu")})
    charts = [
        Chart(key, title, unit, [Series(f"GPU {g}", bucketed(f"gpu{g}.{figure}", scale)) for g in gpus])
        for key, title, unit, figure, scale in GPU_CHARTS
    ]
    charts += [Chart(key, title, unit, [Series(label, bucketed(name, scale)) for label, name in lines]) for key, title, unit, lines, scale in HOST_CHARTS]
    disks = sorted(name for name in columns.series if name.startswith("disk:"))
    charts.append(Chart("disks", "Disk use", "%", [Series(name.removeprefix("disk:"), bucketed(name, 1.0)) for name in disks]))
    charts = [Chart(c.key, c.title, c.unit, kept) for c in charts if (kept := [s for s in c.series if any(v is not None for v in s.values)])]
    peaks: dict[tuple[int, str], ProcessPeak] = {}
    low, high = first, first + count * step * 60
    for t, p in columns.top:
        if low <= t < high:
            known = peaks.get((p.pid, p.command))
            if known is None:
                peaks[(p.pid, p.command)] = ProcessPeak(**vars(p))
            else:
                known.merge(p)
    return History(
        node_id=node_id, start=start, end=end, step_s=step * 60, times=[first + i * step * 60 for i in range(count)], charts=charts,
        top=busiest(peaks.values(), 2 * TOP_KEEP), minutes=len(inside),
    )
