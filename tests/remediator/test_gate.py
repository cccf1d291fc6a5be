"""The gate's rules, one by one, in their order of precedence: the request itself first
(`refusal`), then the fleet (`fleet_verdict`)."""

from __future__ import annotations

import dataclasses
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import (
    ActionRequested,
    ClusterChecked,
    DockerPrune,
    DrainNode,
    GpuReset,
    HttpAdmin,
    IncidentKind,
    KillGpuProcesses,
    MarkWorkerEnded,
    PeerJobs,
    PeerRow,
    ProcessTarget,
    RestartJob,
    RestartUnit,
    TerminateWorker,
    UndrainNode,
)
from gpumedic_incidents.policy import (
    Actions,
    AdminEndpoint,
    AdminPolicy,
    CheckFailedPolicy,
    CheckPolicy,
    JobRestart,
    Kinds,
    KillPolicy,
    NodeSelector,
    RestartJobPolicy,
    RestartPolicy,
    Step,
    UnitRule,
)
from gpumedic_incidents.state import fingerprint
from gpumedic_nodes.inventory import NodeAddress
from remediator.leaders import ClusterLeaders
from remediator.catalogue.base import KnownLeader
from remediator.gate import RESET_HINT, Gate, LedgerView, OwnFacts, Verdict, fleet_verdict, refusal
from tests.remediator.conftest import incident_waiting_for, kill_request

NOW = datetime(2026, 11, 22, 10, 15, tzinfo=UTC)
ENFORCE = Gate(mode="enforce", max_actions_per_node=3, node_window_s=3600, breaker_max_nodes=3, breaker_window_s=600)


def _request(node: str = "gpu-node-01", attempt: int = 1) -> ActionRequested:
    return ActionRequested(
        source="zombie-detector",
        action_id=uuid.uuid4(),
        incident_id=uuid.uuid4(),
        node_id=node,
        attempt=attempt,
        operation=KillGpuProcesses(gpu_index=0, targets=(ProcessTarget(pid=4242, start_ticks=1, command="python x"),)),
        reason="zombie job on GPU 0",
    )


def test_enforce_with_a_clean_ledger_allows():
    decision = fleet_verdict(_request(), gate=ENFORCE, ledger_view=LedgerView(), now=NOW)
    assert decision.verdict is Verdict.ALLOW
    assert not decision.trip_breaker


def test_default_policy_is_observe():
    decision = fleet_verdict(_request(), gate=Gate(), ledger_view=LedgerView(), now=NOW)
    assert decision.verdict is Verdict.OBSERVE
    assert "observe mode for kill_gpu_processes" in decision.reason


def test_an_operation_acts_only_when_the_switch_and_its_policy_mode_both_enforce():
    observe_kills = Actions(kill_gpu_processes=KillPolicy(mode="observe"))
    cases = [("enforce", Actions(), Verdict.ALLOW), ("enforce", observe_kills, Verdict.OBSERVE), ("observe", Actions(), Verdict.OBSERVE)]
    for mode, actions, verdict in cases:
        gate = Gate(mode=mode, actions=actions)
        assert fleet_verdict(_request(), gate=gate, ledger_view=LedgerView(), now=NOW).verdict is verdict, (mode, actions)


def test_open_breaker_blocks_everything_and_says_how_to_reset():
    since = NOW - timedelta(hours=2)
    view = LedgerView(breaker_open_since=since, breaker_reason="6 distinct nodes needed action")
    decision = fleet_verdict(_request(), gate=ENFORCE, ledger_view=view, now=NOW)
    assert decision.verdict is Verdict.BLOCK
    assert "circuit breaker open since 2026-11-22T08:15:00+00:00" in decision.reason
    assert "6 distinct nodes" in decision.reason
    assert RESET_HINT in decision.reason
    assert not decision.trip_breaker  # already open: not tripped again


def test_open_breaker_comes_before_every_other_rule():
    gate = Gate(mode="observe", protected_nodes=frozenset({NodeSelector("gpu-node-01")}))
    view = LedgerView(breaker_open_since=NOW, executing_on_node=("other",), actions_on_node=9)
    assert "circuit breaker open" in fleet_verdict(_request(), gate=gate, ledger_view=view, now=NOW).reason


def test_protected_node_is_blocked():
    gate = Gate(mode="enforce", protected_nodes=frozenset({NodeSelector("gpu-node-01")}))
    decision = fleet_verdict(_request(), gate=gate, ledger_view=LedgerView(), now=NOW)
    assert decision.verdict is Verdict.BLOCK
    assert decision.reason.startswith("node gpu-node-01 is protected")
    assert fleet_verdict(_request("gpu-node-02"), gate=gate, ledger_view=LedgerView(), now=NOW).verdict is Verdict.ALLOW


def test_nodes_are_protected_by_their_inventory_group_or_label():
    gate = Gate(mode="enforce", protected_nodes=frozenset({NodeSelector("group:prod"), NodeSelector("label:tier=critical")}))
    cases = [
        (NodeAddress(host="10.0.0.1", group="prod"), Verdict.BLOCK),
        (NodeAddress(host="10.0.0.1", group="spot", labels={"tier": "critical"}), Verdict.BLOCK),
        (NodeAddress(host="10.0.0.1", group="spot", labels={"tier": "batch"}), Verdict.ALLOW),
        (None, Verdict.ALLOW),  # not in the inventory: the action fails when it connects
    ]
    for address, verdict in cases:
        assert fleet_verdict(_request(), gate=gate, ledger_view=LedgerView(), now=NOW, address=address).verdict is verdict, address


def test_a_unit_is_restarted_only_on_the_nodes_its_allow_list_names():
    actions = Actions(restart_unit=RestartPolicy(units={"p2p-node.service": UnitRule(nodes=("group:p2p", "gpu-node-09"))}))
    gate = Gate(mode="enforce", actions=actions)
    request = _request().model_copy(update={"operation": RestartUnit(unit="p2p-node.service")})
    p2p, batch = NodeAddress(host="10.0.0.1", group="p2p"), NodeAddress(host="10.0.0.2", group="batch")
    assert fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, address=p2p).verdict is Verdict.ALLOW
    blocked = fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, address=batch)
    assert blocked.verdict is Verdict.BLOCK
    assert blocked.reason == (
        "p2p-node.service may be restarted only on group:p2p, gpu-node-09 (actions.restart_unit.units), not on node gpu-node-01"
    )


def test_an_admin_endpoint_is_called_only_on_the_nodes_its_entry_names():
    endpoint = AdminEndpoint(url="http://127.0.0.1:8080/admin/elect", nodes=("label:role=p2p",))
    gate = Gate(mode="enforce", actions=Actions(http_admin=AdminPolicy(endpoints={"force_election": endpoint})))
    request = _request().model_copy(update={"operation": HttpAdmin(endpoint="force_election")})
    p2p = NodeAddress(host="10.0.0.1", labels={"role": "p2p"})
    assert fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, address=p2p).verdict is Verdict.ALLOW
    blocked = fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, address=NodeAddress(host="10.0.0.2"))
    assert blocked.verdict is Verdict.BLOCK and blocked.reason.startswith("force_election may be called only on label:role=p2p")


@pytest.mark.parametrize("text", ["group:", "label:role", "a b", "-oProxyCommand=x", "group:$(id)", "label:k=v;rm"])
def test_a_malformed_selector_is_refused(text):
    with pytest.raises(ValueError, match="is not a node selector"):
        NodeSelector(text)


def test_another_action_executing_on_the_node_blocks():
    view = LedgerView(executing_on_node=("a-1",))
    decision = fleet_verdict(_request(), gate=ENFORCE, ledger_view=view, now=NOW)
    assert decision.verdict is Verdict.BLOCK
    assert decision.reason == "action a-1 is already executing on node gpu-node-01; one at a time"


def test_the_per_node_limit_blocks_at_the_maximum_not_before():
    assert fleet_verdict(_request(), gate=ENFORCE, ledger_view=LedgerView(actions_on_node=2), now=NOW).verdict is Verdict.ALLOW
    decision = fleet_verdict(_request(), gate=ENFORCE, ledger_view=LedgerView(actions_on_node=3), now=NOW)
    assert decision.verdict is Verdict.BLOCK
    assert decision.reason == (
        "3 actions already ran on node gpu-node-01 within 3600s (max 3); a node that keeps needing fixes needs a person"
    )


def test_drains_and_undrains_are_outside_the_per_node_limit_and_the_breakers_count_but_not_its_hold():
    busy_node = LedgerView(actions_on_node=3)
    three_others = LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"}))
    tripped = LedgerView(breaker_open_since=NOW, breaker_reason="4 distinct nodes")
    for operation in (DrainNode(), UndrainNode()):
        request = _request("n4").model_copy(update={"operation": operation})
        assert fleet_verdict(request, gate=ENFORCE, ledger_view=busy_node, now=NOW).verdict is Verdict.ALLOW
        assert fleet_verdict(request, gate=ENFORCE, ledger_view=three_others, now=NOW).verdict is Verdict.ALLOW
        assert fleet_verdict(request, gate=ENFORCE, ledger_view=tripped, now=NOW).verdict is Verdict.BLOCK
    kill = _request("n4")
    assert fleet_verdict(kill, gate=ENFORCE, ledger_view=three_others, now=NOW).trip_breaker


def test_breaker_counts_this_node_and_trips_above_the_maximum():
    # Three other nodes plus this one is four, above the maximum of three.
    view = LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"}))
    decision = fleet_verdict(_request("n4"), gate=ENFORCE, ledger_view=view, now=NOW)
    assert decision.verdict is Verdict.BLOCK
    assert decision.trip_breaker
    assert decision.trip_reason == "4 distinct nodes needed action within 600s (max 3)"
    assert "circuit breaker tripped" in decision.reason and RESET_HINT in decision.reason


def test_breaker_does_not_trip_at_the_maximum_or_for_a_node_already_counted():
    at_max = LedgerView(nodes_in_window=frozenset({"n1", "n2"}))
    assert fleet_verdict(_request("n3"), gate=ENFORCE, ledger_view=at_max, now=NOW).verdict is Verdict.ALLOW
    full = LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"}))
    assert fleet_verdict(_request("n3"), gate=ENFORCE, ledger_view=full, now=NOW).verdict is Verdict.ALLOW


def test_breaker_trips_in_observe_mode_too():
    # Observe mode is a faithful preview of enforce: it shows when the breaker would open.
    view = LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"}))
    decision = fleet_verdict(_request("n4"), gate=Gate(mode="observe", breaker_max_nodes=3), ledger_view=view, now=NOW)
    assert decision.verdict is Verdict.BLOCK and decision.trip_breaker


def test_tripped_breaker_stays_tripped_for_any_later_request():
    tripped = fleet_verdict(
        _request("n4"), gate=ENFORCE, ledger_view=LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"})), now=NOW
    )
    assert tripped.trip_breaker
    # The next request sees the open trip, even for a node that would otherwise be fine.
    later = LedgerView(breaker_open_since=NOW, breaker_reason=tripped.trip_reason)
    for hours in (0, 1, 48):
        decision = fleet_verdict(_request("n1"), gate=ENFORCE, ledger_view=later, now=NOW + timedelta(hours=hours))
        assert decision.verdict is Verdict.BLOCK
        assert "circuit breaker open" in decision.reason


@pytest.mark.parametrize(
    ("view", "gate", "expected"),
    [
        (LedgerView(executing_on_node=("a",), actions_on_node=5), ENFORCE, "already executing"),
        (LedgerView(actions_on_node=5, nodes_in_window=frozenset({"n1", "n2", "n3"})), ENFORCE, "actions already ran"),
        (LedgerView(nodes_in_window=frozenset({"n1", "n2", "n3"})), Gate(mode="observe", breaker_max_nodes=3), "tripped"),
    ],
)
def test_rules_apply_in_order(view, gate, expected):
    assert expected in fleet_verdict(_request("n9"), gate=gate, ledger_view=view, now=NOW).reason


# --- the request itself: refused before the fleet rules, whatever the ledger says -------------

_GOOD = ProcessTarget(pid=4242, start_ticks=1, command="python train.py")


def _refusal(request, incident="waiting", *, stored_at=None, now=None, gate=ENFORCE, facts=OwnFacts()) -> str:
    state = incident_waiting_for(request) if incident == "waiting" else incident
    return refusal(request, incident=state, gate=gate, now=now or request.occurred_at, stored_at=stored_at, facts=facts)


def test_a_request_its_open_incident_waits_for_passes():
    assert _refusal(kill_request(_GOOD)) == ""


def test_a_stale_request_is_refused_by_the_older_of_its_two_clocks():
    request = kill_request(_GOOD)
    later = request.occurred_at + timedelta(seconds=121)
    assert _refusal(request, now=later).startswith("refused: the request is 121s old (limit 120s)")
    # A sender can date its request in the future; the server's storage time still counts.
    forward = request.model_copy(update={"occurred_at": request.occurred_at + timedelta(hours=1)})
    assert "121s old" in _refusal(forward, stored_at=request.occurred_at, now=later)
    assert _refusal(request, stored_at=request.occurred_at, now=request.occurred_at + timedelta(seconds=119)) == ""


def test_an_unknown_or_closed_incident_is_refused():
    request = kill_request(_GOOD)
    assert _refusal(request, None) == (
        f"refused: incident {request.incident_id} is not open (no open incident has fingerprint gpu-node-01/zombie_job/0)"
    )
    other = incident_waiting_for(request, incident_id=uuid.uuid4())
    assert f"the open incident on gpu-node-01/zombie_job/0 is {other.incident_id}" in _refusal(request, other)
    for phase in ("verifying", "escalated"):
        closed = incident_waiting_for(request, phase=phase, pending_action=None)
        assert _refusal(request, closed) == f"refused: incident {request.incident_id} is {phase}, not waiting for an action"


def test_a_request_without_a_fingerprint_is_refused():
    request = kill_request(_GOOD).model_copy(update={"fingerprint": None})
    assert "names no incident fingerprint" in _refusal(request, None)


def test_a_request_for_another_node_gpu_detector_attempt_or_operation_is_refused():
    request = kill_request(_GOOD)
    assert "is on node gpu-node-02 GPU 0" in _refusal(request, incident_waiting_for(request, node_id="gpu-node-02"))
    assert "is on node gpu-node-01 GPU 3" in _refusal(request, incident_waiting_for(request, gpu_index=3))
    # The state says another detector: zombie jobs are zombie-detector's, whatever a state claims.
    assert "names leader-health as its detector, but zombie_job incidents are opened by zombie-detector" in _refusal(
        request, incident_waiting_for(request, detector="leader-health")
    )
    # The request names another sender than the kind's owner.
    other_sender = request.model_copy(update={"source": "leader-health"})
    assert "was opened by zombie-detector, not by leader-health" in _refusal(other_sender, incident_waiting_for(request))
    retry = kill_request(_GOOD, attempt=2, incident_id=request.incident_id)
    assert "waits for attempt 2" in _refusal(request, incident_waiting_for(retry))
    # Same ids, other pids: a forged or altered operation.
    altered = request.model_copy(update={"operation": request.operation.model_copy(update={"targets": (_GOOD.model_copy(update={"pid": 1111}),)})})
    assert "the operation differs from the one zombie-detector decided" in _refusal(altered, incident_waiting_for(request))


def test_a_target_without_start_time_is_refused_even_for_a_waiting_incident():
    request = kill_request(ProcessTarget(pid=4242, command="python train.py"))
    assert _refusal(request) == (
        "refused: pid 4242 comes without its start time: a process is identified by pid, start time and "
        "command line, and a pid alone may name an innocent process"
    )


def _node_request(operation, kind: IncidentKind, key: str | None = None) -> tuple[ActionRequested, object]:
    """A node-level request and the node-level incident (no GPU) that waits for it."""
    request = kill_request(_GOOD).model_copy(
        update={"operation": operation, "fingerprint": fingerprint("gpu-node-01", kind, None, key)}
    )
    return request, incident_waiting_for(request, kind=kind, gpu_index=None, key=key)


def test_a_node_level_operation_passes_for_its_node_level_incident():
    request, incident = _node_request(RestartUnit(unit="gpumedic-node-sampler.service"), IncidentKind.NODE_SILENT)
    assert _refusal(request, incident) == ""
    prune, disk = _node_request(DockerPrune(), IncidentKind.DISK_PRESSURE, "var-lib-docker")
    assert _refusal(prune, disk) == ""


def test_a_gpu_operation_for_another_gpu_or_a_unit_off_the_allow_list_is_refused():
    request, incident = _node_request(GpuReset(gpu_index=2), IncidentKind.GPU_XID)
    assert _refusal(request, incident.model_copy(update={"gpu_index": 1})) == (
        f"refused: the request is for node gpu-node-01 GPU 2, but incident {request.incident_id} is on node gpu-node-01 GPU 1"
    )
    request, incident = _node_request(RestartUnit(unit="sshd.service"), IncidentKind.NODE_SILENT)
    assert _refusal(request, incident) == "refused: kinds.node_silent restarts gpumedic-node-sampler.service, not sshd.service"
    request, incident = _node_request(DockerPrune(volumes=True), IncidentKind.DISK_PRESSURE, "var-lib-docker")
    assert "prune volumes, which the policy does not allow" in _refusal(request, incident)


def test_an_operators_check_restarts_only_the_unit_its_own_ladder_names():
    nfs = CheckPolicy(unit="remount-data.service", ladder=(Step(action="restart_unit"),))
    gate = dataclasses.replace(
        ENFORCE, kinds=Kinds(check_failed=CheckFailedPolicy(checks={"nfs-mounted": nfs})),
        actions=Actions(restart_unit=RestartPolicy(units={"remount-data.service": UnitRule(), "p2p-node.service": UnitRule()})),
    )
    request, incident = _node_request(RestartUnit(unit="remount-data.service"), IncidentKind.CHECK_FAILED, "nfs-mounted")
    assert _refusal(request, incident, gate=gate) == ""
    other, incident = _node_request(RestartUnit(unit="p2p-node.service"), IncidentKind.CHECK_FAILED, "nfs-mounted")
    assert _refusal(other, incident, gate=gate) == "refused: kinds.check_failed restarts remount-data.service, not p2p-node.service"
    # another check has the kind's own ladder: a person's, so no step is due
    request, incident = _node_request(RestartUnit(unit="remount-data.service"), IncidentKind.CHECK_FAILED, "gpu-fabric")
    assert _refusal(request, incident, gate=gate) == "refused: the policy's kinds.check_failed.ladder has no step 1, so no action is due"


def test_the_breaker_also_trips_on_a_share_of_the_fleet():
    gate = Gate(mode="enforce", breaker_max_nodes=5, breaker_max_share=0.25)
    two_acting = LedgerView(nodes_in_window=frozenset({"n1", "n2"}), fleet_size=8)
    decision = fleet_verdict(_request("n3"), gate=gate, ledger_view=two_acting, now=NOW)
    assert decision.trip_breaker and decision.trip_reason == (
        "3 distinct nodes needed action within 600s (max 25% of the 8 nodes in the inventory: 2)"
    )
    # A big fleet: the count is the smaller limit; an unknown fleet size: only the count.
    assert fleet_verdict(_request("n3"), gate=gate, ledger_view=LedgerView(nodes_in_window=two_acting.nodes_in_window, fleet_size=200), now=NOW).verdict is Verdict.ALLOW
    assert fleet_verdict(_request("n3"), gate=gate, ledger_view=LedgerView(nodes_in_window=two_acting.nodes_in_window), now=NOW).verdict is Verdict.ALLOW
    # A fleet of two: one node may still act.
    assert fleet_verdict(_request("n1"), gate=gate, ledger_view=LedgerView(fleet_size=2), now=NOW).verdict is Verdict.ALLOW


def test_nothing_is_run_over_ssh_on_a_node_the_inventory_does_not_name():
    gate = ENFORCE
    decision = fleet_verdict(_request("not-ours"), gate=gate, ledger_view=LedgerView(fleet_size=4), now=NOW, in_inventory=False)
    assert decision.verdict is Verdict.BLOCK and "not-ours is not in the remediator's inventory" in decision.reason
    # what does not log in to the node is not held back: ending a rented worker, a drain through the scheduler
    for operation in (TerminateWorker(worker_ids=["not-ours"]), DrainNode()):
        request = _request("not-ours").model_copy(update={"operation": operation})
        assert fleet_verdict(request, gate=gate, ledger_view=LedgerView(fleet_size=4), now=NOW, in_inventory=False).verdict is Verdict.ALLOW


# --- what the policy allows: the request names a step, the policy gives its safe parameters ---


def _kill(**changes) -> ActionRequested:
    request = kill_request(_GOOD)
    return request.model_copy(update={"operation": request.operation.model_copy(update=changes)})


@pytest.mark.parametrize(
    ("changes", "why"),
    [
        # the GPU state the kill is safe in: below kinds.zombie_job.idle_below_pct
        ({"max_gpu_utilization_pct": 100}, "up to 100% busy, not below the policy's kinds.zombie_job.idle_below_pct (5%)"),
        ({"max_gpu_utilization_pct": 5}, "up to 5% busy, not below the policy's kinds.zombie_job.idle_below_pct (5%)"),
        ({"max_gpu_utilization_pct": None}, "up to None% busy"),
        # signal and grace: the policy's, not the sender's
        ({"signal": "KILL", "grace_s": 0.0}, "asks SIGKILL with 0s grace; the policy's actions.kill_gpu_processes is SIGTERM with 10s grace"),
        ({"grace_s": 0.0}, "asks SIGTERM with 0s grace"),
    ],
)
def test_a_kill_whose_parameters_loosen_the_policy_is_refused_with_the_rule(changes, why):
    request = _kill(**changes)
    # The state agrees with the request (its own detector could have written it): the policy still decides.
    assert why in _refusal(request, incident_waiting_for(request))


def test_a_kill_no_looser_than_the_policy_passes():
    stricter = _kill(max_gpu_utilization_pct=0)
    assert _refusal(stricter, incident_waiting_for(stricter)) == ""


def test_the_operation_must_be_the_ladder_step_the_incident_is_at():
    request = kill_request(_GOOD).model_copy(update={"operation": GpuReset(gpu_index=0)})
    assert _refusal(request, incident_waiting_for(request)) == "refused: kinds.zombie_job.ladder step 1 is kill_gpu_processes, not gpu_reset"
    past_the_ladder = kill_request(_GOOD)
    assert "has no step 2, so no action is due" in _refusal(past_the_ladder, incident_waiting_for(past_the_ladder, step=1))
    # An undrain is due only once the incident drained its node and its fault is gone.
    undrain = kill_request(_GOOD).model_copy(update={"operation": UndrainNode(), "fingerprint": fingerprint("gpu-node-01", IncidentKind.GPU_XID, 0)})
    assert _refusal(undrain, incident_waiting_for(undrain)) == ""
    not_drained = incident_waiting_for(undrain, drained=False, resolution=None, step=0)
    assert _refusal(undrain, not_drained) == "refused: kinds.gpu_xid.ladder step 1 is drain_node, not undrain_node"


def test_an_open_fleet_incident_stops_a_fault_step_of_its_kind_but_not_an_undrain_after_the_fix():
    xid = kill_request(_GOOD).model_copy(update={"operation": DrainNode(), "fingerprint": fingerprint("gpu-node-01", IncidentKind.GPU_XID, 0)})
    waiting = incident_waiting_for(xid)
    fleet = waiting.model_copy(update={"incident_id": uuid.uuid4(), "node_id": "fleet", "kind": IncidentKind.FLEET_ANOMALY,
                                       "gpu_index": None, "key": "gpu_xid", "summary": "gpu_xid on 9 of 20 nodes"})

    def refused(request, incident):
        return refusal(request, incident=incident, gate=ENFORCE, now=request.occurred_at, stored_at=None, fleet=fleet)
    assert refused(xid, waiting) == f"refused: fleet incident {fleet.incident_id} is open for gpu_xid (gpu_xid on 9 of 20 nodes); no node's fault step runs while it is"
    assert refusal(xid, incident=waiting, gate=ENFORCE, now=xid.occurred_at, stored_at=None) == ""
    # A node the fix drained and that validated healthy comes back: that fixes nothing, it returns capacity.
    undrain = xid.model_copy(update={"operation": UndrainNode()})
    assert refused(undrain, incident_waiting_for(undrain)) == ""


def test_the_endpoint_and_the_workers_come_from_the_incident_and_the_policy():
    election = ActionRequested(
        source="leader-health", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id="peer-1", attempt=1,
        operation=HttpAdmin(endpoint="reset_job_count"), reason="no leader", fingerprint=fingerprint("peer-1", IncidentKind.NO_LEADER, None),
    )
    assert _refusal(election, incident_waiting_for(election)) == "refused: kinds.no_leader calls the force_election endpoint, not reset_job_count"
    stuck = ActionRequested(
        source="autoscaler", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id="pod-1", attempt=1,
        operation=TerminateWorker(worker_ids=("pod-1", "pod-2")), reason="stuck", fingerprint=fingerprint("pod-1", IncidentKind.STUCK_SPAWNING, None),
    )
    assert _refusal(stuck, incident_waiting_for(stuck)) == "refused: a stuck_spawning incident ends worker pod-1 only, not pod-1, pod-2"
    vanished = stuck.model_copy(update={"operation": MarkWorkerEnded(worker_id="pod-2"),
                                        "fingerprint": fingerprint("pod-1", IncidentKind.VANISHED_WORKER, None)})
    assert _refusal(vanished, incident_waiting_for(vanished)) == "refused: a vanished_worker incident marks worker pod-1 ended only, not pod-2"


def test_a_job_restart_is_due_only_after_the_fix_and_only_the_job_the_kind_names():
    restart = kill_request(_GOOD).model_copy(update={"operation": RestartJob(job="selfplay")})
    kinds = ENFORCE.kinds.model_copy(update={"zombie_job": ENFORCE.kinds.zombie_job.model_copy(update={"restart_job": "selfplay"})})
    jobs = RestartJobPolicy(jobs={"selfplay": JobRestart(unit="selfplay.service"), "other": JobRestart(command="/opt/other/restart")})
    gate = dataclasses.replace(ENFORCE, kinds=kinds, actions=Actions(restart_job=jobs))
    fixed = incident_waiting_for(restart, resolution="fixed")
    assert _refusal(restart, fixed, gate=gate, facts=OwnFacts(killed=frozenset({restart.node_id}))) == ""
    # the state's word that the fix is in is not enough: the remediator's own ledger must hold the kill
    assert _refusal(restart, fixed, gate=gate) == (
        "refused: the job restarts after a verified kill, and the remediator's ledger holds no succeeded kill_gpu_processes "
        f"for incident {restart.incident_id}"
    )
    # before the kill is verified the ladder's step is due, not a restart
    assert _refusal(restart, incident_waiting_for(restart), gate=gate) == "refused: kinds.zombie_job.ladder step 1 is kill_gpu_processes, not restart_job"
    other = restart.model_copy(update={"operation": RestartJob(job="other")})
    assert _refusal(other, incident_waiting_for(other, resolution="fixed"), gate=gate) == "refused: kinds.zombie_job restarts the job selfplay, not other"
    # the default policy restarts nothing
    assert _refusal(restart, fixed) == "refused: kinds.zombie_job restarts no job, not selfplay"


def _phantom_reset(at: str) -> tuple[ActionRequested, Gate]:
    reset = AdminEndpoint(url="http://127.0.0.1:8770/admin/reset_node_jobs", target="leader", body={"node_id": "{node_id}"})
    gate = dataclasses.replace(ENFORCE, actions=Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": reset})))
    request = ActionRequested(
        source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id="gpu-node-07", attempt=1,
        operation=HttpAdmin(endpoint="reset_job_count", at=at), reason="phantom jobs",
        fingerprint=fingerprint("gpu-node-07", IncidentKind.PHANTOM_JOBS, None),
    )
    return request, gate


@pytest.mark.parametrize(
    ("known", "expected"),
    [
        (KnownLeader("selfplay", "peer-1", NOW), ""),
        (KnownLeader("selfplay", "peer-2", NOW), "the request calls reset_job_count on peer-1, but leader-health's check of cluster "
         "selfplay at 2026-11-22T10:15:00+00:00 names peer-2 as its leader"),
        (KnownLeader("selfplay", None, NOW), "leader-health's check of cluster selfplay at 2026-11-22T10:15:00+00:00 found no leader"),
        (KnownLeader("selfplay", "peer-1", NOW - timedelta(seconds=121)), "leader-health last checked cluster selfplay 121s ago (limit 120s)"),
        (None, "no check of leader-health names node gpu-node-07's cluster, so its leader is not known"),
    ],
)
def test_an_endpoint_called_on_the_leader_goes_only_to_the_leader_leader_health_reports(known, expected):
    request, gate = _phantom_reset(at="peer-1")
    why = _refusal(request, gate=gate, now=NOW, facts=OwnFacts(leader=known))
    assert (why == "") if not expected else (expected in why and "is called on the leader leader-health reports" in why), why


def test_the_known_leader_is_the_newest_check_that_names_the_node():
    leaders = ClusterLeaders()
    check = ClusterChecked(source="leader-health", cluster="selfplay", peers_total=3, peers_answering=3, leader="peer-1", healthy=True,
                           summary="ok", peers=(PeerRow(url="http://10.0.0.2:8770/status", state="ok", node_id="peer-2"),),
                           leader_view=(PeerJobs(node_id="gpu-node-07", jobs=2),), occurred_at=NOW)
    leaders.observe(check)
    leaders.observe(check.model_copy(update={"leader": "peer-2", "occurred_at": NOW - timedelta(seconds=30)}))  # older: ignored
    assert leaders.of("gpu-node-07") == KnownLeader("selfplay", "peer-1", NOW)
    assert leaders.of("peer-2") == leaders.of("peer-1") == KnownLeader("selfplay", "peer-1", NOW)
    assert leaders.of("elsewhere") is None
    leaders.observe(check.model_copy(update={"cluster": "other", "leader": "peer-9", "occurred_at": NOW + timedelta(seconds=5)}))
    assert leaders.of("gpu-node-07").leader == "peer-9"  # a node in two clusters: the newest check


def test_a_jobs_stop_is_held_to_every_node_it_acts_on_and_counts_once_for_the_breaker():
    from gpumedic_events import RankTarget, StopJob

    ranks = tuple(RankTarget(node_id=f"gpu-node-0{i}", gpu_index=0, pid=4000 + i, start_ticks=1, command="python train.py") for i in range(1, 9))
    request = _request().model_copy(update={"operation": StopJob(job="slurm:77.0", ranks=ranks, max_gpu_utilization_pct=4)})
    entries = {f"gpu-node-0{i}": NodeAddress(host=f"10.0.0.{i}") for i in range(2, 9)}
    gate = Gate(mode="enforce", protected_nodes=frozenset({NodeSelector("label:tier=critical")}), breaker_max_nodes=3)
    assert fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, reached=entries).verdict is Verdict.ALLOW
    critical = {**entries, "gpu-node-05": NodeAddress(host="10.0.0.5", labels={"tier": "critical"})}
    decision = fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, reached=critical)
    assert decision.verdict is Verdict.BLOCK and decision.reason.startswith("node gpu-node-05, which stop_job would act on too, is protected")
    stranger = {**entries, "gpu-node-06": None}
    decision = fleet_verdict(request, gate=gate, ledger_view=LedgerView(), now=NOW, reached=stranger)
    assert decision.verdict is Verdict.BLOCK and "gpu-node-06, which stop_job would act on too, is not in the remediator's inventory" in decision.reason


def test_a_jobs_stop_fits_only_its_jobs_incident_below_the_idle_line_with_the_policys_grace():
    from gpumedic_events import RankTarget, StopJob
    from gpumedic_events.node import job_key
    from gpumedic_incidents.policy import JobHungPolicy, Kinds, Step

    job = "torchelastic:llama-ft-0412"
    kinds = Kinds(job_hung=JobHungPolicy(ladder=(Step(action="drain_node"), Step(action="stop_job"))))
    gate = Gate(mode="enforce", kinds=kinds)
    rank = RankTarget(node_id="gpu-node-01", gpu_index=0, pid=4242, start_ticks=1, command="python train.py")

    def verdict(**operation) -> str:
        stop = StopJob(**{"job": job, "ranks": (rank,), "max_gpu_utilization_pct": 4, **operation})
        request = _request().model_copy(update={"operation": stop, "fingerprint": f"gpu-node-01/job_hung/node/{job_key(job)}"})
        incident = incident_waiting_for(request, step=1)
        return refusal(request, incident=incident, gate=gate, now=request.occurred_at, stored_at=request.occurred_at)

    assert verdict() == ""
    assert "is not about the job slurm:1" in verdict(job="slurm:1")
    assert "not below kinds.job_hung.idle_below_pct (5%)" in verdict(max_gpu_utilization_pct=5)
    assert "actions.stop_job.grace_s is 10s" in verdict(grace_s=1.0)


def test_a_hung_jobs_restart_runs_only_where_the_ledger_verified_its_stop_and_never_on_the_node_that_stopped():
    from gpumedic_events.node import job_key
    from gpumedic_incidents.policy import JobHungPolicy, Kinds, Step

    job = "torchelastic:llama-ft-0412"
    kinds = Kinds(job_hung=JobHungPolicy(restart_job="train", ladder=(Step(action="drain_node"), Step(action="stop_job"))))
    gate = Gate(mode="enforce", kinds=kinds, actions=Actions(restart_job=RestartJobPolicy(jobs={"train": JobRestart(unit="train.service")})))

    def verdict(nodes: tuple[str, ...], stopped_on: frozenset[str]) -> str:
        request = _request().model_copy(update={"operation": RestartJob(job="train", nodes=nodes),
                                                "fingerprint": f"{_request().node_id}/job_hung/node/{job_key(job)}"})
        incident = incident_waiting_for(request, step=1, drained=True, resolution="fixed", restarting=True)
        return refusal(request, incident=incident, gate=gate, now=request.occurred_at, stored_at=request.occurred_at,
                       facts=OwnFacts(killed=stopped_on))

    culprit = _request().node_id
    stopped = frozenset({culprit, "gpu-node-02", "gpu-node-03"})
    assert verdict(("gpu-node-02", "gpu-node-03"), stopped) == ""
    assert verdict((culprit, "gpu-node-02"), stopped) == (
        f"refused: the job train starts again on its other nodes, never on {culprit}, the node that stopped")
    assert "never on" in verdict((), stopped)
    assert verdict(("gpu-node-02", "gpu-node-09"), stopped).endswith("it holds none on gpu-node-09")
    assert "holds no succeeded stop_job" in verdict(("gpu-node-02",), frozenset())


def test_a_pattern_kill_fits_only_the_pattern_the_kinds_policy_names_below_its_idle_line_with_the_policys_grace():
    """Runbook 000's pkill -f, as a zombie's next step: the gate holds it to the pattern
    kinds.zombie_job.kill_pattern names, on the node's allow-list entry, like every kill."""
    from gpumedic_events import KillPattern
    from gpumedic_incidents.policy import Kinds, PatternKillPolicy, ProcessPattern, Step, ZombiePolicy

    actions = Actions(kill_pattern=PatternKillPolicy(patterns={
        "selfplay": ProcessPattern(regex="python.*selfplay"), "eval": ProcessPattern(regex="python.*eval", nodes=("gpu-node-09",)),
    }))
    kinds = Kinds(zombie_job=ZombiePolicy(kill_pattern="selfplay", ladder=(Step(action="kill_gpu_processes"), Step(action="kill_pattern"))))
    gate = Gate(mode="enforce", kinds=kinds, actions=actions)

    def verdict(**operation) -> str:
        kill = KillPattern(**{"pattern": "selfplay", "grace_s": 10.0, "max_gpu_utilization_pct": 4, **operation})
        request = _request(attempt=3).model_copy(update={"operation": kill, "fingerprint": "gpu-node-01/zombie_job/0"})
        incident = incident_waiting_for(request, step=1)
        return refusal(request, incident=incident, gate=gate, now=request.occurred_at, stored_at=request.occurred_at)

    assert verdict() == ""
    assert "kinds.zombie_job ends the pattern selfplay, not eval" in verdict(pattern="eval")
    assert "not below the policy's kinds.zombie_job.idle_below_pct (5%)" in verdict(max_gpu_utilization_pct=5)
    assert "actions.kill_pattern is 10s" in verdict(grace_s=1.0)
