"""The peer cluster's monitoring log, summed up as the runbook did it by hand: peak and current
peers, time with a leader, leader changes per hour, the longest stretch without a leader, the
quorum margin, and whether a goal of N peers for H hours holds. Pure: checks in, figures out.

Time between two checks is credited to what the first one saw; the last check counts for
nothing (what follows it is unknown).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


class Check(Protocol):
    checked_at: datetime
    peers_total: int
    peers_answering: int
    leader: str | None
    healthy: bool


@dataclass(frozen=True)
class Goal:
    peers: int
    hours: float


@dataclass(frozen=True)
class ClusterSummary:
    checks: int
    first: datetime
    last: datetime
    peers_now: int
    peers_total_now: int
    peers_peak: int
    with_leader: timedelta
    leader_changes: int
    longest_leaderless: timedelta
    quorum_margin_now: int
    quorum_margin_min: int
    goal: Goal | None = None
    goal_held_for: timedelta | None = None
    """How long, up to the last check, every check had at least `goal.peers` peers answering."""

    @property
    def span(self) -> timedelta:
        return self.last - self.first

    @property
    def changes_per_hour(self) -> float:
        hours = self.span.total_seconds() / 3600
        return self.leader_changes / hours if hours > 0 else 0.0

    @property
    def goal_met(self) -> bool:
        return self.goal is not None and self.goal_held_for is not None and self.goal_held_for >= timedelta(hours=self.goal.hours)


def quorum_margin(check: Check) -> int:
    """Peers answering beyond the majority of all peers (negative: quorum lost)."""
    return check.peers_answering - (check.peers_total // 2 + 1)


def summarize(checks: Sequence[Check], goal: Goal | None = None) -> ClusterSummary | None:
    """The figures of `checks` (oldest first); None without any."""
    if not checks:
        return None
    with_leader = timedelta()
    longest = timedelta()
    leaderless_since: datetime | None = None
    changes = 0
    for before, after in zip(checks, checks[1:], strict=False):
        if before.leader is not None:
            with_leader += after.checked_at - before.checked_at
        if after.leader is not None and after.leader != before.leader:
            changes += 1
    for check in checks:
        if check.leader is None and leaderless_since is None:
            leaderless_since = check.checked_at
        elif check.leader is not None and leaderless_since is not None:
            longest = max(longest, check.checked_at - leaderless_since)
            leaderless_since = None
    if leaderless_since is not None:
        longest = max(longest, checks[-1].checked_at - leaderless_since)
    last = checks[-1]
    held = None
    if goal is not None:
        start = None
        for check in reversed(checks):
            if check.peers_answering < goal.peers:
                break
            start = check.checked_at
        held = last.checked_at - start if start is not None else None
    return ClusterSummary(
        checks=len(checks),
        first=checks[0].checked_at,
        last=last.checked_at,
        peers_now=last.peers_answering,
        peers_total_now=last.peers_total,
        peers_peak=max(c.peers_answering for c in checks),
        with_leader=with_leader,
        leader_changes=changes,
        longest_leaderless=longest,
        quorum_margin_now=quorum_margin(last),
        quorum_margin_min=min(quorum_margin(c) for c in checks),
        goal=goal,
        goal_held_for=held,
    )
