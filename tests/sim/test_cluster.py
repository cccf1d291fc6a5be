"""The simulated peer cluster on its own clock: membership converges, voters make quorum, and each
fault shows in the peers' /status as a real cluster's would."""

from __future__ import annotations

from gpumedic_sim.machine.cluster import PeerCluster

NODES = [f"n{i:02d}" for i in range(1, 21)]


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def cluster(**kw) -> tuple[PeerCluster, Clock]:
    clock = Clock()
    return PeerCluster(NODES, voters=7, convergence_s=8.0, clock=clock, **kw), clock


def test_a_settled_cluster_sees_everyone_with_quorum_and_one_leader():
    c, _ = cluster()
    s = c.status("n05")
    assert (s["leader"], s["role"], s["voters"], s["voters_total"], s["quorum"]) == ("n01", "follower", 7, 7, True)
    assert sorted(s["peers"]) == [n for n in NODES if n != "n05"] and c.status("n01")["role"] == "leader"


def test_a_joining_peer_is_met_over_the_convergence_time_both_ways():
    c, clock = cluster()
    c.join("n12")
    assert c.status("n12")["peers"] == [] and c.status("n12")["leader"] is None
    assert not any("n12" in c.status(n)["peers"] for n in NODES if n != "n12")
    clock.now += 4
    partly = sum("n12" in c.status(n)["peers"] for n in NODES if n != "n12")
    assert 0 < partly < len(NODES) - 1  # gossip: some have met it, not all
    clock.now += 4
    assert all("n12" in c.status(n)["peers"] for n in NODES if n != "n12")
    assert c.status("n12")["leader"] == "n01" and len(c.status("n12")["peers"]) == len(NODES) - 1


def test_a_leader_leaving_leaves_no_leader_until_an_election_and_others_drop_it_over_time():
    c, clock = cluster()
    c.leave("n01")
    assert c.leader is None and c.status("n02")["leader"] is None
    assert c.elect() == "n02"  # the first voter still running
    clock.now += 8
    assert all("n01" not in c.status(n)["peers"] for n in NODES[1:])
    assert c.status("n03")["voters"] == 6 and c.status("n03")["quorum"]  # 6/7: quorum holds


def test_faults_show_in_the_peers_status():
    c, _ = cluster()
    c.quorum_lost = True
    lost = c.status("n09")
    assert (lost["quorum"], lost["leader"], lost["voters"]) == (False, None, 3)
    c.quorum_lost = False
    c.rival, c.rival_followers = "n03", frozenset({"n03", "n04", "n05"})
    assert {c.status(n)["leader"] for n in NODES} == {"n01", "n03"} and c.status("n03")["role"] == "leader"
    c.rival_followers = frozenset()
    c.hidden["n15"] = frozenset(NODES[::2])
    assert len(c.status("n15")["peers"]) == len(NODES) - 1  # it sees them all
    assert sum("n15" in c.status(n)["peers"] for n in NODES) == 10  # the 9 others of NODES[::2] do not see it
    c.never_join(["n19", "n20"])
    assert c.status("n19") | {"uptime_s": 0} == c.status("n20") | {"node_id": "n19", "uptime_s": 0}
    assert c.status("n19")["role"] == "joining" and "n19" not in c.status("n01")["peers"]
