"""leader-health's cluster rules through the shared incident book, from plain probe answers:
each runbook fault opens its incident, and the fix each proposes is the one the runbook applies."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    HttpAdmin,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    ListenBacklogReported,
    RestartUnit,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import (
    Actions,
    AdminEndpoint,
    AdminPolicy,
    BlockedPeerPolicy,
    FleetPolicy,
    Kinds,
    NoLeaderPolicy,
    PartitionPolicy,
    PeerPolicy,
    RestartPolicy,
    Step,
    TargetPolicy,
    UnitRule,
)
from leader_health.judge import ClusterIncidents
from leader_health.probe import PeerAnswer
from leader_health.status import PeerStatus

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
DAEMON = "p2p-node.service"
POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    actions=Actions(
        http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url="http://127.0.0.1:8080/admin/elect")}),
        restart_unit=RestartPolicy(units={"gpumedic-node-sampler.service": UnitRule(), DAEMON: UnitRule()}),
    ),
    kinds=Kinds(
        no_leader=NoLeaderPolicy(grace_s=30, ladder=(Step(action="http_admin", verify_within_s=30),)),
        peer_blocked=BlockedPeerPolicy(after_checks=3, daemon_unit=DAEMON, ladder=(Step(action="restart_unit"),)),
        peer_down=PeerPolicy(after_checks=2, daemon_unit=DAEMON, ladder=(Step(action="restart_unit"),)),
        peers_below_target=TargetPolicy(target=5, for_s=60),
    ),
)
NODES = ["p1", "p2", "p3", "p4", "p5"]


def ok(node: str, leader: str | None = "p1", peers: list[str] = NODES, quorum: bool | None = None) -> PeerAnswer:
    return PeerAnswer(f"http://{node}:8770/status", "ok", PeerStatus(node_id=node, leader=leader, peers=tuple(peers), quorum=quorum))


def bad(node: str, state: str) -> PeerAnswer:
    return PeerAnswer(f"http://{node}:8770/status", state, None, f"{state} for a test")


class Cluster:
    def __init__(self, policy: Policy = POLICY) -> None:
        self.logic = ClusterIncidents("selfplay", policy)
        self.events: list = []

    def round(self, s: float, answers: list[PeerAnswer], inventory: frozenset[str] | None = None, *, overran: bool = False) -> list:
        out = []
        for t in self.logic.on_round(answers, T0 + timedelta(seconds=s), inventory, overran=overran):
            self.logic.book.commit(t)
            out += t.events
        self.events += out
        return out

    def opened(self) -> list[IncidentOpened]:
        return [e for e in self.events if isinstance(e, IncidentOpened)]


def test_a_healthy_cluster_opens_nothing():
    c = Cluster()
    for s in range(0, 300, 10):
        c.round(s, [ok(n) for n in NODES])
    assert c.events == []


def test_quorum_without_a_leader_past_the_grace_forces_an_election_through_a_peer_and_resolves_when_one_leads():
    c = Cluster()
    leaderless = [ok(n, leader=None) for n in NODES]
    assert c.round(0, leaderless) == [] and c.round(20, leaderless) == []  # an election takes a while
    opened, request = c.round(30, leaderless)
    assert opened.kind is IncidentKind.NO_LEADER and opened.node_id == "p1" and opened.fingerprint == "p1/no_leader/node/selfplay"
    assert "5 peers answer (quorum 3) but none has led for 30s" in opened.summary
    assert isinstance(request, ActionRequested) and request.operation == HttpAdmin(endpoint="force_election")
    done = ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id, node_id="p1",
                           attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="force_election: HTTP 200")
    for t in c.logic.on_action_completed(done, T0 + timedelta(seconds=31), None):
        c.logic.book.commit(t)
    (resolved,) = c.round(40, [ok(n, leader="p3") for n in NODES])
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"


def test_without_an_election_endpoint_a_leaderless_cluster_goes_to_a_person():
    c = Cluster(Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(no_leader=NoLeaderPolicy(grace_s=0, ladder=(Step(action="http_admin"),)))))
    opened, escalated = c.round(0, [ok(n, leader=None) for n in NODES])
    assert isinstance(escalated, IncidentEscalated) and "no safe http_admin" in escalated.reason
    assert "add actions.http_admin.endpoints.force_election" in opened.recommended_action


def test_a_blocked_peer_is_an_incident_on_it_after_three_rounds_and_its_daemon_is_restarted():
    c = Cluster()
    for s in (0, 10):
        assert c.round(s, [ok(n) for n in NODES]) == []  # learns each URL's node id
    rounds = [[ok(n) for n in NODES[:4]] + [bad("p5", "blocked")] for _ in range(3)]
    assert c.round(20, rounds[0]) == [] and c.round(30, rounds[1]) == []
    opened, request = c.round(40, rounds[2])
    assert (opened.kind, opened.node_id) == (IncidentKind.PEER_BLOCKED, "p5") and "event loop is blocked" in opened.summary
    assert request.operation == RestartUnit(unit=DAEMON) and request.node_id == "p5"


def backlog(node: str, waiting: int, limit: int = 128) -> ListenBacklogReported:
    return ListenBacklogReported(source="node-sampler", node_id=node, port=8770, waiting=waiting, limit=limit)


def test_a_blocked_peer_whose_own_node_counts_its_unaccepted_connections_is_an_incident_at_the_first_round():
    """Runbook 002: TCP accepted, HTTP silent, and 26-33 connections pending on the daemon's port.
    With the node's own word on its queue, one blocked round is enough; without it, three."""
    c = Cluster()
    for s in (0, 10):
        c.round(s, [ok(n) for n in NODES])
    c.logic.on_backlog(backlog("p5", 29), T0 + timedelta(seconds=15))
    c.logic.on_backlog(backlog("p4", 3), T0 + timedelta(seconds=15))  # under backlog_from (8): the three rounds stand
    opened, request = c.round(20, [ok(n) for n in NODES[:3]] + [bad("p4", "blocked"), bad("p5", "blocked")])
    assert (opened.kind, opened.node_id) == (IncidentKind.PEER_BLOCKED, "p5") and request.operation == RestartUnit(unit=DAEMON)
    assert "its own node counts 29 connections waiting unaccepted on port 8770 (of 128" in opened.summary
    assert (opened.evidence["waiting"], opened.evidence["limit"], opened.evidence["port"]) == (29, 128, 8770)
    assert [e.node_id for e in c.round(30, [ok(n) for n in NODES[:3]] + [bad("p4", "blocked"), bad("p5", "blocked")])
            if isinstance(e, IncidentOpened)] == []
    assert [e.node_id for e in c.round(40, [ok(n) for n in NODES[:3]] + [bad("p4", "blocked"), bad("p5", "blocked")])
            if isinstance(e, IncidentOpened)] == ["p4"]


def test_a_peer_whose_full_queue_drops_connections_is_a_blocked_daemon_to_restart_not_a_host_that_is_down():
    """A full accept queue drops new SYNs, so the probe gets no TCP answer; the node's own sampler
    still reports, so the host is up and the daemon is what to restart."""
    c = Cluster()
    for s in (0, 10):
        c.round(s, [ok(n) for n in NODES])
    c.logic.on_backlog(backlog("p5", 128), T0 + timedelta(seconds=18))
    opened, request = c.round(20, [ok(n) for n in NODES[:4]] + [bad("p5", "unreachable")])
    assert opened.kind is IncidentKind.PEER_BLOCKED and request.operation == RestartUnit(unit=DAEMON)
    assert opened.evidence["state"] == "blocked" and "128 connections waiting" in opened.summary


def test_a_drained_or_old_backlog_no_longer_counts():
    c = Cluster()
    for s in (0, 10):
        c.round(s, [ok(n) for n in NODES])
    c.logic.on_backlog(backlog("p5", 40), T0)
    c.logic.on_backlog(backlog("p5", 0), T0 + timedelta(seconds=5))  # drained: the sampler's all-clear
    c.logic.on_backlog(backlog("p4", 40), T0 - timedelta(seconds=120))  # its sampler said nothing since
    assert c.round(20, [ok(n) for n in NODES[:3]] + [bad("p4", "blocked"), bad("p5", "blocked")]) == []


def test_a_refusing_daemon_is_restarted_but_a_silent_host_goes_to_a_person():
    c = Cluster()
    for s in (0, 10):
        c.round(s, [ok(n) for n in NODES[:4]] + [bad("p5", "down")])
    down, restart = c.opened()[0], c.events[-1]
    assert down.kind is IncidentKind.PEER_DOWN and restart.operation == RestartUnit(unit=DAEMON)
    c = Cluster()
    for s in (0, 10):
        c.round(s, [ok(n) for n in NODES[:4]] + [bad("p5", "unreachable")])
    (opened,) = c.opened()
    assert opened.kind is IncidentKind.PEER_DOWN and "its host does not answer" in opened.summary
    assert any(isinstance(e, IncidentEscalated) for e in c.events)


def test_lost_quorum_and_split_brain_are_cluster_incidents_for_a_person():
    c = Cluster()
    c.round(0, [ok("p1"), ok("p2")] + [bad(n, "down") for n in NODES[2:]])
    assert [o.kind for o in c.opened()] == [IncidentKind.QUORUM_LOST]
    assert c.opened()[0].node_id == "selfplay" and c.opened()[0].severity == "critical"
    c = Cluster()
    split_round = [ok("p1", "p1"), ok("p2", "p1"), ok("p3", "p3"), ok("p4", "p3"), ok("p5", "p1")]
    c.round(0, split_round)
    assert c.opened() == []  # one round naming two leaders may be an election converging
    c.round(10, split_round)
    (split,) = c.opened()
    assert split.kind is IncidentKind.SPLIT_BRAIN and "2 different leaders" in split.summary


def test_an_election_converging_or_a_flapping_leader_is_no_split_brain():
    """Old and new leader named for a round, then only the new one; or the named pair changing every
    round (the leader flapping: that is leader_flapping's): no split brain."""
    c = Cluster()
    c.round(0, [ok(n, "p1") for n in NODES])
    c.round(10, [ok("p1", "p2"), ok("p2", "p2"), ok("p3", "p1"), ok("p4", "p2"), ok("p5", "p2")])
    c.round(20, [ok(n, "p2") for n in NODES])
    for s, (old, new) in zip(range(30, 90, 10), [("p2", "p3"), ("p3", "p4"), ("p4", "p5"), ("p5", "p1"), ("p1", "p2"), ("p2", "p3")]):
        c.round(s, [ok("p1", old), ok("p2", new), ok("p3", new), ok("p4", old), ok("p5", new)])
    assert IncidentKind.SPLIT_BRAIN not in [o.kind for o in c.opened()]


def test_answering_peers_that_say_they_lost_quorum_are_lost_quorum_not_a_missing_leader():
    c = Cluster()
    for s in range(0, 60, 10):  # past no_leader's grace: every peer answers, none has quorum
        c.round(s, [ok(n, leader=None, quorum=False) for n in NODES])
    assert [o.kind for o in c.opened()] == [IncidentKind.QUORUM_LOST]
    assert "5 of 5 answering peers say they have no quorum" in c.opened()[0].summary
    c = Cluster()  # one peer catching up without quorum is no lost quorum
    for s in range(0, 60, 10):
        c.round(s, [ok(n, quorum=True) for n in NODES[:4]] + [ok("p5", leader=None, quorum=False)])
    assert c.events == []


def test_two_leaders_without_a_majority_are_a_split_brain_and_never_a_missing_leader():
    c = Cluster()
    for s in range(0, 60, 10):
        c.round(s, [ok("p1", "p1"), ok("p2", "p1"), ok("p3", "p3"), ok("p4", "p3"), ok("p5", None)])
    assert [o.kind for o in c.opened()] == [IncidentKind.SPLIT_BRAIN]


def test_a_peer_much_of_the_cluster_cannot_see_is_partitioned_after_membership_had_time_to_converge():
    policy = POLICY.model_copy(update={"kinds": POLICY.kinds.model_copy(update={"peer_partitioned": PartitionPolicy(for_s=30)})})
    behind_nat = [ok("p1", peers=NODES)] + [ok(n, peers=[m for m in NODES if m != "p1"]) for n in NODES[1:]]
    c = Cluster(policy)
    for s in (0, 10, 20):  # a peer joining is unseen for a while: not yet an incident
        c.round(s, behind_nat)
    assert c.events == []
    c.round(30, behind_nat)
    (opened,) = c.opened()
    assert (opened.kind, opened.node_id) == (IncidentKind.PEER_PARTITIONED, "p1")
    assert "4 of the 4 other answering peers do not see it" in opened.summary
    assert (opened.evidence["not_seen_by"], opened.evidence["does_not_see"]) == ("p2 p3 p4 p5", "")  # its column and row
    assert any(isinstance(e, IncidentEscalated) for e in c.events)  # the network is a person's
    (resolved,) = c.round(40, [ok(n) for n in NODES])
    assert isinstance(resolved, IncidentResolved)
    c = Cluster(policy)  # one that sees nobody never joined: not a partition (it is the target's business)
    for s in range(0, 100, 10):
        c.round(s, [ok(n, peers=NODES[:4]) for n in NODES[:4]] + [ok("p5", leader=None, peers=[])])
    assert IncidentKind.PEER_PARTITIONED not in [o.kind for o in c.opened()]


def test_a_flapping_leader_and_too_few_peers_open_their_incidents():
    c = Cluster()
    for i, s in enumerate(range(0, 50, 10)):
        c.round(s, [ok(n, leader=NODES[i % 2]) for n in NODES])
    assert IncidentKind.LEADER_FLAPPING in [o.kind for o in c.opened()]
    c = Cluster()
    # p5 answers but never joined: the leader counts four members, itself included
    four = [ok(n, peers=NODES[:4]) for n in NODES[:4]] + [ok("p5", leader=None, peers=[])]
    for s in range(0, 70, 10):
        c.round(s, four)
    (below,) = c.opened()
    assert below.kind is IncidentKind.PEERS_BELOW_TARGET and "the cluster has 4 peers, below the target of 5" in below.summary


def test_a_member_no_inventory_names_is_a_stranger_after_its_rounds_and_clears_once_gone():
    c = Cluster()
    inventory = frozenset({"p1", "p2", "p3", "p4", "10.0.0.5"})  # p5 answers under its own name, at an address the inventory has
    with_test = [ok(n, peers=[*NODES, "test"]) for n in NODES]
    for s in (0, 10):
        c.round(s, with_test, inventory)
    assert c.opened() == []  # after_checks: 3 rounds
    c.round(20, with_test, inventory)
    (opened,) = c.opened()
    assert opened.kind is IncidentKind.UNKNOWN_PEER and opened.node_id == "selfplay"
    assert opened.summary.startswith("5 peer(s) of cluster selfplay count 'test' as a member, which no inventory names (listed by p1, p2")
    assert not [e for e in c.events if isinstance(e, ActionRequested)]  # a person's
    c.round(30, [ok(n) for n in NODES], inventory)
    assert [e.incident_id for e in c.events if isinstance(e, IncidentResolved)] == [opened.incident_id]
    # without an inventory, nobody is a stranger: a watched peer that never answered could not be told from one
    blind = Cluster()
    for s in range(0, 100, 10):
        blind.round(s, with_test)
    assert blind.opened() == []


def test_a_daemon_that_lists_thousands_of_made_up_members_makes_a_bounded_number_of_incidents():
    c = Cluster()
    flood = [ok(n, peers=[*NODES, *(f"ghost-{i}" for i in range(500))]) for n in NODES]
    for s in (0, 10, 20):
        c.round(s, flood, frozenset(NODES))
    assert len(c.opened()) == 20 and {e.kind for e in c.opened()} == {IncidentKind.UNKNOWN_PEER}


def test_a_round_that_overran_its_interval_judges_no_peer_slow():
    """On a busy control plane the prober itself is late: each answer's time is partly its own. A
    slow answer in a round that overran neither counts towards slow_peer nor clears it."""
    c = Cluster()
    slow = [ok(n) for n in NODES[:4]] + [PeerAnswer("http://p5:8770/status", "ok", PeerStatus(node_id="p5", leader="p1", peers=tuple(NODES)),
                                                    took_ms=12_000)]
    for s in range(0, 100, 10):
        assert c.round(s, slow, overran=True) == []
    for s in range(100, 130, 10):
        c.round(s, slow)  # rounds that kept up: the peer is judged by them alone
    (opened,) = [e for e in c.opened() if e.kind is IncidentKind.SLOW_PEER]
    assert opened.node_id == "p5" and "(3 checks in a row)" in opened.summary


def test_timeouts_the_prober_measured_while_it_was_late_itself_open_nothing():
    """A starved leader-health (its loop lagging, its round overrunning) times out on peers that
    would have answered: a peer it could not hear then is neither blocked nor down by that round,
    and its streak goes on from the rounds that kept up. A refusal is no timeout and still counts."""
    c = Cluster()
    late = [ok(n) for n in NODES[:3]] + [bad("p4", "blocked"), bad("p5", "unreachable")]
    for s in range(0, 100, 10):
        assert c.round(s, late, overran=True) == []
    assert c.round(100, [ok(n) for n in NODES[:3]] + [bad("p4", "down"), bad("p5", "ok")], overran=True) == []  # down: 1 of 3
    for s in (110, 120, 130):
        c.round(s, late)  # rounds that kept up: p4 and p5 are judged by them alone
    opened = {e.node_id: e.kind for e in c.opened()}
    assert opened == {"p4": IncidentKind.PEER_BLOCKED, "p5": IncidentKind.PEER_DOWN}
