"""stuck_process: an old process on an idle GPU, on a node that gives no job count to judge by.

The runbook looks for processes running for more than 2 hours with no GPU activity. Where the node
reports jobs, the zombie rule judges a held idle GPU; where it reports none (no status probe, or
one that cannot be read), this rule holds for a GPU whose utilisation stays below
`idle_below_pct` for `idle_for_s` while a process older than `older_than_s` holds it (not a
leftover whose container is gone: that is an orphan). Nothing says whether the work is hung or
between phases, so the policy observes by default: the incident names the processes, and a kill
step may be added to the kind's ladder. A GPU the zombie rule counts (its node claimed jobs when
the count began, and its job count went unread since) or has an open incident for is the zombie
rule's: one hung job, one incident. So is a GPU whose node gave its job count within the last
`COUNTED_WITHIN_INTERVALS` of its intervals: a busy node's status endpoint misses some probes,
and an unread count is no missing one. A GPU output growth can be credited to (its processes wrote, or the node's output
grows while none of its GPUs works: a checkpoint) is not stuck, whatever its utilisation.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from datetime import datetime

from gpumedic_events import GpuProcess, GpuSample, IncidentKind, NodeRetired
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import KillPolicy, StuckPolicy
from zombie_detector.rules.base import BUSY_GAP_INTERVALS, Incidents, Streak, kill_operation, watched_across
from zombie_detector.rules.job import RankOfWiderJob, spans_nodes
from zombie_detector.rules.zombie import Writes, holder_writes, producing, unidentified, wrote_since

KIND = IncidentKind.STUCK_PROCESS
COUNTED_WITHIN_INTERVALS = BUSY_GAP_INTERVALS
"""A node that gave its job count within this many of its intervals has it unread now, not missing:
the zombie rule's. One that stopped giving it for good is this rule's a minute later (at 5 s)."""
ZOMBIE = IncidentKind.ZOMBIE_JOB


class StuckRule:
    inputs = (Sample, NodeRetired)
    entry = Streak
    of_events = False

    def __init__(
        self, policy: StuckPolicy, kill: KillPolicy, *, rank_of_wider_job: RankOfWiderJob = spans_nodes,
        zombie_counting: Callable[[str, int], bool] = lambda node_id, gpu_index: False,
    ) -> None:
        self.policy = policy
        self.kill = kill
        self.wider = rank_of_wider_job
        self.zombie_counting = zombie_counting
        self.idle_since: dict[str, dict[int, tuple[datetime, datetime]]] = {}
        """node -> GPU -> (first, last) seen idle under an old process, by its node's sample times."""
        self.counted_at: dict[str, datetime] = {}
        """When each node last gave its job count: one that gave it lately has it unread now (a busy
        node's status endpoint answers some probes, not all), which is no node without a count."""
        self.writes: dict[tuple[str, int], Writes] = {}
        """The write counters of the GPUs counted here, as of their node's last sample."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, NodeRetired):  # a worker the pool ended: forget it
            self._forget(event.node_id)
            return ()
        open_here: set[int | None] = set()
        zombies: set[int | None] = set()
        for incident in incidents.open_on(event.node_id):
            if incident.kind is KIND:
                open_here.add(incident.gpu_index)
            elif incident.kind is ZOMBIE:
                zombies.add(incident.gpu_index)
        if event.jobs.running is not None:
            self.counted_at[event.node_id] = now
        counted = self.counted_at.get(event.node_id)
        if not open_here and (event.jobs.running is not None or counted is not None and (now - counted).total_seconds() <= COUNTED_WITHIN_INTERVALS * event.interval_s):
            # The node counts its jobs: the zombie rule's. Its count missing from some samples (a
            # status endpoint that answers now and then) adds nothing up here.
            self._forget(event.node_id, counted=True)
            return ()
        findings: list[Finding] = []
        for gpu in event.gpus:
            old = self._old_holders(gpu)
            if gpu.utilization_gpu_pct is None:
                continue  # cannot tell
            streaks = self.idle_since.get(event.node_id)
            zombie = gpu.index in zombies or self.zombie_counting(event.node_id, gpu.index)
            key = (event.node_id, gpu.index)
            wrote = wrote_since(self.writes.pop(key, None), gpu)
            idle = gpu.utilization_gpu_pct < self.policy.idle_below_pct
            if idle and old:
                self.writes[key] = holder_writes(gpu)
            stuck = (event.jobs.running is None and bool(old) and idle and not zombie
                     and not producing(gpu, event, self.policy.idle_below_pct, wrote))
            if not stuck:
                if streaks is not None:
                    streaks.pop(gpu.index, None)
                    if not streaks:
                        del self.idle_since[event.node_id]
                if gpu.index in open_here:
                    why = "the zombie rule judges it: its node claims jobs" if zombie else "the GPU works again, or its old processes are gone"
                    findings.append(Finding(KIND, event.node_id, gpu.index, present=False, summary=why))
                continue
            if streaks is None:
                streaks = self.idle_since[event.node_id] = {}
            first, last = streaks.get(gpu.index, (now, now))
            if not watched_across(last, now, event):
                first = now  # not watched in between
            streaks[gpu.index] = (first, now)
            idle_s = (now - first).total_seconds()
            if idle_s >= self.policy.idle_for_s or gpu.index in open_here:
                findings.append(self._finding(event, gpu, old, idle_s))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def _forget(self, node_id: str, *, counted: bool = False) -> None:
        self.idle_since.pop(node_id, None)
        if not counted:
            self.counted_at.pop(node_id, None)
        for key in [k for k in self.writes if k[0] == node_id]:
            del self.writes[key]

    def remember(self) -> list[Streak]:
        return [Streak(node, gpu, first) for node, streaks in self.idle_since.items() for gpu, (first, _) in streaks.items()]

    def recall(self, entries: Sequence[Streak], now: datetime) -> None:
        for entry in entries:
            self.idle_since.setdefault(entry.node, {})[entry.gpu] = (min(entry.since, now), now)

    def _old_holders(self, gpu: GpuSample) -> list[GpuProcess]:
        return [
            p for p in gpu.processes
            if p.pid >= 2 and p.container_exists is not False and (p.age_s or 0) > self.policy.older_than_s and not self.wider(p.job)
        ]

    def _finding(self, event: Sample, gpu: GpuSample, old: list[GpuProcess], idle_s: float) -> Finding:
        oldest = max(old, key=lambda p: p.age_s or 0)
        why_not = unidentified(gpu)
        kill = None if why_not else kill_operation(gpu.index, gpu.processes, self.policy.idle_below_pct - 1, self.kill)
        return Finding(
            kind=KIND,
            node_id=event.node_id,
            gpu_index=gpu.index,
            summary=f"pid {oldest.pid} ({oldest.command[:80] or 'no command line'}) has run {(oldest.age_s or 0) / 3600:.1f} h "
            f"and GPU {gpu.index} has idled at {gpu.utilization_gpu_pct} % for {idle_s:.0f}s; the node reports no job count to judge by",
            evidence={
                "pids": " ".join(str(p.pid) for p in old), "oldest_age_s": round(oldest.age_s or 0), "utilization_gpu_pct": gpu.utilization_gpu_pct,
                "idle_s": round(idle_s, 1),
            },
            recommended_action="look at the process (is it between phases or hung?): kill it if hung, or report the node's "
            "job count (GPUMEDIC_SAMPLER_STATUS_URL or _JOB_PROCESS_PATTERN) so the zombie rule can judge it",
            operations={"kill_gpu_processes": kill} if kill is not None else {},
            unsafe=why_not,
        )
