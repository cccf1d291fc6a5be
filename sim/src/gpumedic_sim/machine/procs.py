"""The simulated node's process table, behind the node-sampler's `ProcessTable` interface. The
/proc files a shell reads over SSH are `SimProcess`'s own, so the sampler's view and the shell's
view of a process are the same by construction.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime, timedelta
from typing import Protocol

from gpumedic_events import ContainerUsage
from node_sampler.procs import ProcessInfo, ProcessUsage

from gpumedic_sim.machine.parts import CLK_TCK, OUTPUT_BYTES_PER_S, SimContainer, SimProcess

BUSY_CPUS = 3.0
"""CPUs a computing job keeps busy (its data loaders); a hung job or a leftover keeps almost none."""


class ProcNode(Protocol):
    """What /proc and the cgroups read of their node (`NodeState`'s)."""

    containers: dict[str, SimContainer]
    _boot: float
    """The node's boot on the monotonic clock."""
    _lock: threading.RLock

    def process(self, pid: int) -> SimProcess | None: ...
    def live_processes(self, gpu: int | None = None) -> list[SimProcess]: ...


class SimProcessTable:
    def __init__(self, node: ProcNode) -> None:
        self._node = node
        # the node's boot as a wall-clock time, fixed once (as /proc/stat's btime is): start
        # times are then boot + start_ticks / CLK_TCK, the same arithmetic as on a real node
        self.boot_time = datetime.now(UTC) - timedelta(seconds=time.monotonic() - node._boot)

    def describe(self, pid: int, errors: list[str] | None = None) -> ProcessInfo | None:
        p = self._node.process(pid)
        if p is None:
            if errors is not None:
                errors.append(f"pid {pid}: not in /proc (exited, or another pid namespace)")
            return None
        return ProcessInfo(
            pid=p.pid,
            start_ticks=p.start_ticks,
            command=p.command,
            user=p.user,
            cgroup=p.cgroup,
            container_id=p.container_id,
            started_at=self.boot_time + timedelta(seconds=p.start_ticks / CLK_TCK),
            write_bytes=p.output_bytes(time.monotonic()) + p.rows_bytes,
            job=p.job,
        )

    def pids(self, errors: list[str] | None = None) -> list[int]:
        return sorted(p.pid for p in self._node.live_processes())

    def device_holders(self, errors: list[str] | None = None) -> dict[int, tuple[str, ...]]:
        return {p.pid: tuple(sorted(p.devices)) for p in self._node.live_processes() if p.devices}

    def usage(self, errors: list[str] | None = None) -> dict[int, ProcessUsage]:
        """CPU time grows while a process computes or writes (as its output does); a job holds
        host memory in proportion to its GPU memory, anything else a little."""
        now = time.monotonic()
        return {
            p.pid: ProcessUsage(
                pid=p.pid,
                start_ticks=p.start_ticks,
                cpu_s=p.output_bytes(now) / OUTPUT_BYTES_PER_S * BUSY_CPUS + (now - p.started_at) * 0.01,
                rss_kib=(2 * 1024 * 1024 + p.used_mib * 256) if p.is_job else 300 * 1024,
            )
            for p in self._node.live_processes()
        }


CONTAINER_MEMORY_MIB = 6144
"""What a job's container holds in host memory (its data loaders, the page cache of its games)."""
CONTAINER_LIMIT_MIB = 65536
"""Its memory limit (docker run --memory 64g)."""


class SimContainerCgroups:
    """Each running container's cgroup counters, behind the node-sampler's `ContainerCgroups.read`:
    a computing job's container keeps BUSY_CPUS busy, an idle or hung one next to none."""

    def __init__(self, node: ProcNode) -> None:
        self._node = node

    def read(self, elapsed_s: float, notes: list[str] | None = None) -> tuple[ContainerUsage, ...]:
        with self._node._lock:
            busy = {p.container_id for p in self._node.live_processes() if p.container_id and p.producing}
            running = [c for c in self._node.containers.values() if c.running]
        return tuple(
            ContainerUsage(container_id=c.id, cpu_pct=BUSY_CPUS * 100 if c.id in busy and elapsed_s else 0.5,
                           memory_mib=CONTAINER_MEMORY_MIB, memory_limit_mib=CONTAINER_LIMIT_MIB)
            for c in running
        )
