"""The node's immediate events, between samples: an XID error, a GPU lost, an OOM kill, a container
exit. Pure, as `readings` is: what a watcher found in, a valid event (or None, for a reading
nothing can be pointed at) out."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime

from gpumedic_events import ContainerExited, GpuLost, GpuXidReported, ProcessOomKilled
from gpumedic_events.redact import redact
from gpumedic_events.xid import XID_CATALOGUE

from node_sampler.readings import MAX_GPUS, MAX_LABEL, MAX_PID, SOURCE, NvmlReading, clean_text

SIGNALS = {
    129: "SIGHUP",
    130: "SIGINT",
    131: "SIGQUIT",
    134: "SIGABRT",
    135: "SIGBUS",
    136: "SIGFPE",
    137: "SIGKILL",
    139: "SIGSEGV",
    141: "SIGPIPE",
    143: "SIGTERM",
}
"""Exit codes above 128 a container gets when a signal ended its main process."""


@dataclass(frozen=True)
class XidReading:
    """One XID error from the NVML event set."""

    xid: int
    gpu_index: int | None = None
    gpu_uuid: str | None = None


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
    engine_signal: str | None = None
    """The signal the engine itself sent before the exit (docker stop, kill, restart), if it did."""
    logs_lost: str | None = None
    """Why its last log lines could not be read (the container removed, a driver that keeps none)."""


def xid_event(node_id: str, reading: XidReading, occurred_at: datetime) -> GpuXidReported:
    index = reading.gpu_index if reading.gpu_index is not None and 0 <= reading.gpu_index < MAX_GPUS else None
    return GpuXidReported(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        gpu_index=index,
        gpu_uuid=(reading.gpu_uuid or "")[:MAX_LABEL],
        xid=min(max(reading.xid, 0), 2**32 - 1),
        description=info.meaning if (info := XID_CATALOGUE.get(reading.xid)) else "",
    )


def lost_gpus(previous: Mapping[int, str], reading: NvmlReading) -> dict[int, str]:
    """index -> uuid of every GPU this reading says is lost (`previous` carries UUIDs read before)."""
    return {g.index: g.uuid or previous.get(g.index, "") for g in reading.gpus if g.lost and 0 <= g.index < MAX_GPUS}


def gpu_lost_event(node_id: str, index: int, uuid: str, reason: str, occurred_at: datetime) -> GpuLost:
    return GpuLost(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        gpu_index=index,
        gpu_uuid=uuid[:MAX_LABEL],
        reason=reason[:200],
    )


def oom_event(node_id: str, reading: OomKillReading, occurred_at: datetime) -> ProcessOomKilled | None:
    """None for a pid no process can have (a garbled kernel line)."""
    if not 1 <= reading.pid <= MAX_PID:
        return None
    return ProcessOomKilled(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        pid=reading.pid,
        process_name=reading.process_name[:64],
        uid=reading.uid if reading.uid is not None and reading.uid >= 0 else None,
        constraint=reading.constraint[:64],
        cgroup=reading.cgroup[:512],
        container_id=reading.container_id[:128],
        anon_rss_kib=reading.anon_rss_kib if reading.anon_rss_kib is not None and reading.anon_rss_kib >= 0 else None,
        kernel_lines=tuple(clean_text(line) for line in reading.kernel_lines[-16:]),
    )


def container_event(node_id: str, reading: ContainerExitReading, occurred_at: datetime) -> ContainerExited | None:
    """None for an exit without a container id (nothing to point at)."""
    if not reading.container_id:
        return None
    return ContainerExited(
        source=SOURCE,
        occurred_at=occurred_at,
        node_id=node_id,
        container_id=reading.container_id[:128],
        name=reading.name[:256],
        image=reading.image[:512],
        exit_code=reading.exit_code,
        oom_killed=reading.oom_killed,
        signal=SIGNALS.get(reading.exit_code),
        finished_at=reading.finished_at if reading.finished_at and reading.finished_at.tzinfo else None,
        last_log_lines=tuple(clean_text(redact(line)) for line in reading.last_log_lines[-50:]),
        engine_signal=reading.engine_signal[:16] if reading.engine_signal else None,
        logs_lost=reading.logs_lost[:300] if reading.logs_lost else None,
    )
