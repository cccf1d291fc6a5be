"""disk_pressure and host_memory_pressure: the host under the GPUs filling up.

Each opens at one threshold and clears at another (hysteresis), so a value that hovers around one
line does not open and close an incident every sample. Between the two lines nothing changes.
One disk_pressure incident per configured path (a full /var/lib/docker is not a full /data).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import DockerPrune, IncidentKind
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import DiskPolicy, MemoryPolicy
from zombie_detector.rules.base import Incidents

DISK = IncidentKind.DISK_PRESSURE
DOCKER_ROOT = "/var/lib/docker"
MEMORY = IncidentKind.HOST_MEMORY_PRESSURE


def path_key(path: str) -> str:
    """A disk path as a fingerprint part: / -> root, /var/lib/docker -> var-lib-docker."""
    key = re.sub(r"[^A-Za-z0-9_-]+", "-", path).strip("-_")[:63]
    return key or "root"


class HostRule:
    inputs = (Sample,)

    def __init__(self, disk: DiskPolicy, memory: MemoryPolicy) -> None:
        self.disk = disk
        self.memory = memory

    def observe(self, event: Sample, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        host = event.host
        findings: list[Finding] = []
        open_here: set[tuple[IncidentKind, str | None]] | None = None
        for disk in host.disks:
            if disk.used_pct >= self.disk.open_at_pct or disk.used_pct < self.disk.clear_below_pct:
                open_here = open_here if open_here is not None else _open(event, incidents)
                key = path_key(disk.path)
                if disk.used_pct >= self.disk.open_at_pct:
                    findings.append(self._disk(event, disk.path, key, disk.used_pct, disk.available_bytes))
                elif (DISK, key) in open_here:
                    findings.append(Finding(DISK, event.node_id, key=key, present=False, summary=f"{disk.path} is {disk.used_pct:.0f}% used again"))
        total, available = host.memory_total_mib, host.memory_available_mib
        if total and available is not None:
            pct = 100.0 * available / total
            if pct < self.memory.open_below_available_pct:
                findings.append(self._memory(event, pct, available, total))
            elif pct > self.memory.clear_above_available_pct:
                open_here = open_here if open_here is not None else _open(event, incidents)
                if (MEMORY, None) in open_here:
                    findings.append(Finding(MEMORY, event.node_id, present=False, summary=f"{pct:.0f}% of host memory is available again"))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def _disk(self, sample: Sample, path: str, key: str, used_pct: float, available: int) -> Finding:
        docker = path == DOCKER_ROOT
        return Finding(
            kind=DISK,
            node_id=sample.node_id,
            key=key,
            summary=f"{path} is {used_pct:.0f}% full ({available / 2**30:.1f} GiB left)",
            evidence={"path": path, "used_pct": round(used_pct, 1), "available_bytes": available},
            severity="critical" if used_pct >= 99 else "warning",
            recommended_action=(
                "free space under /var/lib/docker: docker system prune (stopped containers, dangling images, build cache)"
                if docker
                else f"free space on {path}: old checkpoints, logs, datasets"
            ),
            # Pruning frees Docker's own files; what fills any other disk is someone's data.
            operations={"docker_prune": DockerPrune()} if docker else {},
            unsafe="" if docker else f"only a person can say what on {path} may go; docker_prune frees {DOCKER_ROOT} only",
        )

    def _memory(self, sample: Sample, pct: float, available: int, total: int) -> Finding:
        return Finding(
            kind=MEMORY,
            node_id=sample.node_id,
            summary=f"only {pct:.1f}% of host memory is available ({available} of {total} MiB): the OOM killer is next",
            evidence={"available_pct": round(pct, 1), "available_mib": available, "total_mib": total},
            severity="warning",
            recommended_action="find what grows (ps --sort=-rss), give jobs a memory limit so one fails alone instead of the node",
        )


def _open(sample: Sample, incidents: Incidents) -> set[tuple[IncidentKind, str | None]]:
    return {(i.kind, i.key) for i in incidents.open_on(sample.node_id) if i.kind in (DISK, MEMORY)}
