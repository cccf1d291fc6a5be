"""One detector's open incidents, and the two rules that sit above every kind: fleet correlation
and silences.

A detector's rules only find (`Finding`); the book decides what a finding does. It looks the
fingerprint up (one open incident per fingerprint: repeats update it), and before it opens one it
asks two questions. Is a silence in force for it? Then it is recorded as silenced and requests no
action. Does the same kind already fire on much of the fleet (more than `fleet.share` of the nodes
that sampled lately, and at least `fleet.min_nodes`)? Then it is one fleet incident: the node
incidents are linked to it and request no action, and so are those of that kind still held. New
incidents wait `fleet.hold_s` before their first action for exactly this, so a sampler bug that
reports half the fleet idle at the same second ends in one fleet incident and no kill.

The book never changes itself while deciding: every method returns `Transition`s, and `commit`
swaps one in after the handler persisted and published it.
"""

from __future__ import annotations

import logging
import uuid
from collections import Counter, deque
from collections.abc import Collection, Iterable, Mapping, Sequence
from datetime import datetime, timedelta

from gpumedic_bus.topology import FLEET_NODE
from gpumedic_events import ActionCompleted, IncidentKind, SilenceAdded, SilenceRemoved
from gpumedic_incidents import lifecycle
from gpumedic_incidents.lifecycle import Transition
from gpumedic_incidents.policy import Policy
from gpumedic_incidents.state import TRAITS, Finding, IncidentState, cleared, masked, traits_of

log = logging.getLogger(__name__)

RECENTLY_CLOSED = timedelta(minutes=15)
"""How long a closed incident stays readable to the rules (`RecentCloses`): longer than a bus that
falls behind takes to deliver the facts that came with its fix."""

CLOCK_SKEW = timedelta(seconds=5)
"""How far a node's clock (a container's death) may be from the detector's (a request, its answer):
NTP keeps them within milliseconds; a few seconds for a node whose clock drifts, and no more, since
a death this long after gpumedic's action answered is one of its own."""

ROUTINE = frozenset({IncidentKind.BURN_IN})
"""Kinds that are a routine step, not a fault: many at once (a burst of rentals, each on trial) is
no fleet-wide cause, so never a fleet incident."""


class RecentCloses:
    """The incidents closed within RECENTLY_CLOSED, per node, each with when it closed (by the
    reader's clock): what a node sent while gpumedic was fixing it may arrive after the fix closed
    the incident (a killed job's container exit behind the sample that showed its GPU free)."""

    def __init__(self) -> None:
        self._by_node: dict[str, list[tuple[IncidentState, datetime]]] = {}
        self._order: deque[tuple[datetime, str]] = deque()

    def on(self, node_id: str) -> list[tuple[IncidentState, datetime]]:
        return self._by_node.get(node_id, [])

    def note(self, state: IncidentState, at: datetime) -> None:
        self._by_node.setdefault(state.node_id, []).append((state, at))
        self._order.append((at, state.node_id))
        while self._order and at - self._order[0][0] > RECENTLY_CLOSED:  # each node's list is in the same order
            _, node = self._order.popleft()
            kept = self._by_node[node]
            del kept[0]
            if not kept:
                del self._by_node[node]


_COVERING_KEPT = 100_000
"""Label sets whose silences are remembered at once (a few MB); past it the memory starts again."""


class RecentActions:
    """The work-ending actions the incidents asked for (`state.ENDS_WORK`), per node they reach, each
    as the window in which what they end may end, widened by CLOCK_SKEW: from the request to its
    answer (to the incident's deadline while none came). A death on such a node within it is
    gpumedic's own doing, whatever the incident did since (moved on, closed) and however late a busy
    bus delivers the exit: the incident's phase when it arrives says nothing then. Kept for
    RECENTLY_CLOSED after each window ends."""

    def __init__(self) -> None:
        self._windows: dict[uuid.UUID, tuple[tuple[str, ...], datetime, datetime]] = {}
        self._by_node: dict[str, set[uuid.UUID]] = {}

    def on(self, node_id: str) -> list[tuple[datetime, datetime]]:
        return [self._windows[a][1:] for a in self._by_node.get(node_id, ())]

    def note(self, before: IncidentState | None, after: IncidentState | None, at: datetime) -> None:
        """One incident's change, read at `at` (the reader's clock): an action asked opens its window,
        its answer (or the incident's end) closes it at `at`."""
        asked = after.pending_action if after is not None else None
        had = before.pending_action if before is not None else None
        if asked is not None and asked.ends_work_on and asked.action_id not in self._windows:
            until = (after.deadline if after is not None and after.deadline else asked.requested_at) + CLOCK_SKEW
            self._windows[asked.action_id] = (asked.ends_work_on, asked.requested_at - CLOCK_SKEW, until)
            for node in asked.ends_work_on:
                self._by_node.setdefault(node, set()).add(asked.action_id)
        if had is not None and (asked is None or asked.action_id != had.action_id) and had.action_id in self._windows:
            nodes, start, until = self._windows[had.action_id]
            self._windows[had.action_id] = (nodes, start, min(until, at + CLOCK_SKEW))
        self._forget(at - RECENTLY_CLOSED)

    def _forget(self, before: datetime) -> None:
        for action, (nodes, _, until) in [(a, w) for a, w in self._windows.items() if w[2] < before]:
            del self._windows[action]
            for node in nodes:
                held = self._by_node.get(node)
                if held is not None:
                    held.discard(action)
                    if not held:
                        del self._by_node[node]


class IncidentBook:
    def __init__(self, detector: str, policy: Policy) -> None:
        self.detector = detector
        self.policy = policy
        self.incidents: dict[str, IncidentState] = {}
        self._by_node: dict[str, set[str]] = {}
        self.closed = RecentCloses()
        self.acted = RecentActions()
        self.silences: dict[uuid.UUID, SilenceAdded] = {}
        self._covering: dict[tuple, tuple[SilenceAdded, ...]] = {}
        """Which silences match each incident's labels, until the silences change: a tick asks for
        every open incident, and an operator's matchers are no per-sample cost."""
        self.nodes_seen: dict[str, datetime] = {}
        """When each node last sampled, by the detector's clock: the fleet's size for correlation."""

    # --- what the rules may look at --------------------------------------------------------

    def open_on(self, node_id: str) -> list[IncidentState]:
        return [self.incidents[fp] for fp in self._by_node.get(node_id, ())]

    def closed_on(self, node_id: str) -> list[tuple[IncidentState, datetime]]:
        return self.closed.on(node_id)

    def acted_on(self, node_id: str) -> list[tuple[datetime, datetime]]:
        return self.acted.on(node_id)

    def get(self, fingerprint: str) -> IncidentState | None:
        return self.incidents.get(fingerprint)

    def by_id(self, incident_id: uuid.UUID) -> IncidentState | None:
        return next((i for i in self.incidents.values() if i.incident_id == incident_id), None)

    def fleet_size(self, now: datetime) -> int:
        since = now - timedelta(seconds=self.policy.fleet.window_s)
        return sum(1 for seen in self.nodes_seen.values() if seen >= since)

    def saw_node(self, node_id: str, now: datetime) -> None:
        self.nodes_seen[node_id] = now

    # --- inputs -----------------------------------------------------------------------------

    def on_finding(self, finding: Finding, now: datetime, *, found_with: Collection[Finding] = ()) -> list[Transition]:
        """`found_with`: the same kind newly found on other nodes at the same time (`on_findings`),
        counted for fleet correlation as if already open."""
        state = self.incidents.get(finding.fingerprint)
        if not finding.present:
            t = lifecycle.clear(state, finding, now, policy=self.policy) if state is not None else None
            return [t] if t else []
        finding = masked(finding)
        if state is not None:
            t = lifecycle.observe(state, finding, now, policy=self.policy)
            return [t] if t else []
        silence = self.silence_for(finding.kind, finding.node_id, finding.gpu_index, now, cluster=finding.cluster)
        if silence is not None:
            return [self._open(finding, now, silence_id=silence.silence_id)]
        return self._open_or_correlate(finding, now, found_with)

    def reconcile(self, found: list[Finding], checked: Iterable[IncidentKind], now: datetime) -> list[Transition]:
        """The findings of a rule that looks at everything each round: present ones into the book,
        and open incidents of the kinds `checked` that were not found again cleared."""
        checked = set(checked)
        transitions = self.on_findings(found, now)
        present = {f.fingerprint for f in found}
        for state in list(self.incidents.values()):
            if state.kind in checked and state.fingerprint not in present:
                transitions += self.on_finding(cleared(state.kind, state.node_id, state.gpu_index, state.key), now)
        return transitions

    def on_findings(self, found: Sequence[Finding], now: datetime) -> list[Transition]:
        """Findings made at one time (a round, a tick), decided together: their new nodes of a kind
        count together (decided one by one, each saw only those committed before: half the fleet
        found at once was half the fleet's node actions). They are decided on a scratch copy, each
        as if the ones before it were committed, so all join the one fleet incident the first opens.
        A finding that cannot become an incident (a rule's bug) is logged; the others still do."""
        if len(found) <= 1:  # most samples: nothing to decide together, and no copy of the book
            return self._guarded(found[0], now, ()) if found else []
        new: dict[IncidentKind, list[Finding]] = {}
        for f in found:
            if f.present and f.fingerprint not in self.incidents:
                new.setdefault(f.kind, []).append(f)
        scratch = self._scratch()
        transitions = []
        for f in found:
            for t in scratch._guarded(f, now, [o for o in new.get(f.kind, ()) if o.node_id != f.node_id]):
                scratch.commit(t)
                transitions.append(t)
        return transitions

    def _guarded(self, finding: Finding, now: datetime, found_with: Collection[Finding]) -> list[Transition]:
        try:
            return self.on_finding(finding, now, found_with=found_with)
        except Exception:
            log.exception("the %s finding on %s could not be recorded", finding.kind.value, finding.node_id)
            return []

    def _scratch(self) -> IncidentBook:
        """A copy to decide on: its own incidents, the same silences and nodes."""
        book = IncidentBook(self.detector, self.policy)
        book.adopt(self.incidents.values())
        book.silences, book._covering, book.nodes_seen = self.silences, self._covering, self.nodes_seen
        return book

    def on_action_completed(self, result: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]:
        state = self.by_id(result.incident_id)
        t = lifecycle.action_completed(state, result, now, policy=self.policy, traceparent=traceparent) if state else None
        return [t] if t else []

    def on_tick(self, now: datetime) -> list[Transition]:
        transitions = []
        for state in list(self.incidents.values()):
            if state.kind is IncidentKind.FLEET_ANOMALY:
                if not any(i.related_incident_id == state.incident_id for i in self.incidents.values()):
                    transitions.append(lifecycle.close(state, now, "no node of the fleet incident shows the fault any more"))
                continue
            silenced = self.silence_for(state.kind, state.node_id, state.gpu_index, now, cluster=state.cluster) is not None
            t = lifecycle.tick(state, now, policy=self.policy, silenced=silenced)
            if t is not None:
                transitions.append(t)
        return transitions

    def retire(self, node_id: str, now: datetime, reason: str) -> list[Transition]:
        """The node is gone for good (a worker the pool ended): every incident open on it closes,
        whatever its phase (an action still in flight answers an incident that is no more), and it
        no longer counts in the fleet."""
        self.nodes_seen.pop(node_id, None)
        return [lifecycle.close(state, now, f"the node was retired: {reason}") for state in self.open_on(node_id)]

    def gone(self, node_id: str, now: datetime, reason: str) -> list[Transition]:
        """The node no longer exists (its provider lists its worker as ended), though work on it may
        still be owed (its orphaned tasks' requeue): the incidents waiting to validate it close, since
        no sample of it will come; the others go on."""
        return [lifecycle.close(s, now, f"the node was retired: {reason}") for s in self.open_on(node_id) if s.phase == "validating"]

    def on_silence(self, event: SilenceAdded | SilenceRemoved) -> None:
        """Silences are facts replayed from the bus at start, not incident state: kept as they come."""
        if isinstance(event, SilenceAdded):
            self.silences[event.silence_id] = event
        else:
            self.silences.pop(event.silence_id, None)
        self._covering.clear()

    def silence_for(
        self, kind: IncidentKind, node_id: str, gpu_index: int | None, now: datetime, *, cluster: str | None = None,
    ) -> SilenceAdded | None:
        key = (kind, node_id, gpu_index, cluster)
        covering = self._covering.get(key)
        if covering is None:
            if len(self._covering) >= _COVERING_KEPT:
                self._covering.clear()
            covering = self._covering[key] = tuple(s for s in self.silences.values() if s.covers(kind, node_id, gpu_index, cluster))
        return next((s for s in covering if s.window_at(now) is not None), None)

    # --- state ------------------------------------------------------------------------------

    def adopt(self, states: Iterable[IncidentState]) -> None:
        """Take over the incidents of an earlier run."""
        for state in states:
            self._put(state)

    def commit(self, transition: Transition, now: datetime | None = None) -> None:
        """Swap a transition's state in, once it is persisted and its events published; a close
        decided at `now` is kept readable a while (`closed_on`)."""
        if now is not None:
            self.acted.note(transition.before, transition.after, now)
        if transition.before is not None:
            self._drop(transition.before.fingerprint)
            if transition.after is None and now is not None:
                self.closed.note(transition.before, now)
        if transition.after is not None:
            self._put(transition.after)

    def _put(self, state: IncidentState) -> None:
        self.incidents[state.fingerprint] = state
        self._by_node.setdefault(state.node_id, set()).add(state.fingerprint)

    def _drop(self, fingerprint: str) -> None:
        state = self.incidents.pop(fingerprint, None)
        if state is not None:
            fps = self._by_node.get(state.node_id)
            if fps is not None:
                fps.discard(fingerprint)
                if not fps:
                    del self._by_node[state.node_id]

    # --- opening ----------------------------------------------------------------------------

    def _open(self, finding: Finding, now: datetime, **options) -> Transition:
        return lifecycle.open_incident(finding, now, detector=self.detector, policy=self.policy, **options)

    def _open_or_correlate(self, finding: Finding, now: datetime, found_with: Collection[Finding] = ()) -> list[Transition]:
        if finding.node_id == FLEET_NODE or finding.kind in ROUTINE:
            return [self._open(finding, now)]
        fleet = self.get(fleet_fingerprint(finding.kind))
        if fleet is not None:
            return [self._open(finding, now, fleet_incident_id=fleet.incident_id)]
        since = now - timedelta(seconds=self.policy.fleet.window_s)
        members = [i for i in self.incidents.values() if i.kind is finding.kind and i.opened_at >= since]
        open_nodes = {i.node_id for i in members}
        nodes = open_nodes | {finding.node_id} | {f.node_id for f in found_with}
        size = max(self.fleet_size(now), len(nodes))
        if len(nodes) < self.policy.fleet.min_nodes or len(nodes) / size <= self.policy.fleet.share:
            return [self._open(finding, now)]
        # Much of the fleet at once: one fleet incident; this node and every held one join it.
        others = {f.node_id: f for f in found_with if f.node_id not in open_nodes}  # one per node, as counted
        common = shared([*(i.traits for i in members), traits_of(finding.evidence), *(traits_of(f.evidence) for f in others.values())])
        they_share = "; ".join(f"{key} {value} on {n} of {of}" for key, (value, n, of) in common.items())
        fleet_finding = Finding(
            kind=IncidentKind.FLEET_ANOMALY,
            node_id=FLEET_NODE,
            key=finding.kind.value,
            summary=(
                f"{finding.kind.value} on {len(nodes)} of {size} nodes within {self.policy.fleet.window_s:g}s: "
                f"more likely one fleet-wide cause (a sampler, driver or network fault) than {len(nodes)} separate "
                "faults; no node action is taken" + (f"; what they share: {they_share}" if common else "")
            ),
            evidence={"kind": finding.kind.value, "nodes": len(nodes), "fleet_size": size, "share": round(len(nodes) / size, 3),
                      **{f"shared_{key}": value for key, (value, _, _) in common.items()}},
            severity="critical",
            recommended_action=(f"start with what they share ({they_share}): a rollout, a driver update, one provider's machines"
                                if common else "check what these nodes share (sampler version, driver, network, storage) before "
                                "acting on any"),
        )
        opened = self._open(fleet_finding, now, reason="a fleet-wide signal needs a person before any node action")
        fleet_id = opened.state.incident_id
        transitions = [opened, self._open(finding, now, fleet_incident_id=fleet_id)]
        for state in list(self.incidents.values()):
            if state.kind is finding.kind:
                t = lifecycle.link_to_fleet(state, fleet_id, now)
                if t is not None:
                    transitions.append(t)
        return transitions


SHARED_SHARE = 0.8
"""A trait is what a fleet incident's nodes share when one value of it is on this share of them."""


def shared(traits: Sequence[Mapping[str, str]]) -> dict[str, tuple[str, int, int]]:
    """What most of a fleet incident's nodes had in common when their incidents opened: for each
    trait, the value on at least `SHARED_SHARE` of them (and two), with how many of how many said so."""
    common = {}
    for key in TRAITS:
        counted = Counter(t[key] for t in traits if key in t)
        if counted:
            value, n = counted.most_common(1)[0]
            if n >= 2 and n >= SHARED_SHARE * len(traits):
                common[key] = (value, n, len(traits))
    return common


def fleet_fingerprint(kind: IncidentKind) -> str:
    """Where the one fleet incident over `kind` is kept (its node is `FLEET_NODE`, its key the kind)."""
    return f"{FLEET_NODE}/{IncidentKind.FLEET_ANOMALY.value}/node/{kind.value}"
