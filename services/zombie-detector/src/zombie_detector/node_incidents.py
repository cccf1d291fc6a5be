"""Node incidents: every rule over node samples and node events, and the incident book they feed.

Pure: no bus, no clock, no I/O; tests drive it directly. An event goes to the rules that read
it (`Rule.inputs`); their findings go to the book (`gpumedic_incidents.IncidentBook`), which
opens, updates, resolves or escalates incidents with the shared lifecycle, applies silences and
fleet correlation, and returns `Transition`s for the handlers to persist, publish and commit.
The rules are listed in `zombie_detector.rules`; the thresholds and ladders come from the policy.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from datetime import datetime, timedelta

from gpumedic_events import ActionCompleted, Event, IncidentKind, NodeFindings, NodeRetired, NodeSampled
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, IncidentBook, Policy, Transition
from gpumedic_incidents.store import CLOSE_KEPT_S, state_key
from zombie_detector.clocks import NodeClocks, by_arrival
from zombie_detector.rules import Rule, build_rules
from zombie_detector.rules.job import JobRule
from zombie_detector.wire import finding_of

SOURCE = "zombie-detector"

log = logging.getLogger(__name__)
RETIRED_KEPT = timedelta(seconds=CLOSE_KEPT_S)
"""How long a retirement (or an incident's close) is remembered, against the node's last events
arriving late: an hour, as long as the state bucket keeps a close's mark for the next run."""
CLOSES_KEPT = 4096
"""Closes remembered before those older than RETIRED_KEPT are let go."""


class NodeIncidents:
    def __init__(self, policy: Policy, rules: Sequence[Rule] | None = None) -> None:
        self.book = IncidentBook(SOURCE, policy)
        self.rules = list(rules) if rules is not None else build_rules(policy)
        self._routes: dict[type[Event], list[Rule]] = {}
        self._retired: dict[str, datetime] = {}
        """Nodes retired (a worker the pool ended) and when: what they sent before arrives late."""
        self._closed_at: dict[str, datetime] = {}
        """When this book last closed an incident of each fingerprint, by its key in the state
        bucket (this book's clock; after a restart, the server's stamp on the close's mark): what a
        cell found in a node's samples from before then is older news than the close."""
        self.clocks = NodeClocks()
        self._jobs = next((rule for rule in self.rules if isinstance(rule, JobRule)), None)
        for rule in self.rules:
            for event_type in rule.inputs:
                self._routes.setdefault(event_type, []).append(rule)

    @property
    def inputs(self) -> set[type[Event]]:
        return set(self._routes)

    def on_event(self, event: Event | Sample, now: datetime) -> list[Transition]:
        """A node fact (a sample as the detector reads it off the bus: `Sample`; one given as the
        event, by a test or a tool, is read the same way first), a heartbeat or a silence."""
        if isinstance(event, NodeSampled):
            event = Sample.decode_body(event.to_json())
        node_id = getattr(event, "node_id", None)
        closed: list[Transition] = []
        if isinstance(event, NodeRetired):
            self._retired = {n: at for n, at in self._retired.items() if now - at < RETIRED_KEPT}
            self._retired[event.node_id] = event.occurred_at
            closed = self.book.retire(event.node_id, now, event.reason)
        elif node_id in self._retired:
            if event.occurred_at <= self._retired[node_id]:
                return []  # sent before the node was ended, delivered after: not a node coming back
            del self._retired[node_id]  # a new node of that id
        if isinstance(event, Sample):
            self.book.saw_node(event.node_id, now)
        at = self.clocks.time_of(event, now)  # the rules time a node by its own samples
        findings = [f for rule in self._routes.get(type(event), ()) for f in self._guarded(rule, "observe", event, by_arrival(rule, now, at))]
        return self._noted(closed, now) + self._decide(findings, now)

    def on_findings(self, event: NodeFindings, now: datetime) -> list[Transition]:
        """What a detector cell found over one input or one tick, decided together: but not what
        was sent before its node was ended, nor a fault seen in what the node sent before this
        book closed that fault's last incident (a cell that took over a partition reads the
        samples its dead holder left: the zombie that was killed meanwhile is no new one), nor
        what the job rule here, which sees every node, knows to be a job's across nodes (a cell
        sees its partitions' nodes only)."""
        findings = [finding_of(found) for found in event.findings]
        retired = {f.node_id for f in findings if f.node_id in self._retired and event.observed_at <= self._retired[f.node_id]}
        return self._decide([f for f in findings if f.node_id not in retired and not self._older_than_its_close(f, event.observed_at)
                             and not self._a_jobs_across_nodes(f)], now)

    def _older_than_its_close(self, finding: Finding, observed_at: datetime) -> bool:
        if not finding.present or finding.occurrence:  # an event's occurrence is new whenever it came
            return False
        closed_at = self._closed_at.get(state_key(finding.fingerprint))
        return closed_at is not None and observed_at <= closed_at

    def _noted(self, transitions: list[Transition], now: datetime) -> list[Transition]:
        """The closes among `transitions`, noted (those of the last hour kept)."""
        for t in transitions:
            if t.before is not None and t.after is None:
                self._closed_at[state_key(t.before.fingerprint)] = now
                if len(self._closed_at) > CLOSES_KEPT:
                    self._closed_at = {fp: at for fp, at in self._closed_at.items() if now - at < RETIRED_KEPT}
        return transitions

    def recall_closes(self, closed: dict[str, datetime]) -> None:
        """When an earlier run closed incidents (by their keys in the state bucket, those the
        bucket still marks): a cell that takes over a partition of that run's may still send what
        it found before a close."""
        self._closed_at |= closed

    def _a_jobs_across_nodes(self, finding: Finding) -> bool:
        if not finding.present or self._jobs is None:
            return False
        if finding.kind in (IncidentKind.ZOMBIE_JOB, IncidentKind.STUCK_PROCESS) and finding.gpu_index is not None:
            return self._jobs.wider_rank_on(finding.node_id, finding.gpu_index)  # the job rule judges the job as one
        if finding.kind is IncidentKind.CONTAINER_DIED:
            return self._jobs.stopping(finding.node_id, self.book)  # its ranks' exits are the ladder's doing
        return False

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]:
        return self._noted(self.book.on_action_completed(event, now, traceparent), now)

    def on_tick(self, now: datetime) -> list[Transition]:
        findings = [f for rule in self.rules for f in self._guarded(rule, "tick", None, now)]
        return self._decide(findings, now) + self._noted(self.book.on_tick(now), now)

    def _guarded(self, rule: Rule, step: str, event: Event | None, now: datetime) -> Sequence[Finding]:
        """One rule's findings; a rule that fails (a bug) is logged and costs only its own findings,
        never the other rules' judgement of the same event."""
        try:
            return rule.observe(event, now, self.book) if step == "observe" else rule.tick(now, self.book)
        except Exception:
            where = f"{getattr(type(event), 'viewed', type(event)).__name__} from {getattr(event, 'node_id', None) or '-'}" if event is not None else "a tick"
            log.exception("rule %s failed on %s; the other rules went on", type(rule).__name__, where)
            return ()

    def _decide(self, findings: list[Finding], now: datetime) -> list[Transition]:
        return self._noted(self.book.on_findings(findings, now), now)
