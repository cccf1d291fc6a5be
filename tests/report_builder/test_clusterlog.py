"""The cluster monitoring log's summary, from plain checks: what the runbook computed by hand."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpumedic_store.clusterlog import Goal, quorum_margin, summarize

T0 = datetime(2026, 11, 23, 8, 0, tzinfo=UTC)


@dataclass
class Check:
    checked_at: datetime
    peers_total: int
    peers_answering: int
    leader: str | None
    healthy: bool = True
    voters_alive: int | None = None
    voters_total: int | None = None


def log(*rows: tuple[float, int, str | None], total: int = 7) -> list[Check]:
    """(minutes after T0, peers answering, leader) per check."""
    return [Check(T0 + timedelta(minutes=m), total, n, leader, leader is not None) for m, n, leader in rows]


def test_a_leaderless_stretch_with_quorum_is_measured_and_changes_are_counted():
    checks = log((0, 6, "a"), (10, 6, "a"), (20, 6, None), (30, 5, None), (40, 6, "b"), (50, 7, "b"), (60, 7, "a"))
    s = summarize(checks)
    assert (s.checks, s.span) == (7, timedelta(hours=1))
    assert s.with_leader == timedelta(minutes=40)  # 0-20 and 40-60
    assert s.longest_leaderless == timedelta(minutes=20)  # from the first leaderless check to the next leader
    assert s.leader_changes == 2 and s.changes_per_hour == 2.0  # a -> (none) -> b, then b -> a
    assert (s.peers_now, s.peers_peak, s.peers_total_now) == (7, 7, 7)
    assert s.quorum_margin_min == 1 and s.quorum_margin_now == 3  # 5 of 7 answering: one above the majority of 4


def test_a_stretch_still_leaderless_at_the_end_counts_up_to_the_last_check():
    s = summarize(log((0, 6, "a"), (10, 6, None), (25, 6, None)))
    assert s.longest_leaderless == timedelta(minutes=15) and s.with_leader == timedelta(minutes=10)


def test_the_goal_holds_only_when_every_check_of_the_last_hours_had_enough_peers():
    rows = [(m, 20, "a") for m in range(0, 181, 10)]
    assert summarize(log(*rows, total=20), Goal(20, 3)).goal_met
    broken = rows[:]
    broken[10] = (100, 18, "a")  # dipped at 100 min: held again from the 110 min check on
    s = summarize(log(*broken, total=20), Goal(20, 3))
    assert not s.goal_met and s.goal_held_for == timedelta(minutes=70)
    now_short = summarize(log((0, 20, "a"), (10, 19, "a"), total=20), Goal(20, 1))
    assert not now_short.goal_met and now_short.goal_held_for is None


def test_no_checks_no_summary_and_quorum_lost_is_a_negative_margin():
    assert summarize([]) is None
    assert quorum_margin(Check(T0, 7, 3, None)) == -1


def test_time_no_check_saw_is_unmonitored_neither_with_a_leader_nor_part_of_a_goal():
    # a check a minute, then the checker stopped for 20 minutes (a stack restarted), then on again
    rows = [(m, 7, "a") for m in range(0, 11)] + [(m, 7, "a") for m in range(30, 41)]
    s = summarize(log(*rows), Goal(7, 0.5))
    assert s.unmonitored == timedelta(minutes=20)
    assert s.with_leader == timedelta(minutes=20)  # 0-10 and 30-40, not the 20 nobody saw
    assert s.goal_held_for == timedelta(minutes=10) and not s.goal_met  # held since the checks came back only
    # checks a minute apart with no gap: nothing unmonitored
    assert summarize(log(*[(m, 7, "a") for m in range(0, 31)]), Goal(7, 0.5)).unmonitored == timedelta()


def test_the_quorum_margin_is_the_voters_as_the_daemons_count_them():
    """The runbook's normal state: "Active Peers: 3, Voters: 3/5 (quorum OK)" among 8 peers reads
    +0 on the voters, where counting every peer made it -2 (a quorum lost that was not)."""
    normal = Check(T0, 8, 3, "a", voters_alive=3, voters_total=5)
    assert quorum_margin(normal) == 0
    ample = Check(T0 + timedelta(minutes=1), 7, 7, "a", voters_alive=5, voters_total=7)  # "Voters: 5/7 (quorum OK)"
    low = Check(T0 + timedelta(minutes=2), 8, 6, "a", voters_alive=2, voters_total=8)  # "Voters: 2/8 (CRITICAL - low quorum)"
    assert (quorum_margin(ample), quorum_margin(low)) == (1, -3)
    s = summarize([normal, ample, low])
    assert (s.quorum_margin_now, s.quorum_margin_min) == (-3, -3)
    # daemons that report no voters: the peers answering against all peers, as before
    assert quorum_margin(Check(T0, 7, 6, "a")) == 2
