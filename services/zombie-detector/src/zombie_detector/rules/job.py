"""job_hung: a job across nodes whose ranks mostly idle together, none writing: a hung collective.

When one rank of a multi-node job stops (its GPU fell off the bus, its NIC port went down, its
process died or wedged), every other rank waits inside the collective at 0-few % GPU. Judged node
by node, that is a zombie per rank; the fix is the one node that stopped. So the ranks of a job
(`GpuProcess.job`: the same id from the launcher's environment on several nodes) are judged
together: when at least `idle_share` of the ranks seen idle (below `idle_below_pct`) and none
writes (its /proc/PID/io grows; where counters are unreadable, its node's watched output grows:
a checkpoint is output) for `idle_for_s`, that is one incident for the job. The per-rank rules
(zombie_job, stuck_process) stand aside for ranks of a job across nodes (`spans_nodes`).

The incident is on the node that stopped, found from what is already known, in this order: the
job's ranks exited there while the others waited; a rank's GPU fell off the bus; NCCL's RAS
(asked by the samplers of the idle nodes, `NodeSampled.nccl_ras`) cannot reach the job's ranks
there (a rank stopped without exiting, which nothing else shows); its samples stopped; an open
incident of a fault that stops a rank (its GPU's, its NIC's, its host's); its ranks alone are
busy while the rest wait (a rank spinning). None found after another `idle_for_s` (a link's second flap, a late
XID may yet name it): it is on the node of the lowest rank seen, and a person is called at once
with what could not be learned (what RAS said, or why it could not be asked). Its key is a digest of the job's id (the id
itself, which may hold any launcher's characters, is in the evidence).

Once the ladder's stop leaves no rank of the job anywhere (a lost GPU's rank cannot be seen to end),
the incident hears so on every tick until it moves on, with the restart the policy names
(`restart_job`: on the nodes the stop reached but the one that stopped, or on the lowest rank's); a
run under the same id after that is judged afresh. Idleness is timed on the
detector's clock; a rank whose utilisation is unreadable neither opens nor clears anything.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from gpumedic_events import GpuProcess, IncidentKind, JobTag, NcclRasAnswer, NodeRetired, RankTarget, RasRank, RestartJob, StopJob
from gpumedic_events.node import job_key
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import KillPolicy
from gpumedic_incidents.policy.kinds import JobHungPolicy
from gpumedic_incidents.state import fingerprint
from zombie_detector.rules.base import MAX_GAP_INTERVALS, Incidents, patience

KIND = IncidentKind.JOB_HUNG
FORGET_AFTER_S = 3600.0
"""A job none of whose nodes has shown a rank for this long is forgotten."""
MAX_JOBS = 10_000
MAX_STOPPED = 512
"""Ranks one stop may name (a bigger job's stop is a person's)."""
MAX_NAMED = 16
"""Nodes and ranks named in a summary; the evidence says how many there are."""
STOPPING = frozenset({
    IncidentKind.GPU_LOST, IncidentKind.GPU_XID, IncidentKind.ECC_ERRORS, IncidentKind.ROW_REMAP, IncidentKind.NVLINK_DEGRADED,
    IncidentKind.PCIE_DEGRADED, IncidentKind.GPU_THERMAL, IncidentKind.GPU_THROTTLED, IncidentKind.NIC_DEGRADED,
    IncidentKind.NIC_FLAPPING, IncidentKind.HOST_MEMORY_PRESSURE, IncidentKind.NVML_UNAVAILABLE, IncidentKind.NODE_SILENT,
    IncidentKind.CONTAINER_DIED, IncidentKind.DISK_PRESSURE,
})
"""Open incidents that can stop a rank: one on a node of the hung job names that node (one of a GPU
only when a rank runs on that GPU)."""


RankOfWiderJob = Callable[[JobTag | None], bool]
"""Whether a process's job tag makes it a rank of a job across nodes (the per-rank rules stand aside)."""


def spans_nodes(tag: JobTag | None) -> bool:
    """A rank of a job with ranks on other nodes too, by what its launcher told it."""
    return tag is not None and tag.spans_nodes


@dataclass(frozen=True)
class Culprit:
    node_id: str
    cause: str
    """Empty when no node is known to have stopped (the incident is then on the lowest rank's node)."""
    why: str


@dataclass(frozen=True)
class Rank:
    rank: int | None
    gpu: int
    pid: int
    utilization: int | None
    wrote: bool
    lost: bool = False
    """Its GPU fell off the bus: NVML lists no process there any more, so it is the one seen last."""
    start_ticks: int | None = None
    command: str = ""


@dataclass
class Seat:
    """The job's part on one node, as its latest sample showed it."""

    ranks: tuple[Rank, ...]
    seen_at: datetime
    interval_s: float
    writes: dict[tuple[int, int | None], int]
    output_growing: bool | None
    ras: NcclRasAnswer | None = None
    """What NCCL's RAS told this node's sampler while its ranks idled."""
    patience: float = MAX_GAP_INTERVALS
    """How many intervals its node may go unseen before it stopped sampling (more for a node that
    said it runs late: `rules.base.patience`)."""

    def stale(self, now: datetime) -> bool:
        return (now - self.seen_at).total_seconds() > self.patience * self.interval_s


@dataclass
class Job:
    tag: JobTag
    seats: dict[str, Seat] = field(default_factory=dict)
    left: dict[str, tuple[datetime, tuple[int | None, ...]]] = field(default_factory=dict)
    """Nodes whose ranks exited while ranks elsewhere went on: when, and which ranks."""
    idle_since: datetime | None = None
    culprit: Culprit | None = None
    """Once its incident is open: the node it is on, as first named (the incident stays there)."""
    stop_reaches: dict[str, int] = field(default_factory=dict)
    """Every node the ladder's stop was proposed on since the hang was judged, with its lowest rank
    there: where the job starts again, but the node that stopped (nodes only join it, as ranks end)."""

    @property
    def nodes(self) -> set[str]:
        return set(self.seats) | set(self.left)

    def gone(self) -> bool:
        """No rank of it runs on any node (a rank on a GPU off the bus cannot be seen to end)."""
        return all(r.lost for seat in self.seats.values() for r in seat.ranks)

    def spans(self) -> bool:
        return len(self.nodes) >= 2 or self.tag.spans_nodes


@dataclass(frozen=True)
class Ended:
    """A judged job whose ranks are gone everywhere: its incident hears so until it moved on."""

    culprit: str
    restart: RestartJob | None
    summary: str


class JobRule:
    inputs = (Sample, NodeRetired)

    def __init__(self, policy: JobHungPolicy, stop: KillPolicy | None = None) -> None:
        self.policy = policy
        self.stop = stop or KillPolicy()
        self.jobs: dict[str, Job] = {}
        self._on_node: dict[str, set[str]] = {}
        """node -> the jobs it showed ranks of in its latest sample."""
        self.ended: dict[str, Ended] = {}
        """Judged jobs whose ranks are gone (stopped, or ended): told to their incident on every tick
        until it leaves the ladder (a clear that comes while the stop's answer is awaited is not heard)."""

    def spans_nodes(self, tag: JobTag | None) -> bool:
        """Whether a rank belongs to a job across nodes: its launcher says so, or its job was seen on
        several nodes. The per-rank rules stand aside for those ranks."""
        if tag is None:
            return False
        job = self.jobs.get(tag.id)
        return tag.spans_nodes or (job is not None and len(job.nodes) >= 2)

    def wider_rank_on(self, node_id: str, gpu_index: int) -> bool:
        """Whether the GPU runs a rank of a job across nodes (what a detector cell, which sees
        only its partitions' nodes, cannot always tell)."""
        return any(job.spans() and (seat := job.seats.get(node_id)) is not None and any(r.gpu == gpu_index for r in seat.ranks)
                   for job_id in self._on_node.get(node_id, ()) if (job := self.jobs.get(job_id)) is not None)

    def stopping(self, node_id: str, incidents: Incidents) -> bool:
        """Whether a job with ranks on the node is being stopped by its incident's ladder (its ranks'
        exits are gpumedic's doing, not deaths to judge)."""
        for job_id, job in self.jobs.items():
            if job.culprit is None or node_id not in job.nodes:
                continue
            incident = incidents.get(fingerprint(job.culprit.node_id, KIND, None, job_key(job_id)))
            ladder = self.policy.ladder
            if incident is not None and incident.phase in ("acting", "verifying") and incident.step < len(ladder) \
                    and ladder[incident.step].action == "stop_job":
                return True
        return False

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        node = event.node_id
        here = self._ranks(event) if isinstance(event, Sample) else {}
        before = self._on_node.get(node, set())
        if not here and not before:
            return ()  # the hot path: a node with no rank of a tagged job, now or before
        lost = {g.index for g in event.gpus if g.lost} if isinstance(event, Sample) else set()
        for job_id in before - set(here) if lost else ():
            job = self.jobs.get(job_id)
            if job is not None and (seat := job.seats.get(node)) and any(r.gpu in lost for r in seat.ranks):
                here[job_id] = (job.tag, [])  # its ranks there are on a GPU that fell off the bus, not gone
        findings: list[Finding] = []
        for job_id in before - set(here):
            job = self.jobs.get(job_id)
            if job is not None and (seat := job.seats.pop(node, None)) is not None:
                if not job.gone():  # the job goes on elsewhere: these ranks left it
                    job.left[node] = (now, tuple(sorted(_rank_ids(seat))))
                else:
                    findings += self._ended(job_id, job, incidents)
        for job_id, (tag, ranks) in here.items():
            job = self.jobs.get(job_id)
            if job is None:
                if len(self.jobs) >= MAX_JOBS:
                    continue
                job = self.jobs[job_id] = Job(tag)
            job.tag = tag
            previous = job.seats.get(node)
            seat = job.seats[node] = _seat(event, ranks, previous, now)
            if previous is not None and (gone := _rank_ids(previous) - _rank_ids(seat)):
                job.left[node] = (now, tuple(sorted(gone)))  # some of its ranks here ended, the rest went on
            elif node in job.left and set(job.left[node][1]) <= _rank_ids(seat):
                del job.left[node]  # they are back (restarted in place)
        if here:
            self._on_node[node] = set(here)
        else:
            self._on_node.pop(node, None)
        for job_id in sorted(set(here) | before):
            if (job := self.jobs.get(job_id)) is None or not job.seats:
                continue
            if job.culprit is not None and job.gone():
                # what is left of it is a rank on a GPU off the bus: ended there too, whichever node said so last
                findings += self._ended(job_id, job, incidents)
            else:
                findings += self._judge(job_id, job, now, incidents)
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        findings: list[Finding] = []
        for job_id, job in list(self.jobs.items()):
            if all((now - s.seen_at).total_seconds() > FORGET_AFTER_S for s in job.seats.values()):
                findings += self._ended(job_id, job, incidents)
        for job_id, ended in list(self.ended.items()):
            incident = incidents.get(fingerprint(ended.culprit, KIND, None, job_key(job_id)))
            if incident is None or incident.resolution is not None or incident.phase not in ("acting", "verifying"):
                del self.ended[job_id]  # it moved on: restarted, validating, closed, or a person's
            else:
                findings.append(self._gone(job_id, ended))
        return findings

    def _ranks(self, sample: Sample) -> dict[str, tuple[JobTag, list[tuple[int, GpuProcess]]]]:
        found: dict[str, tuple[JobTag, list[tuple[int, GpuProcess]]]] = {}
        for gpu in sample.gpus:
            for p in gpu.processes:
                if p.job is not None and p.pid >= 2:
                    found.setdefault(p.job.id, (p.job, []))[1].append((gpu.index, p))
        return found

    def _ended(self, job_id: str, job: Job, incidents: Incidents) -> list[Finding]:
        """The job's ranks are gone everywhere: finished, stopped, or restarted under another id. Its
        incident hears so, with the restart the policy names where the ladder stopped the ranks."""
        del self.jobs[job_id]
        for node in job.nodes:
            self._on_node.get(node, set()).discard(job_id)
        if job.culprit is None or incidents.get(fingerprint(job.culprit.node_id, KIND, None, job_key(job_id))) is None:
            return []
        restart = None
        reached = sorted((n for n in job.stop_reaches if n != job.culprit.node_id), key=lambda n: (job.stop_reaches[n], n))
        if self.policy.restart_job is not None and job.culprit.cause and reached:
            nodes = reached if self.policy.restart_on == "every_node" else reached[:1]
            restart = RestartJob(job=self.policy.restart_job, nodes=tuple(sorted(nodes)))
        self.ended[job_id] = Ended(job.culprit.node_id, restart, f"the job {job_id} has no rank left on any node (stopped, or ended)")
        return [self._gone(job_id, self.ended[job_id])]

    @staticmethod
    def _gone(job_id: str, ended: Ended) -> Finding:
        return Finding(KIND, ended.culprit, key=job_key(job_id), present=False, summary=ended.summary,
                       operations={"restart_job": ended.restart} if ended.restart else {})

    def _judge(self, job_id: str, job: Job, now: datetime, incidents: Incidents) -> list[Finding]:
        key = job_key(job_id)
        if job.culprit is not None:
            incident = incidents.get(fingerprint(job.culprit.node_id, KIND, None, key))
            if incident is None or incident.resolution is not None:
                # resolved or closed, or past its fix (restarting, its node validating): what runs
                # under the job's id now is a new run, and a new hang names its node anew
                job.culprit, job.idle_since, job.left, job.stop_reaches = None, None, {}, {}
                job.seats = {n: s for n, s in job.seats.items() if not all(r.lost for r in s.ranks)}
        fresh = [s for s in job.seats.values() if not s.stale(now)]
        ranks = [r for s in fresh for r in s.ranks]
        known = [r for r in ranks if r.utilization is not None]
        if not job.spans() or not known or len(known) * 2 < len(ranks):
            return []  # not across nodes (the per-rank rules'), or too little to tell
        idle = [r for r in known if r.utilization < self.policy.idle_below_pct and not r.wrote]
        producing = any(r.wrote for r in ranks) or any(
            s.output_growing and not s.writes for s in fresh
        )
        hung = not producing and len(idle) >= self.policy.idle_share * len(known)
        if not hung:
            job.idle_since = None
            # a rank that left long before a hang is the job going on without it (elastic), not its cause
            job.left = {n: gone for n, gone in job.left.items() if (now - gone[0]).total_seconds() < self.policy.idle_for_s}
            if job.culprit is not None and len(known) == sum(1 for r in ranks if not r.lost):  # a lost GPU's rank never reads again
                return [Finding(KIND, job.culprit.node_id, key=key, present=False,
                                summary=f"the job {job_id}'s ranks work again ({len(known) - len(idle)} of {len(known)} busy or writing)")]
            return []
        job.idle_since = job.idle_since or now
        idle_s = (now - job.idle_since).total_seconds()
        if job.culprit is None:
            if idle_s < self.policy.idle_for_s:
                return []
            culprit = self._culprit(job, fresh, now, incidents)
            if not culprit.cause and idle_s < 2 * self.policy.idle_for_s:
                return []  # what stopped may yet show itself (a link's second flap, a late XID): one more window
            job.culprit = culprit
        return [self._finding(job_id, job, job.culprit, idle, known, idle_s)]

    def _culprit(self, job: Job, fresh: list[Seat], now: datetime, incidents: Incidents) -> Culprit:
        if job.left:
            node, (at, gone) = max(job.left.items(), key=lambda item: item[1][0])
            return Culprit(node, "rank_exited", f"rank(s) {_ranks(gone)} exited on {node} {(now - at).total_seconds():.0f}s ago "
                           "while the others waited")
        for node in sorted(job.seats):
            if lost := [r for r in job.seats[node].ranks if r.lost]:
                return Culprit(node, "gpu_lost", f"GPU {lost[0].gpu} of {node}, where rank {_ranks(r.rank for r in lost)} ran, "
                               "fell off the bus")
        if (unreachable := _ras_culprit(job, fresh)) is not None:
            known = sorted({i.kind.value for i in incidents.open_on(unreachable.node_id) if i.kind in STOPPING})
            if known:  # what gpumedic already knows of that node, beside RAS's word
                return replace(unreachable, why=f"{unreachable.why}; {unreachable.node_id} also has open {', '.join(known)}")
            return unreachable
        silent = sorted(n for n, s in job.seats.items() if s.stale(now))
        if silent:
            node = silent[0]
            return Culprit(node, "node_stopped_sampling", f"{node} stopped sampling {(now - job.seats[node].seen_at).total_seconds():.0f}s ago")
        for node in sorted(job.seats):
            gpus = {r.gpu for r in job.seats[node].ranks}
            for incident in sorted(incidents.open_on(node), key=lambda i: i.kind.value):
                if incident.kind in STOPPING and (incident.gpu_index is None or incident.gpu_index in gpus):
                    where = f"GPU {incident.gpu_index}" if incident.gpu_index is not None else node
                    return Culprit(node, incident.kind.value, f"{where} has an open {incident.kind.value} incident: {incident.summary}"[:300])
        busy = [n for n, s in job.seats.items() if s in fresh and all(
            r.utilization is not None and r.utilization >= self.policy.idle_below_pct for r in s.ranks)]
        if len(busy) == 1 and len(job.seats) >= 3:
            node = busy[0]
            return Culprit(node, "rank_spinning", f"the ranks on {node} alone are busy ({_ranks(r.rank for r in job.seats[node].ranks)}) "
                           "while the rest wait")
        first = min(job.seats, key=lambda n: min((r.rank for r in job.seats[n].ranks if r.rank is not None), default=1 << 30))
        return Culprit(first, "", _ras_said(fresh))

    def _finding(self, job_id: str, job: Job, culprit: Culprit, idle: list[Rank], known: list[Rank], idle_s: float) -> Finding:
        nodes = sorted(job.nodes)
        world = job.tag.world_size
        seen = sum(len(s.ranks) for s in job.seats.values())
        named = ", ".join(nodes[:MAX_NAMED]) + (f" and {len(nodes) - MAX_NAMED} more" if len(nodes) > MAX_NAMED else "")
        summary = (f"job {job_id}: {len(idle)} of {len(known)} ranks idle for {idle_s:.0f}s with no output, across "
                   f"{len(nodes)} nodes ({named})")
        if culprit.cause:
            summary += f"; the node that stopped: {culprit.why}"
        unsafe = "" if culprit.cause else (
            f"no node of the job is known to have stopped (no rank gone, no node silent, no fault open on its nodes; {culprit.why}): "
            "a person must find it before anything is drained"
        )
        return Finding(
            kind=KIND,
            node_id=culprit.node_id,
            key=job_key(job_id),
            summary=summary[:1000],
            evidence={
                "job": job_id,
                "nodes": len(nodes),
                "node_list": " ".join(nodes)[:1000],
                "ranks_seen": seen,
                "world_size": world,
                "ranks_idle": len(idle),
                "idle_seconds": round(idle_s, 1),
                "culprit": culprit.node_id if culprit.cause else None,
                "cause": culprit.cause or None,
                "nccl_ras": _ras_said(list(job.seats.values()))[:300],
            },
            severity="critical",
            operations=self._stop(job_id, job) if culprit.cause else {},
            recommended_action=(
                f"drain {culprit.node_id}, stop the job's ranks on every node and restart it from its last checkpoint"
                if culprit.cause else "find the rank that stopped (NCCL's RAS: ncclras on a node of the job), then drain its node"
            ),
            unsafe=unsafe,
        )

    def _stop(self, job_id: str, job: Job) -> dict[str, StopJob]:
        """The ladder's stop: every rank seen, where it was seen (none on a lost GPU: NVML no longer
        lists it to be checked against); none when a rank cannot be identified (a person then), or
        the ladder has no stop (it is not built for every sample of a hung job for nothing)."""
        if not any(step.action == "stop_job" for step in self.policy.ladder):
            return {}
        ranks = [(node, r) for node, seat in sorted(job.seats.items()) for r in seat.ranks if not r.lost]
        if not ranks or len(ranks) > MAX_STOPPED or any(r.start_ticks is None or not r.command.strip() or r.pid < 2 for _, r in ranks):
            return {}
        for node, r in ranks:
            job.stop_reaches[node] = min(job.stop_reaches.get(node, 1 << 30), 1 << 30 if r.rank is None else r.rank)
        return {"stop_job": StopJob(
            job=job_id, grace_s=self.stop.grace_s, max_gpu_utilization_pct=max(0, int(self.policy.idle_below_pct) - 1),
            ranks=tuple(RankTarget(node_id=node, gpu_index=r.gpu, pid=r.pid, start_ticks=r.start_ticks, command=r.command[:4096])
                        for node, r in ranks),
        )}


def _seat(sample: Sample, ranks: list[tuple[int, GpuProcess]], previous: Seat | None, now: datetime) -> Seat:
    utilization = {g.index: g.utilization_gpu_pct for g in sample.gpus}
    lost = {g.index for g in sample.gpus if g.lost}
    writes: dict[tuple[int, int | None], int] = {}
    listed = {p.pid for _, p in ranks}
    seated = [replace(r, utilization=None, wrote=False, lost=True) for r in (previous.ranks if previous else ()) if r.gpu in lost and r.pid not in listed]
    for gpu, p in ranks:
        wrote = False
        if p.write_bytes is not None:
            writes[(p.pid, p.start_ticks)] = p.write_bytes
            wrote = previous is not None and previous.writes.get((p.pid, p.start_ticks), p.write_bytes) < p.write_bytes
        seated.append(Rank(p.job.rank if p.job else None, gpu, p.pid, utilization.get(gpu), wrote, lost=gpu in lost,
                           start_ticks=p.start_ticks, command=p.command))
    return Seat(tuple(seated), now, sample.interval_s, writes, sample.jobs.output_growing, sample.nccl_ras, patience(sample))


def _ras_culprit(job: Job, fresh: list[Seat]) -> Culprit | None:
    """The node whose ranks of the job's whole communicator (its world size) RAS cannot reach, as
    the idle nodes' samplers asked it; the node with most of them where several are named."""
    where = {r.rank: node for node, seat in job.seats.items() for r in seat.ranks if r.rank is not None}
    for node, (_, gone) in job.left.items():
        where.update((r, node) for r in gone if r >= 0)
    world = job.tag.world_size or len(where)
    found: dict[str, dict[int, tuple[str, NcclRasAnswer, RasRank]]] = {}
    for asked_on, seat in sorted(job.seats.items()):
        if seat not in fresh or seat.ras is None:
            continue
        for missing in seat.ras.missing:
            node = where.get(missing.rank) if missing.rank is not None and missing.communicator_size in (None, world) else None
            if node is not None:
                found.setdefault(node, {}).setdefault(missing.rank, (asked_on, seat.ras, missing))
    if not found:
        return None
    node = max(sorted(found), key=lambda n: len(found[n]))
    asked_on, answer, first = next(iter(sorted(found[node].items())))[1]
    state = "dead (unreachable for a minute)" if first.dead else "unresponsive"
    process = ", ".join(f"{label} {value}" for label, value in (("pid", first.pid), ("on", first.host), ("GPU", first.gpu)) if value is not None)
    more = f" and {len(found[node]) - 1} more of its ranks" if len(found[node]) > 1 else ""
    others = f"; it also cannot reach ranks on {', '.join(n for n in sorted(found) if n != node)}" if len(found) > 1 else ""
    return Culprit(node, "rank_unresponsive", f"NCCL's RAS ({answer.nccl_version or 'version not said'}, asked on {asked_on}) finds rank "
                   f"{first.rank}{more} on {node} {state}{f' ({process})' if process else ''}{others}")


def _ras_said(seats: list[Seat]) -> str:
    """What the job's nodes heard from NCCL's RAS, for a person when no node is named."""
    answers = [s.ras for s in seats if s.ras is not None]
    if not answers:
        return "NCCL's RAS was not heard from: no node's sampler asked it (its ranks idle for less than ras_after_s, or asking is off)"
    read = [a for a in answers if a.error is None]
    if not read:
        return f"NCCL's RAS could not be asked: {answers[0].error}"
    if all(a.missing_count == 0 for a in read):
        return f"NCCL's RAS reaches every rank ({len(read)} node(s) asked): the ranks wait, none stopped"
    return f"NCCL's RAS cannot reach {max(a.missing_count for a in read)} rank(s) ({len(read)} node(s) asked)"


def _rank_ids(seat: Seat) -> set[int]:
    """Its ranks by number (a process its launcher gave no rank: minus its pid)."""
    return {r.rank if r.rank is not None else -r.pid for r in seat.ranks}


def _ranks(ranks) -> str:
    listed = sorted(r for r in ranks if r is not None)
    text = " ".join(str(r) if r >= 0 else f"pid {-r}" for r in listed[:MAX_NAMED])
    return text + (f" and {len(listed) - MAX_NAMED} more" if len(listed) > MAX_NAMED else "") or "?"
