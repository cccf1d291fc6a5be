"""The peer cluster's monitoring log, summed up as the runbook did it by hand: peak and current
peers, time with a leader, leader changes per hour, the longest stretch without a leader, the
quorum margin, and whether a goal of N peers for H hours holds. Pure: checks in, figures out.

Time between two checks is credited to what the first one saw; the last check counts for
nothing (what follows it is unknown). Neither does a gap between two checks longer than
`GAP_FACTOR` times their usual spacing (the checker stopped: a stack restarted, say): that time is
unmonitored, counts as neither with nor without a leader, and no goal holds across it.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol


GAP_FACTOR = 3.0
"""A gap between checks this many times their median spacing is time nobody checked."""


class Check(Protocol):
    checked_at: datetime
    peers_total: int
    peers_answering: int
    voters_alive: int | None
    voters_total: int | None
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
    unmonitored: timedelta = timedelta()
    """Time in gaps between checks (see the module docstring): no check saw it."""
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
    """Voters alive beyond the majority of the voters, as the daemons count them ("Voters 5/7":
    +1); for a cluster whose daemons report no voters, peers answering beyond the majority of all
    peers. Negative: quorum lost."""
    if check.voters_alive is not None and check.voters_total:
        return check.voters_alive - (check.voters_total // 2 + 1)
    return check.peers_answering - (check.peers_total // 2 + 1)


def summarize(checks: Sequence[Check], goal: Goal | None = None) -> ClusterSummary | None:
    """The figures of `checks` (oldest first); None without any."""
    if not checks:
        return None
    with_leader = timedelta()
    unmonitored = timedelta()
    longest = timedelta()
    leaderless_since: datetime | None = None
    changes = 0
    gap = _gap(checks)
    for before, after in zip(checks, checks[1:], strict=False):
        between = after.checked_at - before.checked_at
        if gap is not None and between > gap:
            unmonitored += between
        elif before.leader is not None:
            with_leader += between
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
        for check, after in zip(reversed(checks), [None, *reversed(checks)], strict=False):
            if check.peers_answering < goal.peers or (after is not None and gap is not None and after.checked_at - check.checked_at > gap):
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
        unmonitored=unmonitored,
        goal=goal,
        goal_held_for=held,
    )


def _gap(checks: Sequence[Check]) -> timedelta | None:
    """The spacing beyond which two checks leave a gap; None with too few checks to know the usual one."""
    spacings = [b.checked_at - a.checked_at for a, b in zip(checks, checks[1:], strict=False)]
    if len(spacings) < 3:
        return None
    return statistics.median(spacings) * GAP_FACTOR
