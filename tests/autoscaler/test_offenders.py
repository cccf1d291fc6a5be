"""Repeat offenders: a host's incidents counted across rentals (by the provider's machine id) and
on owned nodes, through the pool's incident book, with the actions the remediator is asked for."""

from __future__ import annotations

import uuid
from datetime import timedelta

import pytest
from pydantic import ValidationError

from autoscaler.pool import FleetView, HostIncidents
from autoscaler.scaling import NodeLoad
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    DrainNode,
    GpuSample,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    NodeSampled,
    SpawnWorker,
    TerminateWorker,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import RepeatRule
from gpumedic_providers.base import Worker
from tests.autoscaler.test_pool import H100, POLICY, T0, Pool

DAY = timedelta(days=1)


def _on(machine: str, worker_id: str, status: str = "running", age_s: float = 3600) -> Worker:
    return Worker(worker_id=worker_id, status=status, gpu_type=H100, gpus=1, price_per_h=2.49, created_at=T0 - timedelta(seconds=age_s),
                  host_id=machine)


def _opened(node: str, kind: IncidentKind, at, *, gpu: int | None = 3, host: str | None = None, severity="warning") -> IncidentOpened:
    return IncidentOpened(source="zombie-detector", occurred_at=at, incident_id=uuid.uuid4(), node_id=node, kind=kind, gpu_index=gpu,
                          fingerprint=f"{node}/{kind.value}", summary="seen", severity=severity,
                          evidence={"host_id": host} if host else {})


def _sampled(node: str, at) -> NodeLoad:
    return NodeLoad.of(NodeSampled(source="node-sampler", node_id=node, occurred_at=at, interval_s=5,
                                   gpus=(GpuSample(index=0, uuid=f"GPU-{node}", name=H100, utilization_gpu_pct=90),)))


def _done(pool, request, at, outcome=ActionOutcome.SUCCEEDED):
    pool.complete(request, at, outcome)


def test_a_machine_that_fails_again_under_a_new_pod_is_ended_replaced_and_returned_when_rented_once_more():
    pool = Pool()
    # First rental: w1 on machine m-bad has XID on GPU 3; the pool learns where w1 ran, then w1 goes.
    pool.round(T0 - 2 * DAY, queued=0, in_progress=1, workers=[_on("m-bad", "w1")])
    pool.logic.offenders.on_opened(_opened("w1", IncidentKind.GPU_XID, T0 - 2 * DAY))
    pool.round(T0 - DAY, queued=0, in_progress=1, workers=[_on("m-ok", "w2")])
    assert not pool.of(IncidentKind.REPEAT_OFFENDER)
    # Second rental on the same machine, same GPU again: two hardware faults within the week.
    pool.round(T0, queued=0, in_progress=1, workers=[_on("m-ok", "w2"), _on("m-bad", "w5")])
    pool.logic.offenders.on_opened(_opened("w5", IncidentKind.GPU_XID, T0))
    evaluated = pool.round(T0 + timedelta(seconds=5), queued=3, in_progress=2, workers=[_on("m-ok", "w2"), _on("m-bad", "w5")])
    (opened,) = pool.of(IncidentKind.REPEAT_OFFENDER)
    assert opened.node_id == "w5" and opened.evidence["host_id"] == "m-bad" and opened.evidence["count"] == 2
    assert opened.evidence["nodes"] == "w1, w5" and opened.evidence["gpu_indexes"] == "3" and "also under w1" in opened.summary
    assert evaluated.gpus_total == 1, "the worker on the bad machine is no capacity from the round it is found"
    pool.tick(T0 + timedelta(seconds=30))
    drain, spawn = sorted((r for r in pool.requests()), key=lambda r: r.operation.operation)
    assert drain.operation == DrainNode() and drain.node_id == "w5"
    assert isinstance(spawn.operation, SpawnWorker), "a replacement is rented"
    _done(pool, drain, T0 + timedelta(seconds=31))
    (terminate,) = [r for r in pool.requests() if isinstance(r.operation, TerminateWorker)]
    assert terminate.operation.worker_ids == ("w5",)
    _done(pool, terminate, T0 + timedelta(seconds=40))
    # The machine comes back in a third rental, still spawning: found the round it is listed.
    evaluated = pool.round(T0 + timedelta(seconds=60), queued=0, in_progress=2, workers=[_on("m-ok", "w2"), _on("m-bad", "w9", "spawning", 10)])
    (returned,) = [e for e in pool.of(IncidentKind.REPEAT_OFFENDER) if isinstance(e, IncidentOpened) and e.node_id == "w9"]
    assert returned.evidence["host_id"] == "m-bad" and returned.evidence["status"] == "spawning"
    assert evaluated.workers_in_service == 1, "the rental on the bad machine is no capacity, spawning as it is"


def test_a_fault_that_lands_once_per_machine_is_no_repeat_offence():
    pool = Pool()
    pool.round(T0, queued=0, in_progress=1, workers=[_on("m1", "w1"), _on("m2", "w2")])
    pool.logic.offenders.on_opened(_opened("w1", IncidentKind.GPU_XID, T0))
    pool.logic.offenders.on_opened(_opened("w2", IncidentKind.GPU_XID, T0))
    pool.logic.offenders.on_opened(_opened("w1", IncidentKind.ZOMBIE_JOB, T0))  # another kind, once
    pool.round(T0 + timedelta(seconds=5), queued=0, in_progress=1, workers=[_on("m1", "w1"), _on("m2", "w2")])
    assert not pool.of(IncidentKind.REPEAT_OFFENDER)


def test_the_machine_is_taken_from_the_evidence_when_the_worker_was_never_listed():
    """After a restart the pool's own worker incidents (replayed) name their machine themselves."""
    pool = Pool()
    pool.logic.offenders.on_opened(_opened("gone1", IncidentKind.STUCK_SPAWNING, T0 - timedelta(minutes=30), gpu=None, host="m7"))
    pool.logic.offenders.on_opened(_opened("gone2", IncidentKind.STUCK_SPAWNING, T0 - timedelta(minutes=20), gpu=None, host="m7"))
    pool.logic.offenders.on_opened(_opened("gone3", IncidentKind.STUCK_SPAWNING, T0 - timedelta(minutes=10), gpu=None, host="m7"))
    pool.round(T0, queued=0, in_progress=1, workers=[_on("m7", "w4", "spawning", 5)])
    (opened,) = pool.of(IncidentKind.REPEAT_OFFENDER)
    assert opened.node_id == "w4" and opened.evidence["counted_kind"] == "stuck_spawning" and opened.evidence["count"] == 3


def test_the_incidents_age_out_of_the_window_and_the_incident_clears():
    pool = Pool()
    for minutes in (50, 40, 30):
        pool.logic.offenders.on_opened(_opened("w1", IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes)))
    pool.round(T0, queued=0, in_progress=1, workers=[_on("m1", "w1")])
    assert len(pool.of(IncidentKind.REPEAT_OFFENDER)) == 1
    pool.round(T0 + timedelta(minutes=11), queued=0, in_progress=1, workers=[_on("m1", "w1")])  # the first is 61 min old
    assert [e.resolution for e in pool.events if isinstance(e, IncidentResolved) and e.kind is IncidentKind.REPEAT_OFFENDER] == ["cleared"]


@pytest.mark.parametrize("severity, kind", [("info", IncidentKind.CONTAINER_DIED), ("warning", IncidentKind.FLEET_ANOMALY),
                                            ("warning", IncidentKind.ORPHANED_TASKS)])
def test_whole_fleet_kinds_and_informational_incidents_are_never_counted(severity, kind):
    pool = Pool()
    for minutes in (3, 2, 1):
        pool.logic.offenders.on_opened(_opened("w1", kind, T0 - timedelta(minutes=minutes), severity=severity))
    pool.round(T0, queued=0, in_progress=1, workers=[_on("m1", "w1")])
    assert not pool.of(IncidentKind.REPEAT_OFFENDER)


def test_an_owned_node_whose_fix_does_not_hold_is_drained_for_a_person():
    logic = HostIncidents(POLICY, stale_after_s=60)
    events = []

    def commit(transitions):
        for t in transitions:
            events.extend(e for span in t.spans for e in span.events)
            logic.book.commit(t)

    for minutes in (40, 25, 5):  # fixed, back, fixed, back
        logic.offenders.on_opened(_opened("gpu-node-07", IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes), gpu=0))
    fleet = FleetView(latest={n: _sampled(n, T0) for n in ("gpu-node-07", "gpu-node-08")})
    commit(logic.on_round(fleet, T0))
    (opened,) = [e for e in events if isinstance(e, IncidentOpened)]
    assert opened.kind is IncidentKind.REPEAT_OFFENDER and opened.node_id == "gpu-node-07" and "3 zombie_job incidents within 1h" in opened.summary
    commit(logic.on_tick(T0 + timedelta(seconds=20)))
    (drain,) = [e for e in events if getattr(e, "operation", None) == DrainNode()]
    done = ActionCompleted(source="remediator", action_id=drain.action_id, incident_id=drain.incident_id, node_id=drain.node_id,
                           attempt=drain.attempt, operation="drain_node", outcome=ActionOutcome.SUCCEEDED, detail="drained")
    commit(logic.on_action_completed(done, T0 + timedelta(seconds=21), None))
    (escalated,) = [e for e in events if isinstance(e, IncidentEscalated)]
    assert "no safe terminate_worker" in escalated.reason and "drained" in escalated.reason
    assert not any(isinstance(getattr(e, "operation", None), TerminateWorker) for e in events)


def test_many_owned_nodes_offending_in_one_round_are_one_fleet_incident_and_none_is_drained():
    # A bad job image that hangs on every node makes most of the fleet repeat offenders at once:
    # that is one cause for a person, not ten drains.
    logic = HostIncidents(POLICY, stale_after_s=60)
    nodes = [f"gpu-node-{i:02d}" for i in range(1, 21)]
    for node in nodes[:10]:
        for minutes in (40, 25, 5):
            logic.offenders.on_opened(_opened(node, IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes), gpu=0))
    fleet = FleetView(latest={n: _sampled(n, T0) for n in nodes})
    transitions = logic.on_round(fleet, T0)
    for t in transitions:
        logic.book.commit(t)
    transitions += logic.on_tick(T0 + timedelta(seconds=30))
    events = [e for t in transitions for span in t.spans for e in span.events]
    (fleet_incident,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert "repeat_offender on 10 of 20 nodes" in fleet_incident.summary
    assert len([e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.REPEAT_OFFENDER]) == 10
    assert not any(getattr(e, "operation", None) == DrainNode() for e in events)


def test_incidents_opened_as_part_of_a_fleet_incident_count_against_no_host():
    logic = HostIncidents(POLICY, stale_after_s=60)
    fleet_incident = uuid.uuid4()
    for minutes in (3, 2, 1):
        logic.offenders.on_opened(_opened("gpu-node-07", IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes), gpu=0)
                                  .model_copy(update={"related_incident_id": fleet_incident}))
    assert logic.on_round(FleetView(latest={"gpu-node-07": _sampled("gpu-node-07", T0)}), T0) == []


def test_a_node_that_does_not_sample_is_not_acted_on_nor_is_a_worker_of_the_pool_that_is_gone():
    logic = HostIncidents(POLICY, stale_after_s=60)
    for minutes in (3, 2, 1):
        logic.offenders.on_opened(_opened("gpu-node-09", IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes)))
    stale = FleetView(latest={"gpu-node-09": _sampled("gpu-node-09", T0 - timedelta(minutes=5))})
    assert logic.on_round(stale, T0) == []
    pool = Pool()
    pool.round(T0 - timedelta(minutes=5), queued=0, in_progress=1, workers=[_on("", "w3")])  # a worker with no machine id
    for minutes in (3, 2, 1):
        pool.logic.offenders.on_opened(_opened("w3", IncidentKind.ZOMBIE_JOB, T0 - timedelta(minutes=minutes)))
    pool.round(T0, queued=0, in_progress=0, workers=[], fleet=FleetView(latest={"w3": _sampled("w3", T0)}))
    assert not pool.of(IncidentKind.REPEAT_OFFENDER)


def test_a_rule_cannot_count_what_is_no_hosts_doing():
    with pytest.raises(ValidationError, match="capacity_short are not one host's doing"):
        RepeatRule(kinds=(IncidentKind.CAPACITY_SHORT,), count=2, window_s=60)
    quiet = Policy.model_validate({"kinds": {"repeat_offender": {"rules": []}}})
    logic = HostIncidents(quiet, stale_after_s=60)
    for minutes in (3, 2, 1):
        logic.offenders.on_opened(_opened("gpu-node-07", IncidentKind.GPU_XID, T0 - timedelta(minutes=minutes)))
    assert logic.on_round(FleetView(latest={"gpu-node-07": _sampled("gpu-node-07", T0)}), T0) == []


def test_the_machines_remembered_are_the_workers_listed_and_those_whose_incidents_still_count():
    pool = Pool()
    pool.round(T0 - DAY, queued=0, in_progress=0, workers=[_on("m1", "w1"), _on("m2", "w2")])
    pool.logic.offenders.on_opened(_opened("w1", IncidentKind.GPU_XID, T0 - DAY))
    pool.round(T0, queued=0, in_progress=0, workers=[_on("m3", "w3")])
    assert pool.logic.offenders.machines == {"w1": "m1", "w3": "m3"}, "w2 is gone and nothing of it counts"
    pool.round(T0 + 8 * DAY, queued=0, in_progress=0, workers=[_on("m3", "w3")])  # w1's XID is out of every window
    assert pool.logic.offenders.machines == {"w3": "m3"}


def test_incidents_found_while_the_control_plane_was_behind_or_marked_false_count_against_no_host():
    """On the busy day the control plane fell behind and judged healthy hosts by its own lateness;
    a person marked one incident false. None of those makes a host a repeat offender; the same
    incidents found while it keeps up do."""
    from gpumedic_events import IncidentMarked

    pool = Pool()
    workers = [_on("m-1", "w1")]
    pool.round(T0, queued=0, in_progress=1, workers=workers)
    offenders = pool.logic.offenders
    behind = _opened("control-plane", IncidentKind.CONTROL_PLANE_BEHIND, T0, gpu=None)
    offenders.on_opened(behind)
    for i in range(4):  # three of one kind within the hour would be a repeat offender
        offenders.on_opened(_opened("w1", IncidentKind.NODE_SILENT, T0 + timedelta(seconds=10 * i), gpu=None))
    offenders.on_resolved(IncidentResolved(source="zombie-detector", incident_id=behind.incident_id, node_id="control-plane",
                                           kind=IncidentKind.CONTROL_PLANE_BEHIND, resolution="cleared", summary="caught up"))
    marked = [_opened("w1", IncidentKind.NODE_SILENT, T0 + timedelta(seconds=60 + i), gpu=None) for i in range(3)]
    for opened in marked:
        offenders.on_opened(opened)
    offenders.on_marked(IncidentMarked(source="gpumedic-cli", incident_id=marked[0].incident_id, reason="the node was busy",
                                       marked_by="alice"))
    pool.round(T0 + timedelta(seconds=70), queued=0, in_progress=1, workers=workers)
    assert not pool.of(IncidentKind.REPEAT_OFFENDER)  # two counted: the behind ones and the false one are not
    offenders.on_opened(_opened("w1", IncidentKind.NODE_SILENT, T0 + timedelta(seconds=80), gpu=None))
    pool.round(T0 + timedelta(seconds=85), queued=0, in_progress=1, workers=workers)
    (opened,) = pool.of(IncidentKind.REPEAT_OFFENDER)
    assert opened.node_id == "w1" and opened.evidence["count"] == 3


def test_until_the_history_is_read_no_host_is_judged_either_way():
    """The autoscaler reads every incident ever opened once it is ready: until it has, a host with
    offences already counted is neither found again nor cleared, and none is found anew."""
    pool = Pool()
    workers = [_on("m-1", "w1")]
    pool.round(T0, queued=0, in_progress=1, workers=workers)
    for i in range(3):
        pool.logic.offenders.on_opened(_opened("w1", IncidentKind.NODE_SILENT, T0 + timedelta(seconds=i), gpu=None))
    pool.round(T0 + timedelta(seconds=5), queued=0, in_progress=1, workers=workers)
    (opened,) = pool.of(IncidentKind.REPEAT_OFFENDER)
    history_read = False
    pool.logic.offenders.known = lambda: history_read
    later = T0 + timedelta(hours=2)  # its offences have aged out of the hour: once read, it is clear
    pool.round(later, queued=0, in_progress=1, workers=workers)
    resolved = lambda: [e for e in pool.events if isinstance(e, IncidentResolved) and e.incident_id == opened.incident_id]  # noqa: E731
    assert not resolved() and len(pool.of(IncidentKind.REPEAT_OFFENDER)) == 1
    history_read = True
    pool.round(later + timedelta(seconds=5), queued=0, in_progress=1, workers=workers)
    assert resolved()
