"""zombie_job: a GPU held but idle while the node claims jobs, and no output grows it could make.

The rule holds for a GPU when the node reports `jobs.running >= 1`, the GPU's utilisation is known
and below `idle_below_pct`, it holds a process (pid >= 2), and no output growth can be credited
to it. A GPU whose own processes wrote to storage since the last sample (/proc/PID/io, when the
sampler can read it) is producing, e.g. writing a checkpoint: no zombie. Without those counters
growth is a node-wide signal, credited to the node's busy GPUs when there are any, so one hung job
among busy ones is still found, and a node whose GPUs all idle while output grows is in an I/O
phase (a checkpoint, an evaluation), not hung. Idleness is timed on the node's sample times as
placed on the detector's clock (`zombie_detector.clocks`: never later than they came, never
on arrival), and only across samples at the node's interval: a burst of samples proves
nothing, and a gap of more than `MAX_GAP_INTERVALS` intervals starts the count again, unless the
sample after it explains it (its sampler says it missed those ticks, or was taken late: a busy
node, not an unwatched one). A sample with an unreadable utilisation on
a held GPU tells nothing: it neither opens nor clears anything, nor ends a count under way, and
is not counted as watched. A sample whose job count is unread (a loaded status endpoint answers
some probes, not all) but that shows the GPU idle without output keeps a count under way, begun
by a sample with jobs claimed, and may open it at its window; it never starts one, nor clears an
open incident. A GPU held only by processes whose container is gone is the orphan rule's (a
leftover, not a hung job).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpumedic_events import GpuSample, IncidentKind, KillPattern
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import KillPolicy, ZombiePolicy
from zombie_detector.rules.base import Incidents, Streak, kill_operation, watched_across
from zombie_detector.rules.job import RankOfWiderJob, spans_nodes

KIND = IncidentKind.ZOMBIE_JOB


Writes = dict[tuple[int, int | None], int]
"""(pid, start ticks) -> /proc/PID/io write_bytes of one GPU's processes."""


def holder_writes(gpu: GpuSample) -> Writes:
    return {(p.pid, p.start_ticks): p.write_bytes for p in gpu.processes if p.write_bytes is not None}


def wrote_since(before: Writes | None, gpu: GpuSample) -> bool | None:
    """Whether a process of this GPU wrote since `before` (True), none did and every one could be
    compared (False), or it cannot be told (None: no counters, or a new process)."""
    if before is None or not gpu.processes:
        return None
    now = holder_writes(gpu)
    if any(before.get(key, value) < value for key, value in now.items()):
        return True
    return False if len(now) == len(gpu.processes) and now.keys() <= before.keys() else None


@dataclass(frozen=True)
class IdleStreak:
    """When this GPU was first and last seen looking like a zombie, by the detector's clock."""

    since: datetime
    last_seen: datetime
    jobs: int | None = None
    """The node's job count when last read (None: not read since a takeover)."""


def _idle_and_held(gpu: GpuSample, idle_below_pct: int, wider: RankOfWiderJob = spans_nodes) -> bool:
    """Idle, and held by a process that belongs to a job of this node's: pid 1 is never a kill
    target, a holder whose container is gone is a leftover (orphan_gpu_holder), and a rank of a job
    across nodes is judged with its job's other ranks (job_hung), never alone."""
    return (
        gpu.utilization_gpu_pct is not None
        and gpu.utilization_gpu_pct < idle_below_pct
        and any(p.pid >= 2 and p.container_exists is not False and not wider(p.job) for p in gpu.processes)
    )


def idle_without_output(
    gpu: GpuSample, sample: Sample, idle_below_pct: int, wrote: bool | None = None, wider: RankOfWiderJob = spans_nodes
) -> bool:
    """This GPU held but idle, and no output growth it could be credited with: a zombie where the
    node claims jobs. `wrote`: whether the GPU's own processes wrote since the last sample (None:
    cannot tell)."""
    return _idle_and_held(gpu, idle_below_pct, wider) and not producing(gpu, sample, idle_below_pct, wrote)


def producing(gpu: GpuSample, sample: Sample, idle_below_pct: int, wrote: bool | None) -> bool:
    """Whether output growth can be credited to this idle GPU: its own processes wrote, or the node's
    output grows while none of its GPUs is busy (a checkpoint, an evaluation: an I/O phase)."""
    if wrote:
        return True
    if sample.jobs.output_growing is not True:
        return False
    return not any(
        g is not gpu and g.utilization_gpu_pct is not None and g.utilization_gpu_pct >= idle_below_pct for g in sample.gpus
    )


def unidentified(gpu: GpuSample) -> str:
    """Why no kill is safe on this GPU ('' when every holder is fully identified)."""
    pids = [p.pid for p in gpu.processes if p.pid >= 2 and (p.start_ticks is None or not p.command.strip())]
    if not pids:
        return ""
    return (
        f"pid {' '.join(map(str, pids))} on GPU {gpu.index} cannot be identified (no start time or command line "
        "in the sample), so no kill is requested; a person must look"
    )


class ZombieRule:
    inputs = (Sample,)
    entry = Streak
    of_events = False

    def __init__(self, policy: ZombiePolicy, kill: KillPolicy, *, pattern_kill: KillPolicy | None = None,
                 rank_of_wider_job: RankOfWiderJob = spans_nodes) -> None:
        self.policy = policy
        self.kill = kill
        self.pattern_grace_s = (pattern_kill or kill).grace_s
        self.wider = rank_of_wider_job
        self.idle_since: dict[tuple[str, int], IdleStreak] = {}
        self.writes: dict[tuple[str, int], Writes] = {}
        """The write counters of the GPUs that looked idle in their node's last sample."""
        self._watched: set[str] = set()
        """Nodes with an idle streak: the only ones a healthy-looking sample concerns."""

    def observe(self, event: Sample, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        open_here = {i.gpu_index: i for i in incidents.open_on(event.node_id) if i.kind is KIND}
        # The hot path: most samples come from nodes whose GPUs all work; nothing to do there.
        if not open_here and event.node_id not in self._watched and not self._may_hold_zombie(event):
            return ()
        findings: list[Finding] = []
        for gpu in event.gpus:
            key = (event.node_id, gpu.index)
            wrote = wrote_since(self.writes.get(key), gpu)
            if _idle_and_held(gpu, self.policy.idle_below_pct, self.wider):
                self.writes[key] = holder_writes(gpu)
            else:
                self.writes.pop(key, None)
            idle = idle_without_output(gpu, event, self.policy.idle_below_pct, wrote, self.wider)
            zombie = idle and (event.jobs.running or 0) >= 1
            if gpu.index in open_here:
                if gpu.processes and (gpu.utilization_gpu_pct is None or event.jobs.running is None):
                    continue  # this sample cannot tell; "could not read" must never count as "fixed"
                if zombie:
                    findings.append(self._finding(event, gpu, 0.0, event.jobs.running))
                else:
                    findings.append(_gone(event.node_id, gpu, verifying=open_here[gpu.index].phase == "verifying"))
                continue
            if not zombie:
                if gpu.processes and gpu.utilization_gpu_pct is None:
                    continue  # cannot tell whether it idles: the count goes on, this sample not watched
            streak = self.idle_since.get(key)
            watched = streak is not None and watched_across(streak.last_seen, now, event)
            if not zombie and not (idle and event.jobs.running is None and watched):
                self.idle_since.pop(key, None)
                continue
            # Here: a zombie as this sample shows, or seen idle without output with only the node's
            # job count unread (a loaded status endpoint answers some probes, not all): a count
            # under way, begun by a sample with jobs claimed, goes on. An unread count never starts one.
            since = streak.since if watched else now
            jobs = streak.jobs if event.jobs.running is None and streak is not None else event.jobs.running
            self.idle_since[key] = IdleStreak(since=since, last_seen=now, jobs=jobs)
            idle_s = (now - since).total_seconds()
            if idle_s >= self.policy.idle_for_s:
                del self.idle_since[key]
                findings.append(self._finding(event, gpu, idle_s, jobs))
        if any((event.node_id, gpu.index) in self.idle_since for gpu in event.gpus):
            self._watched.add(event.node_id)
        else:
            self._watched.discard(event.node_id)
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[Streak]:
        return [Streak(node, gpu, streak.since) for (node, gpu), streak in self.idle_since.items()]

    def recall(self, entries: Sequence[Streak], now: datetime) -> None:
        for entry in entries:
            self.idle_since[(entry.node, entry.gpu)] = IdleStreak(since=min(entry.since, now), last_seen=now)
            self._watched.add(entry.node)

    def counting(self, node_id: str, gpu_index: int) -> bool:
        """Whether this GPU's idle count is under way here (begun by a sample with jobs claimed)."""
        return (node_id, gpu_index) in self.idle_since

    def _may_hold_zombie(self, sample: Sample) -> bool:
        """The cheap test every sample gets: jobs claimed and some GPU held but idle."""
        return (sample.jobs.running or 0) >= 1 and any(_idle_and_held(g, self.policy.idle_below_pct, self.wider) for g in sample.gpus)

    def _finding(self, sample: Sample, gpu: GpuSample, idle_s: float, jobs: int | None) -> Finding:
        pids = " ".join(str(p.pid) for p in gpu.processes)
        unsafe = unidentified(gpu)
        operation = None if unsafe else kill_operation(gpu.index, gpu.processes, self.policy.idle_below_pct - 1, self.kill)
        operations = {"kill_gpu_processes": operation} if operation else {}
        if operation and self.policy.kill_pattern:  # the ladder's next step when the job's launcher starts them again
            operations["kill_pattern"] = KillPattern(pattern=self.policy.kill_pattern, grace_s=self.pattern_grace_s,
                                                     max_gpu_utilization_pct=self.policy.idle_below_pct - 1)
        return Finding(
            kind=KIND,
            node_id=sample.node_id,
            gpu_index=gpu.index,
            summary=(
                f"GPU {gpu.index} at {gpu.utilization_gpu_pct}% for {idle_s:.0f}s while the node reports "
                + (f"{jobs} job(s)" if sample.jobs.running is not None else f"{jobs or 'some'} job(s) when its count was last read")
                + " and "
                + {True: "its output grows only from its busy GPUs", False: "no output grows"}.get(
                    sample.jobs.output_growing, "its output could not be read")
                + f"; held by pid {pids}"
            ),
            evidence={
                "idle_seconds": round(idle_s, 1),
                "utilization_gpu_pct": gpu.utilization_gpu_pct,
                "memory_used_mib": gpu.memory_used_mib,
                "jobs_running": jobs,
                "output_growing": sample.jobs.output_growing,
                "holder_pids": pids,
            },
            recommended_action=f"kill the hung job's processes on GPU {gpu.index} (pid {pids}) so the GPU can be used again",
            operations=operations,
            unsafe=unsafe,
        )


def _gone(node_id: str, gpu: GpuSample, *, verifying: bool) -> Finding:
    if not verifying:
        summary = f"GPU {gpu.index} no longer looks like a zombie job"
    elif not gpu.processes:
        summary = f"GPU {gpu.index} holds no process after the action ({gpu.memory_used_mib} MiB used); verified by the next sample"
    else:
        summary = f"GPU {gpu.index} is busy again ({gpu.utilization_gpu_pct}%) after the action"
    return Finding(KIND, node_id, gpu.index, present=False, summary=summary)

