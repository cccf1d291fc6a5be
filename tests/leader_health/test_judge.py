"""leader-health's verdicts, from plain data."""

from __future__ import annotations

from datetime import UTC, datetime

from gpumedic_events import ClusterChecked
from gpumedic_events.base import MAX_EVENT_BYTES
from leader_health.judge import assess
from leader_health.probe import PeerAnswer
from leader_health.status import PeerLoad, PeerStatus

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def answer(leader: str | None, ok: bool = True, node: str = "n1") -> PeerAnswer:
    if not ok:
        return PeerAnswer("http://x/status", "blocked", None, "no answer within 3s")
    return PeerAnswer("http://x/status", "ok", PeerStatus(node_id=node, leader=leader, peers=("n1", "n2", "n3")))


def test_a_quorum_naming_one_leader_is_healthy():
    checked = assess("c", [answer("n1"), answer("n1"), answer(None, ok=False)])
    assert checked.healthy and checked.leader == "n1" and checked.peers_answering == 2


def test_quorum_without_a_leader_is_the_classic_stuck_cluster():
    checked = assess("c", [answer(None), answer(None), answer(None)])
    assert not checked.healthy and "no leader with quorum" in checked.summary


def test_split_votes_and_lost_quorum_are_unhealthy():
    assert not assess("c", [answer("n1"), answer("n2"), answer("n3")]).healthy
    lost = assess("c", [answer("n1"), answer(None, ok=False), answer(None, ok=False)])
    assert not lost.healthy and "quorum lost" in lost.summary
    assert not assess("c", []).healthy


def test_a_leader_that_is_no_peer_is_unhealthy_and_every_unusable_peer_is_listed_with_why():
    ghost = assess("c", [answer("n9"), answer("n9"), answer("n9")])
    assert not ghost.healthy and "their leader n9 is not a peer" in ghost.summary
    checked = assess("c", [answer("n1"), answer("n1"), answer(None, ok=False)])
    assert checked.summary.endswith("; 1 blocked")
    assert [(p.state, p.detail) for p in checked.problems] == [("blocked", "no answer within 3s")]


def test_the_view_from_every_peer_finds_one_way_pairs_and_peers_nobody_sees():
    def sees(node: str, *alive: str) -> PeerAnswer:
        return PeerAnswer(f"http://{node}/status", "ok", PeerStatus(node_id=node, leader="a", peers=alive))

    # a and b see each other; c sees a and b, but neither sees c (c is behind a NAT); d is silent.
    checked = assess("c", [sees("a", "a", "b"), sees("b", "a", "b"), sees("c", "a", "b"),
                           PeerAnswer("http://d/status", "down", None, "refused")])
    assert checked.one_way == ("c>a", "c>b") and checked.unseen == ("c",)
    assert "2 one-way pair(s); seen by no peer: c" in checked.summary
    # each answering peer's row says whom it sees (the console draws the who-sees-whom matrix from them)
    assert {p.node_id: p.sees for p in checked.peers} == {"a": ("b",), "b": ("a",), "c": ("a", "b"), None: ()}
    whole = assess("c", [sees("a", "b", "c"), sees("b", "a", "c"), sees("c", "a", "b")])
    assert whole.one_way == () and whole.unseen == () and whole.healthy


def test_a_large_clusters_check_fits_one_event_keeping_the_telling_rows():
    """3,000 peers, the leader counting every one's jobs: the check stays under what a consumer
    takes, with the peers in trouble and those the leader counts jobs on kept first."""
    ids = [f"gpu-node-{i:04d}" for i in range(3000)]
    loads = {n: PeerLoad(alive=True, voter=i < 7, jobs=(1 if i % 10 == 0 else 0), gpu_percent=50.0) for i, n in enumerate(ids)}
    leader = PeerStatus(node_id="gpu-node-0000", leader="gpu-node-0000", peers=tuple(ids[1:]), voters=7, voters_total=7, loads=loads)
    answers = [PeerAnswer(f"http://10.1.{i // 250}.{i % 250}:8770/status", "ok", leader if i == 0 else
                          PeerStatus(node_id=n, leader="gpu-node-0000", peers=("gpu-node-0000",)), took_ms=12.5) for i, n in enumerate(ids)]
    answers += [PeerAnswer(f"http://10.2.0.{i}:8770/status", "blocked", None, "no answer within 10s") for i in range(20)]
    checked = assess("big", answers)
    assert len(checked.to_json()) <= MAX_EVENT_BYTES and ClusterChecked.from_json(checked.to_json(), subject=checked.subject) == checked
    assert checked.peers_total == 3020 and checked.peers_answering == 3000  # the counts stay whole
    assert 0 < len(checked.peers) < 3020 and [row.state for row in checked.peers[:20]] == ["blocked"] * 20
    assert 0 < len(checked.leader_view) and all(p.jobs == 1 for p in checked.leader_view[:300])


def test_with_no_leader_the_jobs_are_counted_from_the_peer_that_counts_the_most():
    def counting(node: str, leader: str | None, **jobs: int) -> PeerAnswer:
        loads = {peer: PeerLoad(jobs=count, gpu_percent=0.0) for peer, count in jobs.items()}
        return PeerAnswer(f"http://{node}/status", "ok", PeerStatus(node_id=node, leader=leader, peers=("n1", "n2", "n3"), loads=loads))

    stuck = assess("c", [counting("n1", None, n2=2), counting("n2", None, n1=0, n3=2), counting("n3", None, n1=0, n2=2)])
    assert stuck.leader is None and stuck.view_by == "n2"  # two peers counted by n2 and by n3: the lower id
    assert {(p.node_id, p.jobs) for p in stuck.leader_view} == {("n1", 0), ("n3", 2)}
    led = assess("c", [counting("n1", "n3", n2=2), counting("n2", "n3", n1=0, n3=2), counting("n3", "n3", n1=1)])
    assert led.view_by == "n3" and [(p.node_id, p.jobs) for p in led.leader_view] == [("n1", 1)]  # a leader's view first
    assert assess("c", [answer(None), answer(None)]).view_by is None  # nobody counts jobs


def test_a_round_is_the_probers_overrun_only_past_what_its_slowest_peer_explains():
    from leader_health.judge import round_overran

    quick = [PeerAnswer(f"http://p{i}/status", "ok", None, took_ms=40) for i in range(1000)]
    slow = [*quick[:4], PeerAnswer("http://p9/status", "ok", None, took_ms=12_000)]
    assert round_overran(42.0, quick, 30.0)  # a thousand quick answers in 42 s: the prober fell behind
    assert not round_overran(12.3, slow, 5.0)  # one slow peer held a round of five: the peer's doing
    assert round_overran(18.0, slow, 5.0)
    assert not round_overran(4.0, quick, 30.0)
