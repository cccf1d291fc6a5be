"""Pure decisions of the sampler: turning raw readings into a valid `NodeSampled`, and when to tick.

The readers (NVML, /proc, probes) hand over plain data exactly as they found it; everything
that must hold for the event to validate (ranges, lengths, counts) is enforced here, so one odd
reading becomes a note in `errors` instead of a sample that cannot be built. Tested without a
broker, a GPU or a clock.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime

from gpumedic_events import (
    CpuPressure,
    ComputeMode,
    ContainerUsage,
    DeviceHolder,
    DiskUsage,
    GpuHealth,
    GpuProcess,
    GpuSample,
    HostSample,
    IbPort,
    JobsObservation,
    JobTag,
    NodeSampled,
    NvLinkSample,
    TopProcess,
)
from gpumedic_events.faults import MAX_LINE
from gpumedic_events.redact import redact
from pydantic import ValidationError

from node_sampler.procs import ProcessInfo, ProcessUsage

SOURCE = "node-sampler"
MAX_GPUS = 64
MAX_PROCESSES_PER_GPU = 256
MAX_ERRORS = 64
MAX_COMMAND = 4096
MAX_LABEL = 96
MAX_PID = 4_194_304
MAX_HOLDERS = 256
MAX_NVLINKS = 64
MAX_CLOCK_MHZ = 100_000
MIB = 1024 * 1024
KIB_PER_MIB = 1024

COMPUTE_MODES = {
    0: ComputeMode.DEFAULT,
    1: ComputeMode.EXCLUSIVE_THREAD,
    2: ComputeMode.PROHIBITED,
    3: ComputeMode.EXCLUSIVE_PROCESS,
}

_ANSI = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]")
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f-\x9f]")


@dataclass(frozen=True)
class RawProcess:
    """A compute process as NVML listed it."""

    pid: int
    used_memory_bytes: int | None = None


@dataclass(frozen=True)
class RawNvLink:
    """One NVLink as NVML answered: up or not, and its error counters."""

    link: int
    up: bool
    replay_errors: int | None = None
    recovery_errors: int | None = None
    crc_errors: int | None = None


@dataclass(frozen=True)
class RawHealth:
    """A GPU's slowly changing figures (GpuHealth's fields, in the same units); None where unread."""

    sm_clock_max_mhz: int | None = None
    memory_clock_mhz: int | None = None
    memory_clock_max_mhz: int | None = None
    temperature_slowdown_c: int | None = None
    temperature_shutdown_c: int | None = None
    temperature_max_operating_c: int | None = None
    memory_temperature_max_c: int | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    pcie_replay_count: int | None = None
    ecc_corrected_aggregate: int | None = None
    ecc_uncorrected_aggregate: int | None = None
    remapped_rows_corrected: int | None = None
    remapped_rows_uncorrected: int | None = None
    retired_pages: int | None = None
    fan_speed_pct: int | None = None
    nvlink_count: int | None = None
    nvlinks: tuple[RawNvLink, ...] = ()


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
    sm_clock_mhz: int | None = None
    clock_event_reasons: int | None = None
    memory_temperature_c: int | None = None
    health: RawHealth | None = None
    """Read at the slower cadence only; None in the other samples."""


@dataclass(frozen=True)
class NvmlReading:
    """Every GPU of the node, and what could not be read."""

    gpus: tuple[RawGpu, ...] = ()
    errors: tuple[str, ...] = ()
    unavailable: str | None = None
    """Why NVML could not be used at all (it then reads no GPU); None when it answered."""


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
    cpu_pressure: CpuPressure | None = None
    """/proc/pressure/cpu (None: a kernel without PSI)."""
    disks: tuple[RawDisk, ...] = ()
    errors: tuple[str, ...] = ()
    top: tuple[TopReading, ...] = ()
    """The busiest processes, as of the sampler's last look at all of them."""
    ib_ports: tuple[IbPort, ...] = ()
    """The InfiniBand and RoCE ports (`node_sampler.nics`), already validated."""
    containers: tuple[ContainerUsage, ...] = ()
    """Each running container's CPU and memory, as of the sampler's last look (`node_sampler.cgroups`)."""


@dataclass(frozen=True)
class TopReading:
    """One busy process: its CPU use between two looks, and its memory at the second."""

    info: ProcessInfo
    cpu_pct: float
    rss_kib: int


TOP_EACH = 5
"""How many processes `top_processes` keeps by CPU, and how many by memory."""


def top_processes(
    before: Mapping[int, ProcessUsage],
    after: Mapping[int, ProcessUsage],
    elapsed_s: float,
    describe: Callable[[int], ProcessInfo | None],
    each: int = TOP_EACH,
) -> tuple[TopReading, ...]:
    """The `each` busiest processes by CPU between two looks `elapsed_s` apart, and the `each`
    largest by resident memory at the second, busiest first. A process seen once (new, or its pid
    recycled: the start time differs) has no CPU figure yet and ranks by memory only."""
    cpu: dict[int, float] = {}
    for pid, now in after.items():
        then = before.get(pid)
        if then is not None and then.start_ticks == now.start_ticks and elapsed_s > 0:
            cpu[pid] = max(0.0, now.cpu_s - then.cpu_s) / elapsed_s * 100.0
    by_cpu = sorted((pid for pid in cpu if cpu[pid] > 0), key=lambda pid: -cpu[pid])[:each]
    by_memory = sorted(after, key=lambda pid: -after[pid].rss_kib)[:each]
    chosen = list(dict.fromkeys([*by_cpu, *by_memory]))
    top = []
    for pid in chosen:
        info = describe(pid)
        if info is not None:
            top.append(TopReading(info=info, cpu_pct=round(cpu.get(pid, 0.0), 1), rss_kib=after[pid].rss_kib))
    return tuple(top)


@dataclass(frozen=True)
class JobsReading:
    """What one job probe found; a field it does not measure stays None."""

    running: int | None = None
    output_growing: bool | None = None
    errors: tuple[str, ...] = field(default=())


ContainerExists = Callable[[str], bool | None]
"""Asks the container engine whether a container id still exists; None: cannot tell."""


def assemble_sample(
    *,
    node_id: str,
    interval_s: float,
    occurred_at: datetime,
    nvml: NvmlReading,
    processes: Mapping[int, ProcessInfo],
    jobs: Sequence[JobsReading],
    errors: Sequence[str] = (),
    host: HostReading | None = None,
    holders: Mapping[int, tuple[str, ...]] | None = None,
    container_exists: ContainerExists | None = None,
    unacknowledged: int = 0,
    due_at: datetime | None = None,
    missed_ticks: int = 0,
    sampler_cpu_pressure: CpuPressure | None = None,
) -> NodeSampled:
    """The sample for one interval; never raises for odd readings, it notes them instead.

    `holders` maps every pid holding a /dev/nvidia* file to those files; the ones with no
    compute context on any GPU become `device_holders` (described from `processes`).
    """
    notes: list[str] = list(nvml.errors)
    identity = _Identity(processes, occurred_at, container_exists)
    gpus = [_gpu_sample(raw, identity, notes) for raw in nvml.gpus[:MAX_GPUS]]
    if len(nvml.gpus) > MAX_GPUS:
        notes.append(f"{len(nvml.gpus) - MAX_GPUS} GPUs beyond the first {MAX_GPUS} left out")
    with_context = {p.pid for raw in nvml.gpus for p in (raw.processes or ())}
    device_holders = _device_holders(holders or {}, with_context, identity, notes)
    observation = merge_jobs(jobs)
    for reading in jobs:
        notes.extend(reading.errors)
    if host is not None:
        notes.extend(host.errors)
    notes.extend(errors)
    return NodeSampled(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        interval_s=interval_s,
        gpus=tuple(gpus),
        device_holders=device_holders,
        host=host_sample(host) if host is not None else HostSample(),
        jobs=observation,
        errors=cap_errors(notes),
        nvml_error=_clip(nvml.unavailable, 300) if nvml.unavailable else None,
        unacknowledged=unacknowledged,
        due_at=due_at,
        missed_ticks=missed_ticks,
        sampler_cpu_pressure=sampler_cpu_pressure,
    )


def host_sample(reading: HostReading) -> HostSample:
    """Bytes and KiB into the event's MiB; impossible values (negative, used > total) dropped."""
    swap_used = None
    if reading.swap_total_kib is not None and reading.swap_free_kib is not None:
        swap_used = max(0, reading.swap_total_kib - reading.swap_free_kib)
    load = reading.load if reading.load and all(math.isfinite(x) and x >= 0 for x in reading.load) else None
    disks = []
    for d in reading.disks[:32]:
        if min(d.total_bytes, d.used_bytes, d.available_bytes) < 0:
            continue
        denominator = d.used_bytes + d.available_bytes
        used_pct = 100.0 * d.used_bytes / denominator if denominator else 0.0
        disks.append(
            DiskUsage(
                path=_clip(d.path, 256),
                total_bytes=d.total_bytes,
                used_bytes=d.used_bytes,
                available_bytes=d.available_bytes,
                used_pct=round(min(100.0, used_pct), 2),
            )
        )
    return HostSample(
        memory_total_mib=_kib_to_mib(reading.memory_total_kib),
        memory_available_mib=_kib_to_mib(reading.memory_available_kib),
        swap_total_mib=_kib_to_mib(reading.swap_total_kib),
        swap_used_mib=_kib_to_mib(swap_used),
        load_1m=load[0] if load else None,
        load_5m=load[1] if load else None,
        load_15m=load[2] if load else None,
        cpus=reading.cpus if reading.cpus and reading.cpus > 0 else None,
        cpu_pressure=reading.cpu_pressure,
        disks=tuple(disks),
        top_processes=tuple(
            TopProcess(
                pid=t.info.pid,
                command=_clip(_masked_command(t.info.command), 256),
                user=_clip(t.info.user, 64),
                container_id=_clip(t.info.container_id, 128),
                cpu_pct=t.cpu_pct if math.isfinite(t.cpu_pct) else 0.0,
                memory_rss_mib=t.rss_kib // 1024,
            )
            for t in reading.top[:16]
            if 1 <= t.info.pid <= MAX_PID
        ),
        ib_ports=reading.ib_ports[:32],
        containers=reading.containers[:64],
    )


_masked_command = functools.lru_cache(maxsize=1024)(redact)
"""Masking costs about 30 µs a command line, and a node's processes report the same ones every
sample: each is masked once."""


def clean_text(text: str, limit: int = MAX_LINE) -> str:
    """Text from a node (a log or kernel line, a name) safe to carry: terminal escapes and control
    characters out (tab stays), cut at `limit`."""
    return _CONTROL.sub("", _ANSI.sub("", text))[:limit]


def merge_jobs(readings: Sequence[JobsReading]) -> JobsObservation:
    """One observation from several probes: the first probe (in configured order) that
    measured the job count gives it. The status endpoint is configured before the process
    count, so the node's own claim wins and the count stands in when the endpoint cannot be
    read; the failure stays visible in `errors`. Output grows when any measure of it grew (bytes
    or rows), stands still when the others that measured it say so."""
    running = next((r.running for r in readings if r.running is not None), None)
    measured = [r.output_growing for r in readings if r.output_growing is not None]
    growing = any(measured) if measured else None
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


@dataclass(frozen=True)
class _Identity:
    """Turns a pid into the event's identity fields, from what /proc said about it."""

    processes: Mapping[int, ProcessInfo]
    at: datetime
    container_exists: ContainerExists | None

    def write_bytes(self, pid: int) -> int | None:
        info = self.processes.get(pid)
        return info.write_bytes if info is not None and info.write_bytes is not None and info.write_bytes >= 0 else None

    def job(self, pid: int, notes: list[str]) -> JobTag | None:
        info = self.processes.get(pid)
        if info is None or info.job is None:
            return None
        try:
            return JobTag(**asdict(info.job))
        except ValidationError as exc:
            notes.append(f"pid {pid}: its job {_first_error(exc)}, left out")
            return None

    def fields(self, pid: int) -> dict:
        info = self.processes.get(pid)
        if info is None:
            return {"pid": pid}
        age = None
        if info.started_at is not None and info.started_at.tzinfo is not None:
            age = max(0.0, round((self.at - info.started_at).total_seconds(), 1))
        container_id = _clip(info.container_id, 128)
        return {
            "pid": pid,
            "start_ticks": info.start_ticks if info.start_ticks is None or info.start_ticks >= 0 else None,
            "command": _clip(_masked_command(info.command), MAX_COMMAND),  # other people's secrets stay on the node
            "user": _clip(info.user, 64),
            "started_at": info.started_at if age is not None else None,
            "age_s": age,
            "cgroup": _clip(info.cgroup, 512),
            "container_id": container_id,
            "container_exists": self.container_exists(container_id)
            if container_id and self.container_exists is not None
            else None,
        }


def _device_holders(
    holders: Mapping[int, tuple[str, ...]], with_context: set[int], identity: _Identity, notes: list[str]
) -> tuple[DeviceHolder, ...]:
    pids = sorted(pid for pid in holders if pid not in with_context and 1 <= pid <= MAX_PID)
    if len(pids) > MAX_HOLDERS:
        notes.append(f"{len(pids) - MAX_HOLDERS} /dev/nvidia* holders beyond the first {MAX_HOLDERS} left out")
    return tuple(
        DeviceHolder(**identity.fields(pid), devices=tuple(_clip(d, 64) for d in sorted(holders[pid])[:80]))
        for pid in pids[:MAX_HOLDERS]
    )


def _gpu_sample(raw: RawGpu, identity: _Identity, notes: list[str]) -> GpuSample:
    where = f"gpu {raw.index}"
    procs: list[GpuProcess] = []
    for p in (raw.processes or ())[:MAX_PROCESSES_PER_GPU]:
        if not 1 <= p.pid <= MAX_PID:
            notes.append(f"{where}: pid {p.pid} out of range, left out")
            continue
        procs.append(
            GpuProcess(
                **identity.fields(p.pid), used_memory_mib=_mib(p.used_memory_bytes), write_bytes=identity.write_bytes(p.pid),
                job=identity.job(p.pid, notes),
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
        temperature_c=_bounded(raw.temperature_c, -50, 200, f"{where} temperature", notes),
        power_w=_watts(raw.power_mw),
        power_limit_w=_watts(raw.power_limit_mw),
        ecc_uncorrected_volatile=_count(raw.ecc_uncorrected_volatile),
        ecc_corrected_volatile=_count(raw.ecc_corrected_volatile),
        retired_pages_pending=raw.retired_pages_pending,
        remapped_rows_pending=raw.remapped_rows_pending,
        remapped_rows_failed=raw.remapped_rows_failed,
        compute_mode=COMPUTE_MODES.get(raw.compute_mode) if raw.compute_mode is not None else None,
        lost=raw.lost,
        sm_clock_mhz=_bounded(raw.sm_clock_mhz, 0, MAX_CLOCK_MHZ, f"{where} SM clock", notes),
        clock_event_reasons=_bounded(raw.clock_event_reasons, 0, 2**63 - 1, f"{where} clock event reasons", notes),
        memory_temperature_c=_bounded(raw.memory_temperature_c, -50, 200, f"{where} memory temperature", notes),
        health=_health(raw.health, where, notes) if raw.health is not None else None,
    )


def _health(raw: RawHealth, where: str, notes: list[str]) -> GpuHealth:
    """GpuHealth from the raw figures; a figure out of the event's range is noted and left out."""
    fields = {name: getattr(raw, name) for name in GpuHealth.model_fields if name != "nvlinks"}
    links: list[NvLinkSample] = []
    # a healthy link says nothing the count does not: 18 of them per GPU would double the sample
    for link in raw.nvlinks[:MAX_NVLINKS]:
        if link.up and not (link.replay_errors or link.recovery_errors or link.crc_errors):
            continue
        try:
            links.append(NvLinkSample(**asdict(link)))
        except ValidationError as exc:
            notes.append(f"{where} NVLink {link.link}: {_first_error(exc)}, left out")
    while True:
        try:
            return GpuHealth(**fields, nvlinks=tuple(links))
        except ValidationError as exc:
            # drop each field the model refuses and say so; the rest of the figures still count
            bad = {str(error["loc"][0]) for error in exc.errors() if error["loc"] and error["loc"][0] in fields}
            if not bad:
                notes.append(f"{where} health: {_first_error(exc)}, left out")
                return GpuHealth()
            for name in sorted(bad):
                notes.append(f"{where} {name.replace('_', ' ')}: {fields.pop(name)!r} out of range")


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(str(part) for part in error['loc'])} {error['msg']}"


def _pct(value: int | None, what: str, notes: list[str]) -> int | None:
    if value is None:
        return None
    if not 0 <= value <= 100:
        notes.append(f"{what}: {value} is not a percentage")
        return None
    return value


def _bounded(value: int | None, low: int, high: int, what: str, notes: list[str]) -> int | None:
    if value is None:
        return None
    if not low <= value <= high:
        notes.append(f"{what}: {value} out of range")
        return None
    return value


def _watts(milliwatts: int | None) -> float | None:
    if milliwatts is None or milliwatts < 0 or milliwatts >= 2**32 - 1:
        return None
    return round(milliwatts / 1000, 1)


def _count(value: int | None) -> int | None:
    # NVML counters are 64-bit unsigned; "not available" is the largest value
    if value is None or value < 0 or value >= 2**63:
        return None
    return value


def _kib_to_mib(value: int | None) -> int | None:
    if value is None or value < 0:
        return None
    return value // KIB_PER_MIB


def _mib(value: int | None) -> int | None:
    # NVML reports "not available" as the largest unsigned value on some drivers
    if value is None or value < 0 or value >= 2**63:
        return None
    return value // MIB


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[:limit]
