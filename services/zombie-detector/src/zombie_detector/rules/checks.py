"""check_failed: one of the operator's own check scripts on a node says there is a problem.

node-sampler runs the scripts (node-problem-detector's contract: exit 0 ok, 1 a problem, anything
else unknown) and each sample carries every check's last result. A check that keeps saying
"problem" for its `for_s` opens one incident per node and check (key: the check's name) with the
first line it printed; "ok" clears it; "unknown" (the script could not tell, timed out, or could
not run) opens and clears nothing. A check the node no longer runs clears its incident. Each check
may have its own settings and ladder in the policy (`kinds.check_failed.checks.<name>`); the
fleet hold, silences and the breaker apply as to every kind, so a check failing on much of the
fleet at once is one fleet incident.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import CheckFact, IncidentKind, NodeRetired, RestartUnit
from gpumedic_events.node import CHECK_NAME
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, fingerprint
from gpumedic_incidents.policy import CheckFailedPolicy
from zombie_detector.rules.base import Incidents, NodeId

KIND = IncidentKind.CHECK_FAILED


class Failing(msgspec.Struct, frozen=True):
    """Since when a node's check has said "problem" (the rule's memory: `zombie_detector.memory`)."""

    node: NodeId
    check: Annotated[str, msgspec.Meta(pattern=CHECK_NAME)]
    since: datetime


class CheckRule:
    inputs = (Sample, NodeRetired)
    entry = Failing
    of_events = False

    def __init__(self, policy: CheckFailedPolicy) -> None:
        self.policy = policy
        self.failing_since: dict[tuple[str, str], datetime] = {}
        """(node, check) -> the first sample that said 'problem' since it last said 'ok'."""
        self._checks: dict[str, frozenset[str]] = {}
        """node -> the checks its sampler runs."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        node = event.node_id
        facts = event.checks if isinstance(event, Sample) else ()
        before = self._checks.get(node, frozenset())
        if not facts and not before:
            return ()  # the hot path: a node with no checks of its own
        names = frozenset(f.name for f in facts)
        if names:
            self._checks[node] = names
        else:
            self._checks.pop(node, None)
        for name in names - before:  # first seen (a detector that restarted): an incident still open counts as failing
            if incidents.get(fingerprint(node, KIND, None, name)) is not None:
                self.failing_since.setdefault((node, name), now)
        findings = [self._gone(node, name, f"the check {name} no longer runs on {node}") for name in before - names]
        for fact in facts:
            if fact.status == "problem":
                since = self.failing_since.setdefault((node, fact.name), now)
                if now - since >= timedelta(seconds=self.policy.of(fact.name).for_s):
                    findings.append(self._finding(node, fact))
            elif fact.status == "ok":
                findings.append(self._gone(node, fact.name, f"the check {fact.name} passes again"))
        return [f for f in findings if f is not None]

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[Failing]:
        return [Failing(node, check, since) for (node, check), since in self.failing_since.items()]

    def recall(self, entries: Sequence[Failing], now: datetime) -> None:
        for entry in entries:
            self.failing_since[(entry.node, entry.check)] = min(entry.since, now)

    def _gone(self, node: str, name: str, summary: str) -> Finding | None:
        """The check's problem is over: a finding only where one was seen."""
        if self.failing_since.pop((node, name), None) is None:
            return None
        return Finding(KIND, node, key=name, present=False, summary=summary)

    def _finding(self, node: str, fact: CheckFact) -> Finding:
        check = self.policy.of(fact.name)
        said = fact.message or "no message"
        advice = check.advice or f"run {fact.name} on {node} by hand and read what it prints; the check is the operator's own"
        return Finding(
            kind=KIND, node_id=node, key=fact.name, severity=check.severity,
            summary=f"the check {fact.name} fails on {node}: {said}"[:1000],
            evidence={"check": fact.name, "status": fact.status, "message": fact.message, "ran_at": fact.ran_at.isoformat()},
            recommended_action=advice,
            operations={"restart_unit": RestartUnit(unit=check.unit)} if check.unit is not None else {},
        )

