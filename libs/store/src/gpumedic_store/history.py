"""A node's history: its sample figures one minute at a time, kept in the store for a day (by
default) where the samples stream keeps ten minutes.

`MinuteFolder` folds one node's samples of a minute into a `Minute`: utilisation, power and
clocks as means; memory, temperatures, swap, load and disk use as peaks (a spike that killed a
job must not be averaged away); the busiest processes as each one's peak CPU and memory. A
minute is one row (`NodeMinute`), its figures zlib-compressed JSON. `read` answers a window of
one node, merged into at most `max_points` buckets, as series a chart draws directly.
"""

from __future__ import annotations

import json
import math
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import delete, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_events import NodeSampled
from gpumedic_store.models import NodeMinute

GPU_MEANS = ("util_pct", "power_w", "sm_clock_mhz")
GPU_PEAKS = ("util_max_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "processes")
HOST_PEAKS = ("memory_used_mib", "memory_total_mib", "swap_used_mib", "load_1m", "cpus")
TOP_KEEP = 10
"""Processes a minute keeps: its busiest by peak CPU, then by peak memory."""
FORMAT = 1


def minute_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(second=0, microsecond=0)


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
    """What one node did in one minute; None where no sample of the minute had the figure."""

    minute: datetime
    samples: int = 0
    gpus: dict[int, dict[str, float | None]] = field(default_factory=dict)
    host: dict[str, float | None] = field(default_factory=dict)
    disks: dict[str, float] = field(default_factory=dict)
    """Path -> peak share in use, percent."""
    top: list[ProcessPeak] = field(default_factory=list)
    jobs_running: int | None = None

    def encode(self) -> bytes:
        doc = {
            "v": FORMAT,
            "n": self.samples,
            "gpus": {str(i): [g.get(k) for k in (*GPU_MEANS, *GPU_PEAKS)] for i, g in self.gpus.items()},
            "host": [self.host.get(k) for k in HOST_PEAKS],
            "disks": self.disks,
            "top": [[p.pid, p.command, p.user, p.container_id, p.cpu_pct, p.memory_rss_mib] for p in self.top],
            "jobs": self.jobs_running,
        }
        return zlib.compress(json.dumps(doc, separators=(",", ":")).encode(), 6)

    @classmethod
    def decode(cls, minute: datetime, blob: bytes) -> Minute:
        doc = json.loads(zlib.decompress(blob))
        gpu_keys = (*GPU_MEANS, *GPU_PEAKS)
        return cls(
            minute=minute,
            samples=doc.get("n", 0),
            gpus={int(i): dict(zip(gpu_keys, values, strict=False)) for i, values in doc.get("gpus", {}).items()},
            host=dict(zip(HOST_PEAKS, doc.get("host", []), strict=False)),
            disks=doc.get("disks", {}),
            top=[ProcessPeak(pid, cmd, user, cid, cpu, rss, minute) for pid, cmd, user, cid, cpu, rss in doc.get("top", [])],
            jobs_running=doc.get("jobs"),
        )


class MinuteFolder:
    """One node's samples of one minute, folded as they arrive (a few additions per figure)."""

    def __init__(self, minute: datetime) -> None:
        self.minute = minute
        self._n = 0
        self._gpu_sums: dict[int, dict[str, list[float]]] = {}
        """Per GPU and figure, [sum, count] for the means, [peak] for the peaks."""
        self._host: dict[str, float] = {}
        self._disks: dict[str, float] = {}
        self._top: dict[tuple[int, str], ProcessPeak] = {}
        self._jobs: int | None = None

    def add(self, sample: NodeSampled) -> None:
        self._n += 1
        for gpu in sample.gpus:
            sums = self._gpu_sums.setdefault(gpu.index, {})
            figures = {
                "util_pct": gpu.utilization_gpu_pct,
                "power_w": gpu.power_w,
                "sm_clock_mhz": gpu.sm_clock_mhz,
                "util_max_pct": gpu.utilization_gpu_pct,
                "memory_used_mib": gpu.memory_used_mib,
                "memory_total_mib": gpu.memory_total_mib,
                "temperature_c": gpu.temperature_c,
                "processes": len(gpu.processes),
            }
            for name, value in figures.items():
                if value is None:
                    continue
                if name in GPU_MEANS:
                    acc = sums.setdefault(name, [0.0, 0])
                    acc[0] += value
                    acc[1] += 1
                else:
                    acc = sums.setdefault(name, [value])
                    acc[0] = max(acc[0], value)
        host = sample.host
        used = None
        if host.memory_total_mib is not None and host.memory_available_mib is not None:
            used = max(0, host.memory_total_mib - host.memory_available_mib)
        for name, value in (
            ("memory_used_mib", used),
            ("memory_total_mib", host.memory_total_mib),
            ("swap_used_mib", host.swap_used_mib),
            ("load_1m", host.load_1m),
            ("cpus", host.cpus),
        ):
            if value is not None:
                self._host[name] = max(self._host.get(name, value), value)
        for disk in host.disks:
            self._disks[disk.path] = max(self._disks.get(disk.path, 0.0), disk.used_pct)
        for p in host.top_processes:
            peak = ProcessPeak(p.pid, p.command, p.user, p.container_id, p.cpu_pct, p.memory_rss_mib, sample.occurred_at)
            known = self._top.get((p.pid, p.command))
            if known is None:
                self._top[(p.pid, p.command)] = peak
            else:
                known.merge(peak)
        if sample.jobs.running is not None:
            self._jobs = sample.jobs.running

    def minute_figures(self) -> Minute:
        gpus: dict[int, dict[str, float | None]] = {}
        for index, sums in sorted(self._gpu_sums.items()):
            figures: dict[str, float | None] = {}
            for name in GPU_MEANS:
                acc = sums.get(name)
                figures[name] = round(acc[0] / acc[1], 1) if acc and acc[1] else None
            for name in GPU_PEAKS:
                acc = sums.get(name)
                figures[name] = acc[0] if acc else None
            gpus[index] = figures
        return Minute(
            minute=self.minute,
            samples=self._n,
            gpus=gpus,
            host=dict(self._host),
            disks={path: round(pct, 2) for path, pct in self._disks.items()},
            top=busiest(self._top.values(), TOP_KEEP),
            jobs_running=self._jobs,
        )


def busiest(processes: Iterable[ProcessPeak], keep: int) -> list[ProcessPeak]:
    """Half by peak CPU, then the rest by peak memory, busiest first; each once."""
    everyone = list(processes)
    by_cpu = sorted((p for p in everyone if p.cpu_pct > 0), key=lambda p: -p.cpu_pct)[: keep // 2]
    chosen = {id(p) for p in by_cpu}
    by_memory = [p for p in sorted(everyone, key=lambda p: -p.memory_rss_mib) if id(p) not in chosen]
    return [*by_cpu, *by_memory][:keep]


# --- the store ------------------------------------------------------------------------------


async def write(session: AsyncSession, node_id: str, minutes: Sequence[Minute]) -> None:
    """Add or replace these minutes of one node (a restarted report-builder may write one again)."""
    for m in minutes:
        await session.merge(NodeMinute(node_id=node_id, minute=m.minute, figures=m.encode()))


async def prune(session: AsyncSession, before: datetime) -> int:
    """Forget every minute before `before`; the number of rows gone."""
    result = await session.execute(delete(NodeMinute).where(NodeMinute.minute < before))
    return result.rowcount or 0


@dataclass(frozen=True)
class Series:
    label: str
    values: list[float | None]


@dataclass(frozen=True)
class Chart:
    """One chart's data: a shared time axis (seconds since the epoch) and its lines."""

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

    @property
    def empty(self) -> bool:
        return self.minutes == 0

    def chart(self, key: str) -> Chart | None:
        return next((c for c in self.charts if c.key == key), None)

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
    rows = (
        await session.execute(
            select(NodeMinute.minute, NodeMinute.figures)
            .where(NodeMinute.node_id == node_id, NodeMinute.minute >= minute_of(start), NodeMinute.minute <= end)
            .order_by(NodeMinute.minute)
        )
    ).all()
    return summarise(node_id, start, end, [Minute.decode(at, blob) for at, blob in rows], max_points=max_points)


def summarise(node_id: str, start: datetime, end: datetime, minutes: Sequence[Minute], *, max_points: int = 720) -> History:
    """Minutes into charts: buckets of `step` minutes, each starting at a multiple of it, a mean
    of the means and a peak of the peaks; a bucket without samples is a gap (None), not a zero."""
    span_min = max(1, math.ceil((end - start).total_seconds() / 60))
    step = max(1, math.ceil(span_min / max_points))
    first = minute_of(start)
    buckets: dict[int, list[Minute]] = {}
    for m in minutes:
        buckets.setdefault(int((m.minute - first).total_seconds() // 60) // step, []).append(m)
    count = max(1, math.ceil(span_min / step))
    times = [int((first + timedelta(minutes=i * step)).timestamp()) for i in range(count)]
    gpu_indexes = sorted({i for m in minutes for i in m.gpus})
    disk_paths = sorted({p for m in minutes for p in m.disks})

    def per_bucket(pick, *, mean: bool) -> list[float | None]:
        out: list[float | None] = []
        for i in range(count):
            values = [v for m in buckets.get(i, ()) if (v := pick(m)) is not None]
            if not values:
                out.append(None)
            else:
                out.append(round(sum(values) / len(values), 1) if mean else max(values))
        return out

    def gpu_series(name: str, scale: float = 1.0) -> list[Series]:
        series = []
        for index in gpu_indexes:
            values = per_bucket(lambda m, index=index: (m.gpus.get(index) or {}).get(name), mean=name in GPU_MEANS)
            series.append(Series(f"GPU {index}", [None if v is None else round(v * scale, 2) for v in values]))
        return series

    def host_series(label: str, name: str, scale: float = 1.0) -> Series:
        values = per_bucket(lambda m: m.host.get(name), mean=False)
        return Series(label, [None if v is None else round(v * scale, 2) for v in values])

    charts = []
    if gpu_indexes:
        charts += [
            Chart("gpu_util", "GPU utilisation", "%", gpu_series("util_pct")),
            Chart("gpu_memory", "GPU memory used", "GiB", gpu_series("memory_used_mib", 1 / 1024)),
            Chart("gpu_temperature", "GPU temperature", "°C", gpu_series("temperature_c")),
            Chart("gpu_power", "GPU power", "W", gpu_series("power_w")),
            Chart("gpu_clock", "SM clock", "MHz", gpu_series("sm_clock_mhz")),
        ]
    if any(m.host for m in minutes):
        charts.append(Chart("host_memory", "Host memory", "GiB", [
            host_series("used", "memory_used_mib", 1 / 1024),
            host_series("total", "memory_total_mib", 1 / 1024),
            host_series("swap used", "swap_used_mib", 1 / 1024),
        ]))
        charts.append(Chart("host_load", "Load (1 min)", "", [host_series("load", "load_1m"), host_series("CPUs", "cpus")]))
    if disk_paths:
        charts.append(Chart("disks", "Disk use", "%", [
            Series(path, per_bucket(lambda m, path=path: m.disks.get(path), mean=False)) for path in disk_paths
        ]))
    # a figure no sample had (a node without NVML clocks, say) is left out, not drawn as an empty chart
    charts = [
        Chart(c.key, c.title, c.unit, kept)
        for c in charts
        if (kept := [s for s in c.series if any(v is not None for v in s.values)])
    ]
    peaks: dict[tuple[int, str], ProcessPeak] = {}
    for m in minutes:
        for p in m.top:
            known = peaks.get((p.pid, p.command))
            if known is None:
                peaks[(p.pid, p.command)] = ProcessPeak(**vars(p))
            else:
                known.merge(p)
    return History(
        node_id=node_id, start=start, end=end, step_s=step * 60, times=times, charts=charts,
        top=busiest(peaks.values(), 2 * TOP_KEEP), minutes=len(minutes),
    )
