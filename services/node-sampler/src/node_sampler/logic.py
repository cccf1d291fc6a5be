"""Pure decisions of the sampler: turning raw readings into a valid `NodeSampled`, and when to tick.

The readers (NVML, /proc, probes) hand over plain data exactly as they found it; everything
that must hold for the event to validate (ranges, lengths, counts) is enforced here, so one odd
reading becomes a note in `errors` instead of a sample that cannot be built. Tested without a
broker, a GPU or a clock.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from gpumedic_events import GpuProcess, GpuSample, JobsObservation, NodeSampled

from node_sampler.procs import ProcessInfo

SOURCE = "node-sampler"
MAX_GPUS = 64
MAX_PROCESSES_PER_GPU = 256
MAX_ERRORS = 64
MAX_COMMAND = 4096
MAX_LABEL = 96
MAX_PID = 4_194_304
MIB = 1024 * 1024


@dataclass(frozen=True)
class RawProcess:
    """A compute process as NVML listed it."""

    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True)
class RawGpu:
    """One GPU's NVML readings; None where a call failed."""

    index: int
    uuid: str | None = None
    name: str | None = None
    utilization_gpu_pct: int | None = None
    utilization_memory_pct: int | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    processes: tuple[RawProcess, ...] | None = None
    temperature_c: int | None = None
    power_mw: int | None = None
    power_limit_mw: int | None = None
    ecc_uncorrected_volatile: int | None = None
    ecc_corrected_volatile: int | None = None
    retired_pages_pending: bool | None = None
    remapped_rows_pending: bool | None = None
    remapped_rows_failed: bool | None = None
    compute_mode: int | None = None
    """NVML_COMPUTEMODE_*: 0 default, 1 exclusive thread, 2 prohibited, 3 exclusive process."""
    lost: bool = False
    """A call about this GPU raised NVMLError_GpuIsLost."""


@dataclass(frozen=True)
class NvmlReading:
    """Every GPU of the node, and what could not be read."""

    gpus: tuple[RawGpu, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class XidReading:
    """One XID error from the NVML event set."""

    xid: int
    gpu_index: int | None = None
    gpu_uuid: str | None = None


@dataclass(frozen=True)
class RawDisk:
    """statvfs of one configured path, in bytes."""

    path: str
    total_bytes: int
    used_bytes: int
    available_bytes: int


@dataclass(frozen=True)
class HostReading:
    """/proc/meminfo, /proc/loadavg, CPU count and the configured disks; None where unread."""

    memory_total_kib: int | None = None
    memory_available_kib: int | None = None
    swap_total_kib: int | None = None
    swap_free_kib: int | None = None
    load: tuple[float, float, float] | None = None
    cpus: int | None = None
    disks: tuple[RawDisk, ...] = ()
    errors: tuple[str, ...] = ()


@dataclass(frozen=True)
class OomKillReading:
    """One OOM kill as the kernel logged it."""

    pid: int
    process_name: str = ""
    uid: int | None = None
    constraint: str = ""
    cgroup: str = ""
    container_id: str = ""
    anon_rss_kib: int | None = None
    kernel_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class ContainerExitReading:
    """One container exit as the engine reported it."""

    container_id: str
    exit_code: int
    name: str = ""
    image: str = ""
    oom_killed: bool | None = None
    finished_at: datetime | None = None
    last_log_lines: tuple[str, ...] = ()


@dataclass(frozen=True)
class JobsReading:
    """What one job probe found; a field it does not measure stays None."""

    running: int | None = None
    output_growing: bool | None = None
    errors: tuple[str, ...] = field(default=())


def assemble_sample(
    *,
    node_id: str,
    interval_s: float,
    occurred_at: datetime,
    nvml: NvmlReading,
    processes: Mapping[int, ProcessInfo],
    jobs: Sequence[JobsReading],
    errors: Sequence[str] = (),
) -> NodeSampled:
    """The sample for one interval; never raises for odd readings, it notes them instead."""
    notes: list[str] = list(nvml.errors)
    gpus = [_gpu_sample(raw, processes, notes) for raw in nvml.gpus[:MAX_GPUS]]
    if len(nvml.gpus) > MAX_GPUS:
        notes.append(f"{len(nvml.gpus) - MAX_GPUS} GPUs beyond the first {MAX_GPUS} left out")
    observation = merge_jobs(jobs)
    for reading in jobs:
        notes.extend(reading.errors)
    notes.extend(errors)
    return NodeSampled(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        interval_s=interval_s,
        gpus=tuple(gpus),
        jobs=observation,
        errors=cap_errors(notes),
    )


def merge_jobs(readings: Sequence[JobsReading]) -> JobsObservation:
    """One observation from several probes: the first probe (in configured order) that
    measured a field gives it. The status endpoint is configured before the process count, so
    the node's own claim wins and the count stands in when the endpoint cannot be read; the
    failure stays visible in `errors`."""
    running = next((r.running for r in readings if r.running is not None), None)
    growing = next((r.output_growing for r in readings if r.output_growing is not None), None)
    if running is not None and running < 0:
        running = None
    return JobsObservation(running=running, output_growing=growing)


def cap_errors(notes: Sequence[str]) -> tuple[str, ...]:
    """At most MAX_ERRORS notes of bounded length; the last one says how many were dropped."""
    short = [n if len(n) <= 300 else n[:297] + "..." for n in notes]
    if len(short) <= MAX_ERRORS:
        return tuple(short)
    kept = short[: MAX_ERRORS - 1]
    return (*kept, f"and {len(short) - len(kept)} more")


def next_tick(start: float, now: float, interval_s: float, last_tick: int) -> int:
    """The index k of the next tick (due at start + k*interval) after tick `last_tick` ran.

    Ticks whose time has already passed are skipped, not run back to back: a sampler that was
    held up (a slow publish, a stalled host) resumes on the grid instead of bursting samples.
    """
    elapsed_ticks = math.floor((now - start) / interval_s)
    return max(last_tick + 1, elapsed_ticks + 1)


def _gpu_sample(raw: RawGpu, processes: Mapping[int, ProcessInfo], notes: list[str]) -> GpuSample:
    where = f"gpu {raw.index}"
    procs: list[GpuProcess] = []
    for p in (raw.processes or ())[:MAX_PROCESSES_PER_GPU]:
        if not 1 <= p.pid <= MAX_PID:
            notes.append(f"{where}: pid {p.pid} out of range, left out")
            continue
        info = processes.get(p.pid)
        procs.append(
            GpuProcess(
                pid=p.pid,
                start_ticks=info.start_ticks if info else None,
                command=_clip(info.command, MAX_COMMAND) if info else "",
                used_memory_mib=_mib(p.used_memory_bytes),
            )
        )
    if raw.processes is not None and len(raw.processes) > MAX_PROCESSES_PER_GPU:
        notes.append(f"{where}: {len(raw.processes) - MAX_PROCESSES_PER_GPU} processes left out")
    return GpuSample(
        index=raw.index,
        uuid=_clip(raw.uuid or "", MAX_LABEL),
        name=_clip(raw.name or "", MAX_LABEL),
        utilization_gpu_pct=_pct(raw.utilization_gpu_pct, f"{where} utilization", notes),
        utilization_memory_pct=_pct(raw.utilization_memory_pct, f"{where} memory utilization", notes),
        memory_used_mib=_mib(raw.memory_used_bytes),
        memory_total_mib=_mib(raw.memory_total_bytes),
        processes=tuple(procs),
    )


def _pct(value: int | None, what: str, notes: list[str]) -> int | None:
    if value is None:
        return None
    if not 0 <= value <= 100:
        notes.append(f"{what}: {value} is not a percentage")
        return None
    return value


def _mib(value: int | None) -> int | None:
    # NVML reports "not available" as the largest unsigned value on some drivers
    if value is None or value < 0 or value >= 2**63:
        return None
    return value // MIB


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]
