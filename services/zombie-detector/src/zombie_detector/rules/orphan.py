"""orphan_gpu_holder: a process holds a GPU that nothing the node runs owns.

Two ways a holder is an orphan, each seen for `held_for_s` on the detector's clock (a container
restarting in place shows its process briefly without its container):

- its container is gone: a compute process, or a process holding `/dev/nvidiaN` open without a
  compute context (which nvidia-smi does not list), whose container the engine no longer has.
  This is the leftover of a container restart, and the reason the next job dies with "CUDA-capable
  device is busy or unavailable";
- the node reports no job at all (`jobs.running == 0`, measured), yet an idle GPU holds a compute
  process.

The fix is to kill the holders, each named by pid, start time and command line, on a GPU that is
still idle. A holder that cannot be identified means a person instead. When kills do not free the
GPU (runbook 003: the driver's state outlives the container), the next rung restarts the whole
rented pod through the provider, offered only while nothing but orphans holds any of its GPUs: a
restart ends every job on the pod.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpumedic_events import IncidentKind, ProcessIdentity, RestartWorker
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import KillPolicy, OrphanPolicy
from zombie_detector.rules.base import Incidents, kill_operation

KIND = IncidentKind.ORPHAN_GPU_HOLDER
_NVIDIA_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")


@dataclass(frozen=True)
class Orphan:
    """One holder on one GPU (None: the holder's GPU cannot be told) and why it is an orphan."""

    gpu: int | None
    holder: ProcessIdentity
    why: str


def orphans(sample: Sample, idle_below_pct: int) -> list[Orphan]:
    found: list[Orphan] = []
    for gpu in sample.gpus:
        for p in gpu.processes:
            if p.pid < 2:
                continue
            if p.container_exists is False:
                found.append(Orphan(gpu.index, p, f"its container {p.container_id[:12]} is gone"))
            elif (
                sample.jobs.running == 0
                and gpu.utilization_gpu_pct is not None
                and gpu.utilization_gpu_pct < idle_below_pct
            ):
                found.append(Orphan(gpu.index, p, "the node reports no job, yet it holds the GPU"))
    for holder in sample.device_holders:
        if holder.pid >= 2 and holder.container_exists is False:
            indexes = {int(m[1]) for d in holder.devices if (m := _NVIDIA_DEVICE.match(d))}
            gpu = indexes.pop() if len(indexes) == 1 else None
            found.append(Orphan(gpu, holder, f"it holds /dev/nvidia* without a compute context, and its container {holder.container_id[:12]} is gone"))
    return found


class OrphanRule:
    inputs = (Sample,)

    def __init__(self, policy: OrphanPolicy, kill: KillPolicy) -> None:
        self.policy = policy
        self.kill = kill
        self.seen_since: dict[tuple[str, int | None, int], datetime] = {}
        """(node, gpu, pid) -> since when the detector has seen this holder as an orphan."""

    def observe(self, event: Sample, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        open_here = {i.gpu_index for i in incidents.open_on(event.node_id) if i.kind is KIND}
        found = orphans(event, self.policy.idle_below_pct)
        if not found and not open_here and not any(k[0] == event.node_id for k in self.seen_since):
            return ()
        by_gpu: dict[int | None, list[Orphan]] = {}
        live = set()
        for orphan in found:
            key = (event.node_id, orphan.gpu, orphan.holder.pid)
            live.add(key)
            since = self.seen_since.setdefault(key, now)
            if (now - since).total_seconds() >= self.policy.held_for_s or orphan.gpu in open_here:
                by_gpu.setdefault(orphan.gpu, []).append(orphan)
        for key in [k for k in self.seen_since if k[0] == event.node_id and k not in live]:
            del self.seen_since[key]
        orphan_pids = {o.holder.pid for o in found}
        only_orphans = all(p.pid in orphan_pids for g in event.gpus for p in g.processes)
        findings = [
            self._finding(event, gpu, held, restart=only_orphans,
                          held_s=max((now - self.seen_since[(event.node_id, gpu, o.holder.pid)]).total_seconds() for o in held))
            for gpu, held in by_gpu.items()
        ]
        # An open incident whose GPU shows no orphan any more is resolved; one the sample cannot judge
        # (the GPU missing, NVML gone) is left as it is.
        judged = {g.index for g in event.gpus} | ({None} if event.gpus else set())
        for gpu in open_here - set(by_gpu):
            if gpu in judged and not any(o.gpu == gpu for o in found):
                findings.append(Finding(KIND, event.node_id, gpu, present=False, summary=_gone(gpu)))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def _finding(self, sample: Sample, gpu: int | None, held: list[Orphan], *, restart: bool, held_s: float) -> Finding:
        pids = " ".join(str(o.holder.pid) for o in held)
        where = "a GPU" if gpu is None else f"GPU {gpu}"
        unidentified = [o.holder.pid for o in held if o.holder.start_ticks is None or not o.holder.command.strip()]
        operation = None
        if gpu is not None and not unidentified:
            operation = kill_operation(gpu, [o.holder for o in held], self.policy.idle_below_pct - 1, self.kill)
        unsafe = ""
        if unidentified:
            unsafe = f"pid {' '.join(map(str, unidentified))} on {where} cannot be identified (no start time or command line); a person must look"
        elif gpu is None:
            unsafe = f"pid {pids} holds several GPUs' device files or none that can be told; a person must look"
        return Finding(
            kind=KIND,
            node_id=sample.node_id,
            gpu_index=gpu,
            summary=f"{where} is held by pid {pids}, which nothing on the node owns: {held[0].why}",
            evidence={
                "holder_pids": pids,
                "held_s": round(held_s, 1),
                "commands": "; ".join(o.holder.command[:120] for o in held)[:500],
                "containers": " ".join(sorted({o.holder.container_id[:12] for o in held if o.holder.container_id})) or None,
                "why": held[0].why,
            },
            recommended_action=f"kill the leftover pid {pids} so the next job can use {where}",
            operations={
                **({"kill_gpu_processes": operation} if operation else {}),
                **({"restart_worker": RestartWorker()} if restart else {}),
            },
            unsafe=unsafe,
        )


def _gone(gpu: int | None) -> str:
    return f"{'the GPU' if gpu is None else f'GPU {gpu}'} is no longer held by a leftover process"
