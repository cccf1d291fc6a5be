"""leader-health against the runbooks' own peer daemon, written from the runbooks' commands alone
(`curl -s http://leader:8770/status | jq '.peers["NODE_ID"]'`, `.peers | to_entries[] |
select(.value.selfplay_jobs > 0 and .value.gpu_percent < 5)`, "Voters: 5/8 (quorum OK)",
"Leader: None", `curl -X POST http://localhost:8770/force_election`), not from the simulated
fleet: `peers` is an object keyed by node id, each value that peer's jobs and GPU %, and quorum
is the voters'. Real HTTP on loopback through the real probe, then the rules and the book."""

from __future__ import annotations

import asyncio
from asyncio.subprocess import PIPE
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import (
    ActionCompleted, ActionOutcome, ActionRequested, GpuSample, HttpAdmin, IncidentKind, IncidentOpened, IncidentResolved, NodeSampled, RestartUnit,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import (
    Actions,
    AdminEndpoint,
    AdminPolicy,
    FleetPolicy,
    Kinds,
    NoLeaderPolicy,
    RestartPolicy,
    SlowPeerPolicy,
    Step,
    UnitRule,
)
from leader_health.judge import ClusterIncidents, assess
from leader_health.probe import probe_all
from remediator import catalogue
from remediator.catalogue.base import CommandResult
from zombie_detector.node_incidents import NodeIncidents

from tests.leader_health.runbook_daemon import ANSWERING, PEERS

T0 = datetime(2026, 1, 24, 14, 5, tzinfo=UTC)
POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    actions=Actions(http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url="http://127.0.0.1:8770/force_election")})),
    kinds=Kinds(no_leader=NoLeaderPolicy(grace_s=60, ladder=(Step(action="http_admin"),))),
)
async def _round(urls):
    # Generous: on a loaded machine a loopback connect can take a second; only state and detail are judged.
    return await probe_all(urls, connect_timeout_s=5.0, http_timeout_s=5.0, concurrency=32)


def _apply(logic: ClusterIncidents, answers, at_s: float) -> list:
    events = []
    for t in logic.on_round(answers, T0 + timedelta(seconds=at_s)):
        logic.book.commit(t)
        events += t.events
    return events




async def test_every_peer_of_the_runbook_daemon_is_read(cluster):
    c, urls = cluster
    await c.state(ANSWERING, leader="vultr-a100-20gb", voters_alive=6)
    answers = await _round(urls)
    good = [a for a in answers if a.state == "ok"]
    assert {a.status.node_id for a in good} == set(ANSWERING), [a.detail for a in answers if a.state == "bad_answer"]
    status = next(a.status for a in good if a.status.node_id == "hetzner-cpu1")
    assert (status.voters, status.voters_total, status.leader) == (6, 8, "vultr-a100-20gb")
    assert set(status.peers) == set(ANSWERING) - {"hetzner-cpu1"}
    assert status.loads["lambda-gh200-2"].jobs == 2 and status.loads["lambda-gh200-2"].gpu_percent == 3.5
    assert "nebius.h100-3" in status.voter_ids()
    checked = assess("selfplay", answers)
    assert checked.healthy and "Voters 6/8 (quorum OK)" in checked.summary, checked.summary
    # the runbook's per-peer table: every probed peer, its state, role, vote, and the leader's count of its work
    rows = {row.node_id or row.url: row for row in checked.peers}
    assert len(checked.peers) == len(PEERS)
    assert (rows["vultr-a100-20gb"].role, rows["vultr-a100-20gb"].voter) == ("leader", True)
    assert (rows["lambda-gh200-2"].state, rows["lambda-gh200-2"].voter, rows["lambda-gh200-2"].jobs, rows["lambda-gh200-2"].gpu_percent) == (
        "ok", False, 2, 3.5)
    down = [row for row in checked.peers if row.state != "ok"]
    assert len(down) == len(PEERS) - len(ANSWERING) and all(row.state == "down" and row.node_id is None for row in down)


@pytest.mark.parametrize(("voters_alive", "voters_total"), [(5, 7), (6, 8), (5, 8)])
async def test_quorum_of_voters_and_no_leader_past_the_grace_forces_an_election_on_a_voter(cluster, voters_alive, voters_total):
    """The log: 6 to 8 of 18 peers answer, 'Voters: 5/7 (quorum OK)', 'Leader: None' for hours."""
    c, urls = cluster
    await c.state(ANSWERING, leader=None, voters_alive=voters_alive, voters_total=voters_total)
    logic = ClusterIncidents("selfplay", POLICY)
    events = []
    for at_s in (0, 30, 59):
        events += _apply(logic, await _round(urls), at_s)
    # The 10 peers whose daemon is down are theirs to fix (peer_down); the cluster holds quorum.
    assert {e.kind for e in events if isinstance(e, IncidentOpened)} <= {IncidentKind.PEER_DOWN, IncidentKind.FLEET_ANOMALY}
    events = _apply(logic, await _round(urls), 61)
    (opened,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.NO_LEADER]
    assert f"Voters {voters_alive}/{voters_total} (quorum OK)" in opened.summary
    (asked,) = [e for e in events if isinstance(e, ActionRequested) and e.incident_id == opened.incident_id]
    assert asked.operation == HttpAdmin(endpoint="force_election")
    assert asked.node_id in {"hetzner-cpu1", "hetzner-cpu2", "nebius-h100-3", "vultr-a100-20gb"}  # an answering voter


async def test_two_voters_of_eight_is_quorum_lost_however_many_peers_answer(cluster):
    c, urls = cluster
    await c.state(ANSWERING, leader=None, voters_alive=2)
    logic = ClusterIncidents("selfplay", POLICY)
    events = _apply(logic, await _round(urls), 0)
    (opened,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.QUORUM_LOST]
    assert "Voters 2/8 (quorum LOST)" in opened.summary, opened.summary


async def test_a_leader_every_answering_peer_names_is_the_leader_though_most_listed_peers_are_down(cluster):
    c, urls = cluster
    await c.state(ANSWERING, leader="vultr-a100-20gb", voters_alive=6)
    logic = ClusterIncidents("selfplay", POLICY)
    events = []
    for at_s in range(0, 300, 30):
        events += _apply(logic, await _round(urls), at_s)
    kinds = {e.kind for e in events if isinstance(e, IncidentOpened)}
    assert IncidentKind.NO_LEADER not in kinds and IncidentKind.QUORUM_LOST not in kinds, kinds


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"peers": 7}, "peers ('peers') found a JSON number 7, not a list of node ids or an object keyed by node id"),
        ({"voters_alive": 9}, "it counts 9 voters alive of 8 in all"),
        ({"leader_id": "somebody-else"}, "its leader 'somebody-else' is not one of its 17 peers nor itself"),
        ({"peers": {"ok-peer": {"gpu_percent": 250}}}, "peers['ok-peer']: peer_gpu_percent"),
        ({"peers": {"x": {"selfplay_jobs": -3}}}, "not a count of 0 or more"),
        ({"node_id": ""}, "node_id ('not_null(node_id, self.node_id, node)') found a JSON string '', not a text"),
    ],
)
async def test_a_document_that_does_not_fit_is_one_bad_answer_that_says_why(cluster, change, reason):
    c, urls = cluster
    await c.state(["hetzner-cpu1"], leader=None, voters_alive=5)
    c.documents["hetzner-cpu1"] = {**c.documents["hetzner-cpu1"], **change}
    answers = await _round(urls)
    bad = answers[PEERS.index("hetzner-cpu1")]
    assert bad.state == "bad_answer" and reason in bad.detail, bad.detail
    assert bad.status is None  # (the closed peers' ports may be taken by other tests' servers meanwhile: not judged)


async def test_hostile_node_ids_are_read_as_text_and_named_safely(cluster):
    c, urls = cluster
    await c.state(["hetzner-cpu1"], leader=None, voters_alive=5)
    hostile = "$(reboot);rm -rf /.node"
    c.documents["hetzner-cpu1"] = {**c.documents["hetzner-cpu1"], "node_id": hostile}
    answers = await _round(urls)
    (answer,) = [a for a in answers if a.state == "ok"]
    logic = ClusterIncidents("selfplay", POLICY)
    _apply(logic, answers, 0)
    assert answer.status.node_id == hostile and logic.rules.node(answer.url) == "reboot--rm--rf---node"


async def test_a_peer_that_answers_slower_than_the_limit_round_after_round_is_a_slow_peer_restarted(cluster):
    """The runbook restarts a daemon whose event loop lags > 5 s; here the limit is 2 s, the lag 2.5 s
    (a blocked daemon, silent past the HTTP timeout, stays `peer_blocked`)."""
    c, urls = cluster
    await c.state(ANSWERING, leader="vultr-a100-20gb", voters_alive=6)
    policy = POLICY.model_copy(update={
        "actions": POLICY.actions.model_copy(update={"restart_unit": RestartPolicy(units={"p2p.service": UnitRule()})}),
        "kinds": POLICY.kinds.model_copy(update={"slow_peer": SlowPeerPolicy(
            after_checks=2, slower_than_s=2.0, daemon_unit="p2p.service", ladder=(Step(action="restart_unit"),))}),
    })
    logic = ClusterIncidents("selfplay", policy)
    c.lag_s["vast-29118471"] = 2.5
    assert not [e for e in _apply(logic, await _round(urls), 0) if getattr(e, "kind", None) is IncidentKind.SLOW_PEER]
    started = asyncio.get_running_loop().time()
    answers = await _round(urls)
    took_s = asyncio.get_running_loop().time() - started
    events = _apply(logic, answers, 30)
    (opened,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.SLOW_PEER]
    assert opened.node_id == "vast-29118471" and "slower than 2s (2 checks in a row)" in opened.summary, opened.summary
    # the lag counted once, as the runbook's `curl` times /status (asked one after the other, /health
    # and /status each lagged: 5 s reported, and the round as long)
    (slow,) = [a for a in answers if a.url.endswith(f":{c.ports['vast-29118471']}/status")]
    assert 2.4 <= slow.took_ms / 1000 < 3.5 and took_s < 4.0, (slow.took_ms, took_s)
    (asked,) = [e for e in events if isinstance(e, ActionRequested) and e.incident_id == opened.incident_id]
    assert asked.operation == RestartUnit(unit="p2p.service")
    others = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.SLOW_PEER and e.node_id != "vast-29118471"]
    assert others == []
    done = ActionCompleted(source="remediator", action_id=asked.action_id, incident_id=asked.incident_id, node_id=asked.node_id,
                           attempt=asked.attempt, outcome=ActionOutcome.SUCCEEDED, detail="restarted p2p.service",
                           request_sha256=asked.request_sha256)
    for t in logic.on_action_completed(done, T0 + timedelta(seconds=31), None):
        logic.book.commit(t)
    c.lag_s.clear()  # the restarted daemon answers at once
    (resolved,) = [e for e in _apply(logic, await _round(urls), 60) if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id and resolved.resolution == "fixed"


async def _local_shell(command: str, input: str | None = None) -> CommandResult:
    """The leader's shell, as the remediator's SSH session would reach it: here, this machine's."""
    proc = await asyncio.create_subprocess_shell(command, stdin=PIPE, stdout=PIPE, stderr=PIPE)
    out, err = await proc.communicate((input or "").encode())
    return CommandResult(proc.returncode, out.decode(), err.decode())


async def test_a_phantom_count_the_leader_keeps_is_reset_on_the_leader_naming_the_node_and_resolves_when_it_drops(cluster):
    """The runbook's Option 3: the processes are gone, the leader still counts the node's jobs
    (`.peers[id].selfplay_jobs > 0`, `gpu_percent < 5`); the fix is
    `POST http://leader:8770/admin/reset_node_jobs {"node_id": ...}`."""
    c, urls = cluster
    leader, node = "vultr-a100-20gb", "lambda-gh200-2"  # the leader counts 2 jobs on it at 3.5 % GPU
    await c.state(ANSWERING, leader=leader, voters_alive=6)
    reset = AdminEndpoint(url=f"http://127.0.0.1:{c.ports[leader]}/admin/reset_node_jobs", target="leader", body={"node_id": "{node_id}"})
    policy = Policy(fleet=FleetPolicy(hold_s=0), actions=Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": reset})))
    detector = NodeIncidents(policy)
    # the node's sampler: no process on its idle GPUs, and no job count of its own (no status probe there)
    sample = NodeSampled(source="node-sampler", node_id=node, interval_s=30,
                         gpus=(GpuSample(index=0, utilization_gpu_pct=3), GpuSample(index=1, utilization_gpu_pct=0)))

    def feed(event, at_s: float) -> list:
        events = []
        for t in detector.on_event(event, T0 + timedelta(seconds=at_s)):
            detector.book.commit(t)
            events += t.events
        return events

    events = []
    for at_s in range(0, 601, 30):
        events += feed(assess("selfplay", await _round(urls)), at_s)
        events += feed(sample.model_copy(update={"occurred_at": T0 + timedelta(seconds=at_s + 1)}), at_s + 1)
    (opened,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.PHANTOM_JOBS]
    assert opened.node_id == node and opened.evidence["jobs_by_leader"] == 2 and opened.evidence["leader"] == leader
    (asked,) = [e for e in events if isinstance(e, ActionRequested) and e.incident_id == opened.incident_id]
    assert asked.operation == HttpAdmin(endpoint="reset_job_count", at=leader)

    # the remediator's catalogue runs it as it would on the leader: real curl, the token on stdin
    result = await catalogue.execute(asked.operation, _local_shell, actions=policy.actions, admin_token="t0k3n", request=asked,
                                     verify_timeout_s=5)
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert c.resets == [(leader, {"node_id": node}, "Bearer t0k3n")]
    assert not any("t0k3n" in step for step in result.steps)
    done = ActionCompleted(source="remediator", action_id=asked.action_id, incident_id=asked.incident_id, node_id=node, attempt=1,
                           outcome=result.outcome, detail=result.detail, request_sha256=asked.request_sha256)
    for t in detector.on_action_completed(done, T0 + timedelta(seconds=620), None):
        detector.book.commit(t)
    # the next status shows the count at zero: fixed
    events = feed(assess("selfplay", await _round(urls)), 630)
    (resolved,) = [e for e in events if isinstance(e, IncidentResolved) and e.incident_id == opened.incident_id]
    assert resolved.resolution == "fixed"


async def test_with_no_leader_for_hours_a_peer_with_jobs_on_an_idle_gpu_is_still_found(cluster):
    """The runbooks' usual state: "Leader: None" while every daemon's `.peers` still counts each peer's
    jobs (`select(.value.selfplay_jobs > 0 and .value.gpu_percent < 5)` on any node). No sampler
    runs on the lambda nodes: it is idle_jobs for a person, counted by an answering peer."""
    c, urls = cluster
    await c.state(ANSWERING, leader=None, voters_alive=6)
    detector = NodeIncidents(Policy(fleet=FleetPolicy(hold_s=0)))
    events = []
    for at_s in range(0, 601, 30):
        checked = assess("selfplay", await _round(urls))
        assert checked.leader is None and checked.view_by in ANSWERING
        for t in detector.on_event(checked, T0 + timedelta(seconds=at_s)):
            detector.book.commit(t)
            events += t.events
    idle = sorted(e.node_id for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.IDLE_JOBS)
    # the one lambda node whose daemon answers (2 jobs at 3.5 %); the others' daemons are down, which
    # the daemons say (alive: false) and which is peer_down's, not a count to trust
    assert idle == ["lambda-gh200-2"]
    assert not [e for e in events if isinstance(e, ActionRequested)]
