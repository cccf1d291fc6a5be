"""container_died: a container exited abnormally, and the post-mortem names one cause; or a job's
process outside any container (a GPU process in the sampler's last look) was killed by the
kernel's OOM killer, which leaves no other trace (runbook 002's jobs "failing with exit code -9").

An exit waits `settle_s` (the facts of one death arrive apart: the engine's exit, the kernel's
OOM lines, the next sample showing a leftover process), then is judged once:

    exit 0, or 143 after the engine itself sent SIGTERM (a stop the node asked for)   -> nothing
    part of another story: gpumedic's own kill of that GPU's processes, or a container
        restart whose process lives on (orphan_gpu_holder opens for it)                -> nothing
    "busy or unavailable" in its last lines                  -> device_busy (another process holds the GPU)
    "CUDA out of memory" in its last lines                   -> gpu_oom
    137 with OOMKilled or a kernel OOM line for its PID or cgroup  -> cgroup_oom / host_oom
    a disk of the node 98 % full or more at the time, or "No space left" -> disk_full
    137 with neither                                          -> killed (eviction, preemption, a person)
    139                                                       -> segfault
    143                                                       -> sigterm (a preemption, a scheduler, a person)
    anything else non-zero                                    -> exited_with_error

Each cause carries its confidence, its evidence and the remedies the runbook gives the job's
owner. The incident needs a person (the job's owner); it closes after `clear_after_s` quietly.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpumedic_events import ContainerExited, ContainerUsage, Diagnosis, IncidentKind, ProcessOomKilled
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, IncidentState
from gpumedic_incidents.policy import ContainerPolicy
from zombie_detector.rules.base import Incidents

log = logging.getLogger(__name__)

KIND = IncidentKind.CONTAINER_DIED
OOM_MEMORY = timedelta(minutes=5)
"""How long a kernel OOM kill waits for the exit of its container."""
OWN_ACTION = timedelta(seconds=60)
"""An exit this soon after gpumedic asked to kill the node's GPU processes is that action's doing."""
DISK_FULL_PCT = 98.0
USAGE_FRESH = timedelta(seconds=120)
"""A container's usage older than this before its death says little of it (the sampler looks every 30 s)."""

Stopping = Callable[[str, Incidents], bool]
"""Whether gpumedic is stopping a job with ranks on that node (the job rule's `stopping`)."""

_DEVICE_BUSY = re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable|all CUDA-capable devices are busy", re.IGNORECASE)
_GPU_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED",
    re.IGNORECASE,
)
_NO_SPACE = re.compile(r"No space left on device|ENOSPC", re.IGNORECASE)

REMEDIES: dict[str, tuple[str, ...]] = {
    "device_busy": (
        "another process still holds the GPU (a leftover of an earlier container): kill it, or let gpumedic's "
        "orphan_gpu_holder fix do it, then start the job again",
        "run `gpumedic preflight` before launching instead of `pkill`/`fuser -k` in the launch script",
    ),
    "gpu_oom": (
        "use a smaller batch or micro-batch, or gradient accumulation",
        "use mixed precision (bf16/fp16) and activation checkpointing",
        "check that no leftover process holds GPU memory (nvidia-smi)",
    ),
    "cgroup_oom": (
        "the container reached its memory limit: raise the limit, or lower the job's memory (fewer data-loader "
        "workers, smaller host-side buffers)",
    ),
    "host_oom": (
        "the host ran out of memory: give every container a memory limit so one job fails alone instead of the node",
        "find what grew (the kernel's OOM lines list the biggest processes)",
    ),
    "disk_full": (
        "free space: docker system prune (stopped containers, dangling images, build cache), old checkpoints, logs",
        "write checkpoints and outputs to a volume with room, not the container's layer",
    ),
    "killed": (
        "it was killed with SIGKILL from outside: check the provider's eviction or preemption notices, and who "
        "has access to the node",
    ),
    "segfault": (
        "a crash in native code: read its last lines, update the framework and the driver, run it with core dumps on",
    ),
    "sigterm": (
        "it was stopped with SIGTERM (a preemption, a scheduler, a person): make the job checkpoint on SIGTERM",
    ),
    "stopped_by_engine": ("the engine killed it on request (docker kill, or a docker stop that timed out)",),
    "exited_with_error": ("read the job's last log lines; the exit code is the job's own",),
}
KEEP_LOGS = (
    "keep job containers' logs after they die: the engine's local or json-file logging driver with rotation "
    "(log-opts max-size, compress) in /etc/docker/daemon.json, as the runbook's setup-docker-logging.sh sets, "
    "and no --rm on job containers"
)
"""The remedy for an exit whose log was lost (the runbook's "container logs are empty after death")."""


@dataclass(frozen=True)
class _Pending:
    exit: ContainerExited
    settles_at: datetime
    own_action: bool
    """gpumedic's kill on the node's GPU processes explains it, as the incidents stood when it
    arrived (by the time it settles, a close may be older than the closes kept)."""


@dataclass
class _Node:
    """What the rule remembers of one node while one of its exits settles."""

    pending: list[_Pending] = field(default_factory=list)
    ooms: list[tuple[datetime, ProcessOomKilled]] = field(default_factory=list)
    last_sample: Sample | None = None
    disk_full_at: datetime | None = None


class ContainerRule:
    inputs = (ContainerExited, ProcessOomKilled, Sample)

    def __init__(self, policy: ContainerPolicy, stopping: Stopping | None = None) -> None:
        self.policy = policy
        self.stopping = stopping
        self.nodes: dict[str, _Node] = {}
        self.usage: dict[str, tuple[datetime, dict[str, ContainerUsage]]] = {}
        """node -> its containers' memory and CPU at the sampler's last look (every 30 s), by the node's clock: what a
        death (by the same clock) is read against."""

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, Sample):
            if event.host.containers:
                self.usage[event.node_id] = (event.occurred_at, {c.container_id[:12]: c for c in event.host.containers})
            node = self.nodes.get(event.node_id)
            if node is not None:  # only nodes with an exit settling or an OOM kill waiting are remembered
                node.last_sample = event
                if any(d.used_pct >= DISK_FULL_PCT for d in event.host.disks):
                    node.disk_full_at = now
            elif any(d.used_pct >= DISK_FULL_PCT for d in event.host.disks):
                self.nodes[event.node_id] = _Node(last_sample=event, disk_full_at=now)
            return ()
        node = self.nodes.setdefault(event.node_id, _Node())
        if isinstance(event, ProcessOomKilled):
            node.ooms.append((now, event))
            if not event.container_id and event.gpu_index is not None:
                return (_bare_job_killed(event),)
            if not event.container_id:
                log.info(
                    "OOM kill of pid %d (%s) on %s outside any container (%s): no GPU process, recorded in the node's events",
                    event.pid, event.process_name or "?", event.node_id, event.constraint or "no constraint",
                )
            return ()
        if ended_normally(event):
            return ()
        settles_at = now + timedelta(seconds=self.policy.settle_s)
        node.pending.append(_Pending(event, settles_at, part_of_an_action(event, incidents, self.stopping)))
        return ()

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        findings: list[Finding] = []
        for node_id in list(self.nodes):
            node = self.nodes[node_id]
            due = [p for p in node.pending if p.settles_at <= now]
            node.pending = [p for p in node.pending if p.settles_at > now]
            for pending in due:
                finding = self._judge(pending, node, now, incidents)
                if finding is not None:
                    findings.append(finding)
            for at, oom in node.ooms:
                if now - at > OOM_MEMORY and oom.container_id:
                    log.info("OOM kill of pid %d in container %s on %s was followed by no exit", oom.pid, oom.container_id[:12], node_id)
            node.ooms = [(at, oom) for at, oom in node.ooms if now - at <= OOM_MEMORY]
            full_lately = node.disk_full_at is not None and now - node.disk_full_at <= OOM_MEMORY
            if not node.pending and not node.ooms and not full_lately:
                del self.nodes[node_id]
        return findings

    def _judge(self, pending: _Pending, node: _Node, now: datetime, incidents: Incidents) -> Finding | None:
        exit_ = pending.exit
        lines = exit_.last_log_lines
        # A sample the node took after the death, by the node's own clock: one it began reading
        # before (its read spanning the exit, or its publish held up) still shows the dead
        # container's process and is no restart's leftover, however late it arrives.
        died_at = exit_.finished_at or exit_.occurred_at
        after = node.last_sample if node.last_sample is not None and node.last_sample.occurred_at > died_at else None
        if pending.own_action or _left_a_process_behind(exit_, after):
            return None
        oom = next((o for _, o in node.ooms if _same_container(o, exit_)), None)
        disk_full = (node.disk_full_at is not None and now - node.disk_full_at <= OOM_MEMORY) or any(_NO_SPACE.search(x) for x in lines)
        if any(_DEVICE_BUSY.search(x) for x in lines):
            if _orphan_in(after):
                return None  # the leftover holding the GPU is an orphan_gpu_holder incident: one story
            cause, confidence, why = "device_busy", 0.9, "its last lines say the GPU is busy or unavailable: another process holds it"
        elif any(_GPU_OOM.search(x) for x in lines):
            cause, confidence, why = "gpu_oom", 0.95, "its last lines show CUDA running out of GPU memory"
        elif exit_.exit_code == 137 and (exit_.oom_killed or oom is not None):
            host = oom is not None and oom.constraint == "CONSTRAINT_NONE"
            cause = "host_oom" if host else "cgroup_oom"
            confidence = 0.95 if exit_.oom_killed and oom is not None else 0.85
            where = "the host ran out of memory" if host else "it reached its memory limit"
            evidence = "the engine says OOMKilled" if exit_.oom_killed else ""
            if oom is not None:
                evidence += (" and " if evidence else "") + f"the kernel's OOM killer ended pid {oom.pid} ({oom.process_name})"
            why = f"{where}: {evidence}"
        elif disk_full:
            cause, confidence, why = "disk_full", 0.7, "a disk of the node was full when it exited"
        elif exit_.exit_code == 137 and exit_.engine_signal == "SIGKILL":
            cause, confidence, why = "stopped_by_engine", 0.8, "the engine sent SIGKILL just before it exited"
        elif exit_.exit_code == 137:
            cause, confidence, why = "killed", 0.6, "exit 137 (SIGKILL) with no OOM kill recorded: killed from outside"
        elif exit_.exit_code == 139:
            cause, confidence, why = "segfault", 0.95, "exit 139 (SIGSEGV)"
        elif exit_.exit_code == 143:
            cause, confidence, why = "sigterm", 0.8, "exit 143 (SIGTERM) that the node's engine did not send"
        else:
            cause, confidence, why = "exited_with_error", 0.5, f"exit code {exit_.exit_code}"
        return self._finding(exit_, cause, confidence, why, oom)

    def _finding(self, exit_: ContainerExited, cause: str, confidence: float, why: str, oom: ProcessOomKilled | None) -> Finding:
        name = exit_.name or exit_.container_id[:12]
        last = " | ".join(exit_.last_log_lines[-3:])[:500]
        evidence = {
            "container": name,
            "container_id": exit_.container_id[:64],
            "image": exit_.image or None,
            "exit_code": exit_.exit_code,
            "signal": exit_.signal,
            "oom_killed": exit_.oom_killed,
            "engine_signal": exit_.engine_signal,
            "last_lines": last or None,
            "logs_lost": exit_.logs_lost,
        }
        before = self._usage_before(exit_)
        if before is not None:  # runbook 004's docker stats, the last look before it died
            usage, ago = before
            evidence |= {"memory_mib_before": usage.memory_mib, "memory_limit_mib": usage.memory_limit_mib,
                         "cpu_pct_before": usage.cpu_pct, "seconds_before": round(ago)}
            if usage.memory_limit_mib:
                why += (f"; {ago:.0f}s before, it used {usage.memory_mib} of its {usage.memory_limit_mib} MiB limit "
                        f"({100 * usage.memory_mib / usage.memory_limit_mib:.0f}%)")
        if oom is not None:
            evidence |= {"oom_pid": oom.pid, "oom_constraint": oom.constraint or None, "oom_kernel_line": (oom.kernel_lines[-1] if oom.kernel_lines else "")[:300] or None}
        summary = f"container {name} exited {exit_.exit_code}: {cause.replace('_', ' ')} ({why})"
        remedies = REMEDIES[cause]
        if exit_.logs_lost:
            summary += f"; its log is lost: {exit_.logs_lost}"
            remedies += (KEEP_LOGS,)
        return Finding(
            kind=KIND,
            node_id=exit_.node_id,
            key=exit_.container_id[:12],
            summary=summary[:1000],
            evidence=evidence,
            severity="info" if cause in ("stopped_by_engine", "sigterm") else "warning",
            diagnosis=Diagnosis(cause=cause, confidence=confidence, explanation=why[:1000], remedies=remedies),
            recommended_action=REMEDIES[cause][0][:500],
            occurrence=True,
        )


    def _usage_before(self, exit_: ContainerExited) -> tuple[ContainerUsage, float] | None:
        """The dying container's usage at the last look, and how long before its exit; None when
        none was seen within USAGE_FRESH."""
        seen = self.usage.get(exit_.node_id)
        usage = seen[1].get(exit_.container_id[:12]) if seen is not None else None
        if usage is None:
            return None
        ago = (exit_.occurred_at - seen[0]).total_seconds()
        return (usage, max(0.0, ago)) if ago <= USAGE_FRESH.total_seconds() else None


def _bare_job_killed(oom: ProcessOomKilled) -> Finding:
    """A job's process outside any container ended by the OOM killer: the same post-mortem, at once
    (no engine will report an exit to wait for)."""
    host = oom.constraint == "CONSTRAINT_NONE"
    cause = "host_oom" if host else "cgroup_oom"
    where = "the host ran out of memory" if host else "its memory cgroup reached its limit"
    name = oom.command or oom.process_name or "?"
    why = f"{where}: the kernel's OOM killer ended pid {oom.pid} ({oom.process_name or '?'}), which computed on GPU {oom.gpu_index}"
    return Finding(
        kind=KIND,
        node_id=oom.node_id,
        key=f"pid-{oom.pid}",
        summary=f"the job {name[:120]} (pid {oom.pid}, no container) was killed (SIGKILL, exit -9): {cause.replace('_', ' ')} ({why})",
        evidence={
            "pid": oom.pid, "command": name[:256], "gpu_index": oom.gpu_index, "oom_constraint": oom.constraint or None,
            "cgroup": oom.cgroup or None, "anon_rss_kib": oom.anon_rss_kib,
            "oom_kernel_line": (oom.kernel_lines[-1] if oom.kernel_lines else "")[:300] or None,
        },
        severity="warning",
        diagnosis=Diagnosis(cause=cause, confidence=0.9, explanation=why[:1000], remedies=REMEDIES[cause]),
        recommended_action=REMEDIES[cause][0][:500],
        occurrence=True,
    )


def ended_normally(exit_: ContainerExited) -> bool:
    """Exit 0, or 143 after the engine itself sent SIGTERM (a stop the node asked for)."""
    return exit_.exit_code == 0 or (exit_.exit_code == 143 and exit_.engine_signal == "SIGTERM")


def part_of_an_action(exit_: ContainerExited, incidents: Incidents, stopping: Stopping | None = None) -> bool:
    """A SIGKILL/SIGTERM exit without OOM while gpumedic ended work on this node: within the window
    of a work-ending action it asked for there (a kill, a hung job's stop of its ranks, a reset or a
    reboot: `Incidents.acted_on`), whatever its incident did since; an incident acting or verifying,
    or one that acted and closed after the death (a bus that falls behind can deliver the exit after
    the sample that showed the GPU free); or while it stops a hung job with ranks on it. The death's
    time is the node's, so however late the exit arrives."""
    if exit_.exit_code not in (137, 143) or exit_.oom_killed:
        return False
    if stopping is not None and stopping(exit_.node_id, incidents):
        return True
    died_at = exit_.finished_at or exit_.occurred_at
    if any(start <= died_at <= until for start, until in incidents.acted_on(exit_.node_id)):
        return True
    if any(
        _killed(i) and i.phase in ("acting", "verifying") and i.opened_at <= died_at
        and (i.pending_action is None or died_at - i.pending_action.requested_at <= OWN_ACTION)
        for i in incidents.open_on(exit_.node_id)
    ):
        return True
    return any(_killed(i) and i.opened_at <= died_at <= closed_at for i, closed_at in incidents.closed_on(exit_.node_id))


def _killed(incident: IncidentState) -> bool:
    """An incident whose fix kills GPU processes, and that asked for it."""
    return incident.kind in (IncidentKind.ZOMBIE_JOB, IncidentKind.ORPHAN_GPU_HOLDER) and incident.attempt > 0


def _holders(sample: Sample | None) -> list:
    if sample is None:
        return []
    return [p for g in sample.gpus for p in g.processes] + list(sample.device_holders)


def _left_a_process_behind(exit_: ContainerExited, after: Sample | None) -> bool:
    """A sample taken after the exit shows the container's process still holding a GPU: a restart's
    leftover (orphan_gpu_holder's story), not a death."""
    return any(p.container_id and exit_.container_id.startswith(p.container_id[:12]) for p in _holders(after))


def _orphan_in(after: Sample | None) -> bool:
    return any(p.container_exists is False for p in _holders(after))


def _same_container(oom: ProcessOomKilled, exit_: ContainerExited) -> bool:
    if oom.container_id and exit_.container_id.startswith(oom.container_id[:12]):
        return True
    return bool(oom.cgroup) and exit_.container_id[:12] in oom.cgroup
