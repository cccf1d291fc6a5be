"""log_pattern: one of the operator's log patterns matched too many lines on a node.

node-sampler counts each pattern's matching lines in its files and the journal (runbook 001's
"Authentication failed", "Failed to reset orphaned tasks", "SSH connection failed"); each sample
carries the counts since the sampler started. `count` matches within `window_s` opens one incident
per node and pattern (key: the pattern's name) with the last matching line; fewer clears it. A
count lower than the one before is a sampler that restarted: counting goes on from there. Only the
points where a count changed are kept, so a quiet pattern costs nothing per sample. Each pattern
may have its own settings and ladder in the policy (`kinds.log_pattern.patterns.<name>`).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import IncidentKind, LogMatches, NodeRetired, RestartUnit
from gpumedic_events.node import CHECK_NAME
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, fingerprint
from gpumedic_incidents.policy import LogPatternPolicy
from zombie_detector.rules.base import Incidents, NodeId

KIND = IncidentKind.LOG_PATTERN


@dataclass
class _Seen:
    raw: int
    """The sampler's count in the last sample."""
    total: int
    """The count across sampler restarts."""
    changes: deque[tuple[datetime, int]] = field(default_factory=deque)
    """(when, total) where the total changed, the oldest at or before the window's start."""
    firing: bool = False


class Counts(msgspec.Struct, frozen=True):
    """One node's counts of one pattern within its window (the rule's memory: `zombie_detector.memory`)."""

    node: NodeId
    pattern: Annotated[str, msgspec.Meta(pattern=CHECK_NAME)]
    raw: Annotated[int, msgspec.Meta(ge=0)]
    total: Annotated[int, msgspec.Meta(ge=0)]
    changes: list[tuple[datetime, int]]
    firing: bool


class LogRule:
    inputs = (Sample, NodeRetired)
    entry = Counts
    of_events = False

    def __init__(self, policy: LogPatternPolicy) -> None:
        self.policy = policy
        self._seen: dict[str, dict[str, _Seen]] = {}
        """node -> pattern -> its counts."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        node = event.node_id
        facts = event.logs if isinstance(event, Sample) else ()
        seen = self._seen.get(node)
        if not facts and not seen:
            return ()  # the hot path: a node with no patterns of its own
        seen = self._seen.setdefault(node, {})
        findings = [
            self._gone(node, name, f"the log pattern {name} is no longer counted on {node}")
            for name in set(seen) - {f.name for f in facts}
        ]
        for name in set(seen) - {f.name for f in facts}:
            del seen[name]
        for fact in facts:
            findings.append(self._judge(node, fact, seen, now, incidents))
        if not seen:
            del self._seen[node]
        return [f for f in findings if f is not None]

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[Counts]:
        return [Counts(node, name, c.raw, c.total, list(c.changes), c.firing) for node, seen in self._seen.items() for name, c in seen.items()]

    def recall(self, entries: Sequence[Counts], now: datetime) -> None:
        """The lines matched before the takeover still count within their window; the sampler's
        count in the next sample adds those matched meanwhile."""
        for entry in entries:
            changes = deque((min(at, now), total) for at, total in entry.changes) or deque([(now, entry.total)])
            self._seen.setdefault(entry.node, {})[entry.pattern] = _Seen(entry.raw, entry.total, changes, entry.firing)

    def _judge(self, node: str, fact: LogMatches, seen: dict[str, _Seen], now: datetime, incidents: Incidents) -> Finding | None:
        rule = self.policy.of(fact.name)
        counts = seen.get(fact.name)
        if counts is None:  # what it counted before this detector saw it is history; an incident still open is not
            counts = seen[fact.name] = _Seen(raw=fact.count, total=0,
                                             firing=incidents.get(fingerprint(node, KIND, None, fact.name)) is not None)
            counts.changes.append((now, 0))
        elif fact.count != counts.raw:
            counts.total += fact.count - counts.raw if fact.count > counts.raw else fact.count  # lower: the sampler restarted
            counts.raw = fact.count
            counts.changes.append((now, counts.total))
        start = now - timedelta(seconds=rule.window_s)
        while len(counts.changes) > 1 and counts.changes[1][0] <= start:
            counts.changes.popleft()
        matched = counts.total - counts.changes[0][1]
        if matched >= rule.count:
            counts.firing = True
            return self._finding(node, fact, matched, rule.window_s)
        if counts.firing:
            counts.firing = False
            return Finding(KIND, node, key=fact.name, present=False,
                           summary=f"the log pattern {fact.name} matched {matched} line(s) within {rule.window_s:g}s, fewer than {rule.count}")
        return None

    def _gone(self, node: str, name: str, summary: str) -> Finding | None:
        return Finding(KIND, node, key=name, present=False, summary=summary) if self._seen[node][name].firing else None

    def _finding(self, node: str, fact: LogMatches, matched: int, window_s: float) -> Finding:
        rule = self.policy.of(fact.name)
        advice = rule.advice or f"read the lines that match {fact.name} in its logs on {node} (the pattern is the operator's own)"
        return Finding(
            kind=KIND, node_id=node, key=fact.name, severity=rule.severity,
            summary=f"{matched} line(s) matched the log pattern {fact.name} on {node} within {window_s:g}s; the last: {fact.last_line}"[:1000],
            evidence={"pattern": fact.name, "matched": matched, "window_s": window_s, "last_line": fact.last_line, "error": fact.error},
            recommended_action=advice,
            operations={"restart_unit": RestartUnit(unit=rule.unit)} if rule.unit is not None else {},
        )
