"""Judging a peer cluster from its peers' status answers: the check published every round
(`assess`) and the incidents the rules find (`ClusterIncidents`). Pure."""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import ActionCompleted, ClusterChecked, ListenBacklogReported, PeerJobs, PeerProblem, PeerRow
from gpumedic_events.base import MAX_EVENT_BYTES, is_subject_token
from gpumedic_incidents import IncidentBook, Policy, Transition
from leader_health.probe import PeerAnswer
from leader_health.rules import ClusterRules, leadership
from leader_health.status import PeerStatus

SOURCE = "leader-health"
MAX_PROBLEMS = 200
CHECK_BUDGET_BYTES = MAX_EVENT_BYTES - 8 * 1024
"""A check's largest JSON: under what consumers take, with room for the envelope."""


def assess(cluster: str, answers: list[PeerAnswer]) -> ClusterChecked:
    """Healthy when a quorum of peers answers and a quorum of all peers names the same leader,
    which must be one of the peers."""
    total = len(answers)
    view = leadership(answers)
    answering, leader = list(view.statuses), view.leader
    # The event names the leader most peers name, even one without a majority (as before).
    named_most = view.named.most_common(1)[0][0] if view.named else None
    known = {s.node_id for s in answering} | {p for s in answering for p in s.peers}
    if total == 0:
        summary, healthy = "no peers configured", False
    elif not view.has_quorum:
        summary, healthy = f"quorum lost: {view.voters_text() or f'{len(answering)}/{total} peers answer'}", False
    elif leader is None:
        summary, healthy = f"no leader with quorum: {len(answering)}/{total} answer, leaders named {dict(view.named)}", False
    elif leader not in known:
        summary, healthy = f"{len(answering)}/{total} peers answer; their leader {leader} is not a peer", False
    else:
        summary, healthy = f"{len(answering)}/{total} peers answer; leader {leader}", True
    if view.voters is not None and view.has_quorum:
        summary += f"; {view.voters_text()}"
    states = Counter(a.state for a in answers if a.status is None)
    if states:
        summary += "; " + ", ".join(f"{n} {state}" for state, n in sorted(states.items()))
    one_way, unseen = reachability(answering)
    if one_way:
        summary += f"; {len(one_way)} one-way pair(s)"
    if unseen:
        summary += f"; seen by no peer: {', '.join(unseen[:5])}"
    problems = tuple(PeerProblem(url=a.url[:512], state=a.state, detail=a.detail) for a in answers if a.status is None)
    # The leader's count of each peer's jobs (the runbooks' zombie view), for zombie-detector; with
    # no leader (the runbooks' usual stuck state, for hours) any daemon's `peers` count them too:
    # the answering peer that counts the most peers.
    by_leader = next((s for s in answering if s.node_id == leader), None) if leader is not None else None
    if by_leader is None:
        counting = [s for s in answering if any(load.jobs is not None for load in s.loads.values())]
        by_leader = min(counting, key=lambda s: (-sum(load.jobs is not None for load in s.loads.values()), s.node_id), default=None)
    loads = by_leader.loads if by_leader is not None else {}
    voters = view.voter_ids()
    # the table lists the peers in trouble first, the leader's view the peers it counts jobs on:
    # what a check too large for one event leaves out is the least telling
    peers = tuple(sorted((_row(a, loads, voters) for a in answers), key=lambda row: row.state == "ok"))
    leader_view = tuple(sorted((
        PeerJobs(node_id=node, jobs=load.jobs, gpu_percent=load.gpu_percent)
        for node, load in (by_leader.loads.items() if by_leader is not None else ())
        # a peer it counts down is peer_down's; an id that cannot be a node id can name no incident
        if load.alive and (load.jobs is not None or load.gpu_percent is not None) and is_subject_token(node)
    ), key=lambda peer: not peer.jobs))
    return _fit(ClusterChecked(
        source=SOURCE,
        cluster=cluster,
        peers_total=total,
        peers_answering=len(answering),
        voters_alive=view.voters[0] if view.voters is not None else None,
        voters_total=view.voters[1] if view.voters is not None else None,
        leader=named_most[:256] if named_most else None,
        healthy=healthy,
        summary=summary[:1000],
        problems=problems[:MAX_PROBLEMS],
        one_way=tuple(one_way[:MAX_PROBLEMS]),
        unseen=tuple(unseen[:MAX_PROBLEMS]),
        peers=peers[:4096],
        leader_view=leader_view[:4096],
        view_by=by_leader.node_id[:256] if by_leader is not None and leader_view else None,
    ))


def _fit(check: ClusterChecked) -> ClusterChecked:
    """The check within what a consumer takes (MAX_EVENT_BYTES): a large cluster's per-peer lists
    are cut, the least telling rows first (the counts in the check stay whole)."""
    for field in ("peers", "leader_view", "problems", "one_way", "unseen"):
        while getattr(check, field) and len(check.to_json()) > CHECK_BUDGET_BYTES:
            rows = getattr(check, field)
            check = check.model_copy(update={field: rows[: len(rows) // 2]})
    return check


def _row(answer: PeerAnswer, loads: dict, voters: set[str]) -> PeerRow:
    status = answer.status
    node = status.node_id if status is not None else None
    load = loads.get(node)
    return PeerRow(
        url=answer.url[:512], state="ok" if status is not None else answer.state, node_id=node, role=status.role if status else None,
        voter=(node in voters) if node is not None and voters else None, answer_ms=round(answer.took_ms, 1),
        jobs=load.jobs if load is not None else None, gpu_percent=load.gpu_percent if load is not None else None,
        sees=tuple(sorted(p[:253] for p in status.peers if p != node))[:256] if status is not None else (),
    )


def reachability(statuses: list[PeerStatus]) -> tuple[list[str], list[str]]:
    """The view from every answering peer: pairs seen one way only ('a>b': a sees b, b does not see
    a), and peers no other peer sees. Only answering peers are judged: a peer that does not answer
    says nothing about whom it sees."""
    sees = {s.node_id: set(s.peers) - {s.node_id} for s in statuses}
    one_way = sorted(f"{a}>{b}" for a, seen in sees.items() for b in seen if b in sees and a not in sees[b])
    unseen = sorted(n for n in sees if len(sees) > 1 and not any(n in seen for other, seen in sees.items() if other != n))
    return one_way, unseen


def round_overran(took_s: float, answers: Sequence[PeerAnswer], interval_s: float) -> bool:
    """Whether a probe round outlasted its interval by more than its slowest peer explains (a blocked
    or slow peer holds the round as long as it makes it wait): the prober's own lateness."""
    slowest = max((a.took_ms for a in answers), default=0.0) / 1000
    return took_s - slowest > interval_s


class ClusterIncidents:
    """The cluster's incidents: each probe round through the rules into the shared incident book."""

    def __init__(self, cluster: str, policy: Policy) -> None:
        self.book = IncidentBook(SOURCE, policy)
        self.rules = ClusterRules(cluster, policy)

    def on_round(
        self, answers: list[PeerAnswer], now: datetime, inventory: frozenset[str] | None = None, *, overran: bool = False,
    ) -> list[Transition]:
        """`overran`: the round took longer than its interval (its answer times are the prober's too)."""
        for answer in answers:
            self.book.saw_node(self.rules.node(answer.url), now)
        findings = self.rules.observe(answers, now, self.book, inventory, overran=overran)
        return [t for finding in findings for t in self.book.on_finding(finding, now)]

    def on_backlog(self, event: ListenBacklogReported, now: datetime) -> list[Transition]:
        """Kept for the next round, which judges it beside its probe of the node's daemon."""
        self.rules.on_backlog(event, now)
        return []

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]:
        return self.book.on_action_completed(event, now, traceparent)

    def on_tick(self, now: datetime) -> list[Transition]:
        return self.book.on_tick(now)
