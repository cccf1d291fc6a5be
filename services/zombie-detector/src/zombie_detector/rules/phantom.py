"""phantom_jobs and idle_jobs: a job count with no work behind it.

Two views count a node's jobs: its own status (the sampler's job probe, `jobs.running`) and the
peer cluster's leader (`ClusterChecked.leader_view`, the runbooks' `.peers[id].selfplay_jobs`), or
with no leader (the runbooks' usual stuck state) the peer whose `peers` count the most (`view_by`).

- phantom_jobs: jobs are counted, by either view, while no process holds any of the node's GPUs
  and every GPU idles below `idle_below_pct`, for `idle_for_s`: the processes are gone (killed,
  crashed) and the count stayed. The runbook's fix resets the count on the leader
  (`POST /admin/reset_node_jobs {"node_id": ...}`): the policy's `reset_endpoint`, called where
  that endpoint's `target` says, on the leader the last cluster check named (the leader's own
  count too: it has no row of its own in `peers`, its sampler counts it). It is fixed when no
  view counts a job any more, or work is back on a GPU. With no leader, nobody can reset: a person.
- idle_jobs: the leader counts jobs on a peer whose GPU it reports below `idle_below_pct`, for
  `idle_for_s`, and no sample from that node says more (no sampler there): the runbook's own
  zombie view. Whether a hung job or a stale count, only the node can tell: a person looks.

The incident says which view saw what. Idle time is counted on the detector's clock; a view not
refreshed for `STALE_S` does not count (the count restarts), and a sample that cannot tell (a
GPU's utilisation unread) neither opens nor clears anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Literal

import msgspec

from gpumedic_events import ClusterChecked, HttpAdmin, IncidentKind, NodeRetired, PeerJobs
from gpumedic_events.base import is_subject_token
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import AdminPolicy, IdleJobsPolicy, PhantomPolicy
from zombie_detector.rules.base import Incidents, NodeId

PHANTOM = IncidentKind.PHANTOM_JOBS
IDLE = IncidentKind.IDLE_JOBS
STALE_S = 120.0
"""A view older than this (a sample, a cluster check) says nothing about now."""
SAMPLES_KEPT_INTERVALS = 3
"""A node whose last sample is older than this many of its intervals has no sampler view."""
SAMPLER_REPORTS = "the node's sampler reports it now"
NO_LONGER_COUNTED = "jobs are no longer counted on idle GPUs"
"""Why an idle-jobs and a phantom incident clear (said by `_judge` and by its busy-node shortcut, `_busy`)."""


@dataclass(frozen=True)
class NodeView:
    """What the node's own sample says: its job count, whether anything holds a GPU, whether all idle."""

    jobs: int | None
    held: bool
    idle: bool | None
    gpu_max_pct: int | None
    at: datetime
    interval_s: float


@dataclass(frozen=True)
class LeaderView:
    cluster: str
    by: str
    """The peer that counts them: the leader, or with none, the peer whose view the check took."""
    leads: bool
    jobs: PeerJobs
    at: datetime

    @property
    def said(self) -> str:
        return f"the leader {self.by}" if self.leads else f"the peer {self.by} (the cluster has no leader)"


class Counted(msgspec.Struct, frozen=True):
    """Since when a node's jobs have been counted on idle GPUs, as one kind (the rule's memory:
    `zombie_detector.memory`)."""

    node: NodeId
    kind: Literal["phantom_jobs", "idle_jobs"]
    since: datetime


class PhantomRule:
    inputs = (Sample, ClusterChecked, NodeRetired)
    entry = Counted
    of_events = False  # its streaks follow samples and cluster checks, both seen again within the minute

    def __init__(self, phantom: PhantomPolicy, idle: IdleJobsPolicy, admin: AdminPolicy) -> None:
        self.phantom = phantom
        self.idle = idle
        self.admin = admin
        self.nodes: dict[str, NodeView] = {}
        """The nodes whose last sample counted jobs or whose jobs the leader counts (only those matter)."""
        self.leader_view: dict[str, LeaderView] = {}
        self.leaders: dict[str, str | None] = {}
        """Per cluster, the leader its last check named."""
        self.since: dict[tuple[str, IncidentKind], tuple[datetime, datetime]] = {}
        """(node, kind) -> (first, last) seen so, by the detector's clock."""

    # --- inputs ---------------------------------------------------------------------------------

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, ClusterChecked):
            return self._cluster(event, now, incidents)
        if isinstance(event, NodeRetired):  # a worker the pool ended: forget it (the book closes its incidents)
            self.nodes.pop(event.node_id, None)
            self.leader_view.pop(event.node_id, None)
            self.since = {key: seen for key, seen in self.since.items() if key[0] != event.node_id}
            return []
        return self._sample(event, now, incidents)

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[Counted]:
        return [Counted(node, kind.value, first) for (node, kind), (first, _) in self.since.items()]

    def recall(self, entries: Sequence[Counted], now: datetime) -> None:
        """Each streak goes on from its start, as if last seen now (the next sample or check, within
        `STALE_S`, continues it; the views themselves come back with them)."""
        for entry in entries:
            self.since[(entry.node, IncidentKind(entry.kind))] = (min(entry.since, now), now)

    def _sample(self, sample: Sample, now: datetime, incidents: Incidents) -> list[Finding]:
        node = sample.node_id
        if not (sample.jobs.running or node in self.leader_view or node in self.nodes or _open(incidents, node, PHANTOM)):
            return []  # the hot path: a node that counts no jobs and the leader does not list
        held = any(p.pid >= 2 for g in sample.gpus for p in g.processes)
        if held and node not in self.leader_view:
            return self._busy(node, incidents)  # the other hot path: a node at work that no leader counts
        known_util = [g.utilization_gpu_pct for g in sample.gpus if g.utilization_gpu_pct is not None]
        idle = None if len(known_util) < len(sample.gpus) or not sample.gpus else max(known_util) < self.phantom.idle_below_pct
        view = NodeView(sample.jobs.running, held, idle, max(known_util, default=None), now, sample.interval_s)
        self.nodes[node] = view
        return self._judge(node, now, incidents)

    def _cluster(self, check: ClusterChecked, now: datetime, incidents: Incidents) -> list[Finding]:
        findings: list[Finding] = []
        listed = set()
        self.leaders[check.cluster] = check.leader
        by = check.view_by or check.leader
        for peer in check.leader_view:
            if not is_subject_token(peer.node_id):
                continue  # a daemon's id that cannot be a node of ours (dots, odd characters): no incident can name it
            listed.add(peer.node_id)
            if by is not None:
                self.leader_view[peer.node_id] = LeaderView(check.cluster, by, by == check.leader, peer, now)
        for node, seen in list(self.leader_view.items()):
            if seen.cluster == check.cluster and node not in listed:
                del self.leader_view[node]  # the leader no longer lists it
        for node in sorted(n for n, v in self.leader_view.items() if v.cluster == check.cluster):
            findings += self._judge(node, now, incidents)
        return findings

    # --- judging ----------------------------------------------------------------------------------

    def _busy(self, node: str, incidents: Incidents) -> list[Finding]:
        """What `_judge` finds for a node whose own sample shows a process on a GPU and that no
        leader lists: no phantom (work holds a GPU), no idle count (the sampler's view decides);
        its view is not kept (a leader that lists it later is judged with its next sample)."""
        self.nodes.pop(node, None)
        self.since.pop((node, PHANTOM), None)
        self.since.pop((node, IDLE), None)
        open_kinds = {i.kind for i in incidents.open_on(node)}
        findings = []
        if IDLE in open_kinds:
            findings.append(Finding(IDLE, node, present=False, summary=SAMPLER_REPORTS))
        if PHANTOM in open_kinds:
            findings.append(Finding(PHANTOM, node, present=False, summary=NO_LONGER_COUNTED))
        return findings

    def _judge(self, node: str, now: datetime, incidents: Incidents) -> list[Finding]:
        own = self.nodes.get(node)
        if own is not None and (now - own.at).total_seconds() > max(STALE_S, SAMPLES_KEPT_INTERVALS * own.interval_s):
            own = None
        leader = self.leader_view.get(node)
        if leader is not None and (now - leader.at).total_seconds() > STALE_S:
            leader = None
        by_leader = leader.jobs.jobs if leader is not None else None
        counted = (own is not None and (own.jobs or 0) > 0) or (by_leader or 0) > 0
        findings: list[Finding] = []
        if own is not None:
            self.since.pop((node, IDLE), None)  # the sampler's view decides now
            if _open(incidents, node, IDLE):
                findings.append(Finding(IDLE, node, present=False, summary=SAMPLER_REPORTS))
            if own.idle is None and not own.held:
                return findings  # a GPU's utilisation unread: cannot tell either way
            phantom = counted and not own.held and own.idle is True
            findings += self._streak(node, PHANTOM, phantom, now, incidents, self.phantom.idle_for_s, lambda s: self._phantom(node, own, leader, s))
            if not counted and node not in self.leader_view:
                self.nodes.pop(node, None)
            return findings
        # no sampler view: the leader's alone
        gpu = leader.jobs.gpu_percent if leader is not None else None
        if leader is None or by_leader is None or gpu is None:
            return findings
        idle = by_leader > 0 and gpu < self.idle.idle_below_pct
        return findings + self._streak(node, IDLE, idle, now, incidents, self.idle.idle_for_s, lambda s: self._idle(node, leader, s))

    def _streak(self, node: str, kind: IncidentKind, present: bool, now: datetime, incidents: Incidents, for_s: float, finding) -> list[Finding]:
        key = (node, kind)
        if not present:
            self.since.pop(key, None)
            return [Finding(kind, node, present=False, summary=NO_LONGER_COUNTED)] if _open(incidents, node, kind) else []
        first, last = self.since.get(key, (now, now))
        if (now - last).total_seconds() > STALE_S:
            first = now  # not watched in between: start again
        self.since[key] = (first, now)
        lasted = (now - first).total_seconds()
        if lasted >= for_s or _open(incidents, node, kind):
            return [finding(lasted)]
        return []

    def _phantom(self, node: str, own: NodeView, leader: LeaderView | None, lasted: float) -> Finding:
        by_node, by_leader = own.jobs, leader.jobs.jobs if leader is not None else None
        seen = []
        if by_node:
            seen.append(f"the node's own status counts {by_node}")
        if by_leader:
            seen.append(f"{leader.said} counts {by_leader}")
        # the reset goes to the leader whose view counted them; a leader's own count (it has no row
        # of its own in `peers`) is reset on itself; a leaderless cluster's, nowhere
        if leader is not None:
            reset_at = leader.by if leader.leads else None
        else:
            reset_at = node if node in self.leaders.values() else None
        endpoint = self.admin.endpoints.get(self.phantom.reset_endpoint)
        operations = {}
        if endpoint is not None and endpoint.target == "node":
            operations["http_admin"] = HttpAdmin(endpoint=self.phantom.reset_endpoint)
        elif endpoint is not None and reset_at is not None and is_subject_token(reset_at):
            operations["http_admin"] = HttpAdmin(endpoint=self.phantom.reset_endpoint, at=reset_at)
        where = f"on the leader {reset_at}" if reset_at is not None else "on the cluster's leader"
        if leader is not None and not leader.leads:
            where += " once it has one"
        return Finding(
            kind=PHANTOM,
            node_id=node,
            summary=f"{' and '.join(seen)} job(s), but no process holds any of its GPUs and they idle "
            f"(at most {own.gpu_max_pct} %) for {lasted:.0f}s",
            evidence={
                "jobs_by_node": by_node, "jobs_by_leader": by_leader, "leader": reset_at, "counted_by": leader.by if leader else None,
                "cluster": leader.cluster if leader else None, "gpu_max_pct": own.gpu_max_pct, "idle_s": round(lasted, 1),
            },
            recommended_action=f"reset the node's job count {where} (POST /admin/reset_node_jobs with its node_id)"
            + ("" if operations else f"; add actions.http_admin.endpoints.{self.phantom.reset_endpoint} to let gpumedic do it"),
            operations=operations,
        )

    def _idle(self, node: str, leader: LeaderView, lasted: float) -> Finding:
        return Finding(
            kind=IDLE,
            node_id=node,
            summary=f"{leader.said} counts {leader.jobs.jobs} job(s) on it at {leader.jobs.gpu_percent:g} % GPU "
            f"for {lasted:.0f}s; no sampler runs there to tell a hung job from a stale count",
            evidence={
                "jobs_by_leader": leader.jobs.jobs, "gpu_percent_by_leader": leader.jobs.gpu_percent,
                "leader": leader.by if leader.leads else None, "counted_by": leader.by, "cluster": leader.cluster,
                "idle_s": round(lasted, 1),
            },
            recommended_action="look on the node (nvidia-smi, ps): kill a hung job, or reset the count on the leader "
            "if no process is left; run gpumedic's node-sampler there to have it judged",
        )


def _open(incidents: Incidents, node: str, kind: IncidentKind) -> bool:
    return any(i.kind is kind for i in incidents.open_on(node))
