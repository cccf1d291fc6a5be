"""The worker pool's incidents from plain readings: the queue's decision and the worker checks
into the shared incident book, with the actions the remediator is asked for."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.demand import Demand, DemandUnavailable
from autoscaler.lifecycle import TaskRecord, WorkerRecord
from autoscaler.pool import FleetView, PoolIncidents, Reading
from autoscaler.scaling import NodeLoad, ScalingPolicy
from gpumedic_events import (
    ActionCompleted, ActionOutcome, ActionRequested, GpuSample, IncidentKind, IncidentOpened, IncidentResolved, NodeSampled,
    SpawnWorker, TerminateWorker,
)
from gpumedic_incidents import Policy
from gpumedic_providers.base import ProviderError, Worker

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
H100 = "H100"
POLICY = Policy.model_validate({"actions": {"spawn_worker": {"gpu_types": [H100]}}})
SCALING = ScalingPolicy(min_active_gpus=0, max_active_gpus=8, tasks_per_gpu=3, idle_timeout_s=600, cooldown_s=300,
                        gpu_type=H100, gpus_per_worker=1)


def _w(worker_id: str, status: str = "running", age_s: float = 3600, price: float = 2.49) -> Worker:
    return Worker(worker_id=worker_id, status=status, gpu_type=H100, gpus=1, price_per_h=price, created_at=T0 - timedelta(seconds=age_s))


def _sample(node: str, util: int, at: datetime) -> NodeLoad:
    return NodeLoad.of(NodeSampled(source="node-sampler", node_id=node, occurred_at=at, interval_s=5,
                                   gpus=(GpuSample(index=0, uuid=f"GPU-{node}", name=H100, utilization_gpu_pct=util),)))


class Pool:
    """The logic with its book committed after every input, as the detector does, and what was published."""

    def __init__(self, scaling: ScalingPolicy = SCALING, policy: Policy = POLICY) -> None:
        self.logic = PoolIncidents("workers", policy, scaling, busy_util_pct=20, stale_after_s=120)
        self.events: list = []

    def _commit(self, transitions) -> None:
        for t in transitions:
            self.events += [e for span in t.spans for e in span.events]
            self.logic.book.commit(t)

    def round(self, at: datetime, *, queued: int = 0, in_progress: int = 0, workers=(), records=None, fleet=None, demand=None):
        reading = Reading(demand=demand or Demand(queued=queued, in_progress=in_progress), workers=list(workers) if not isinstance(workers, Exception) else workers, records=records)
        evaluated, transitions = self.logic.on_round(reading, fleet or FleetView(), at)
        self._commit(transitions)
        return evaluated

    def tick(self, at: datetime) -> None:
        self._commit(self.logic.on_tick(at))

    def complete(self, request: ActionRequested, at: datetime, outcome=ActionOutcome.SUCCEEDED) -> None:
        done = ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id,
                               node_id=request.node_id, attempt=request.attempt, operation=request.operation.operation,
                               outcome=outcome, detail="done")
        self._commit(self.logic.on_action_completed(done, at, None))

    def requests(self) -> list[ActionRequested]:
        return [e for e in self.events if isinstance(e, ActionRequested)]

    def of(self, kind):
        return [e for e in self.events if getattr(e, "kind", None) is kind]


def test_a_backlog_rents_workers_once_and_the_incident_is_fixed_when_they_are_listed():
    pool = Pool()
    evaluated = pool.round(T0, queued=14, in_progress=1, workers=[_w("w1")])
    assert (evaluated.decision, evaluated.gpus_wanted, evaluated.change_gpus) == ("scale_up", 5, 4)
    assert evaluated.cost_per_h == 2.49 and evaluated.workers == 1
    (opened,) = [e for e in pool.events if isinstance(e, IncidentOpened)]
    assert opened.kind is IncidentKind.CAPACITY_SHORT and opened.node_id == "workers" and not pool.requests()
    pool.tick(T0 + timedelta(seconds=16))  # after the fleet hold
    (request,) = pool.requests()
    assert request.operation == SpawnWorker(gpu_type=H100, gpus=1, count=4)
    # While the action runs, the same shortage asks nothing more.
    pool.round(T0 + timedelta(seconds=20), queued=14, in_progress=1, workers=[_w("w1")])
    pool.complete(request, T0 + timedelta(seconds=21))
    spawning = [_w("w1"), *(_w(f"n{i}", "spawning", 5) for i in range(4))]
    evaluated = pool.round(T0 + timedelta(seconds=30), queued=14, in_progress=1, workers=spawning)
    assert evaluated.decision == "hold" and evaluated.workers_in_service == 5  # spawning workers count
    (resolved,) = [e for e in pool.events if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "fixed" and len(pool.requests()) == 1


def test_no_decision_and_no_incident_change_on_a_provider_or_a_queue_that_cannot_be_trusted():
    pool = Pool()
    pool.round(T0, queued=30, workers=[_w("w1")])
    assert len(pool.of(IncidentKind.CAPACITY_SHORT)) == 1
    before = dict(pool.logic.book.incidents)
    broken = pool.round(T0 + timedelta(seconds=60), queued=0, workers=ProviderError("RunPod: GET /pods answered HTTP 502"))
    assert broken.decision == "hold" and broken.provider_error == "RunPod: GET /pods answered HTTP 502"
    assert "no decision: RunPod" in broken.reason
    down = pool.round(T0 + timedelta(seconds=61), workers=[_w("w1")], demand=DemandUnavailable("sql task database on db1: no answer within 5s"))
    assert down.decision == "hold" and down.demand_error.startswith("sql task database on db1")
    assert pool.logic.book.incidents == before  # neither cleared nor changed on bad data


def test_a_stuck_or_silent_worker_is_ended_and_is_no_capacity_so_it_is_replaced():
    pool = Pool()
    workers = [_w("stuck", "spawning", age_s=400), _w("silent"), _w("busy")]
    records = ([WorkerRecord("silent", "active", T0 - timedelta(minutes=20)), WorkerRecord("busy", "active", T0 - timedelta(minutes=20))],
               [TaskRecord("t1", "gone")])
    fleet = FleetView(latest={"busy": _sample("busy", 95, T0 - timedelta(seconds=5))})
    evaluated = pool.round(T0, queued=6, in_progress=3, workers=workers, records=records, fleet=fleet)
    # stuck and silent are no capacity; busy is silent on its heartbeat but its GPU works: still capacity.
    assert evaluated.workers_in_service == 1 and (evaluated.decision, evaluated.change_gpus) == ("scale_up", 2)
    kinds = {(e.kind, e.node_id) for e in pool.events if isinstance(e, IncidentOpened)}
    assert kinds == {
        (IncidentKind.CAPACITY_SHORT, "workers"), (IncidentKind.STUCK_SPAWNING, "stuck"), (IncidentKind.STALE_HEARTBEAT, "silent"),
        (IncidentKind.STALE_HEARTBEAT, "busy"), (IncidentKind.ORPHANED_TASKS, "gone"),
    }
    pool.tick(T0 + timedelta(seconds=16))
    asked = {r.node_id: r.operation for r in pool.requests()}
    assert asked["stuck"] == TerminateWorker(worker_ids=("stuck",)) and asked["silent"] == TerminateWorker(worker_ids=("silent",))
    assert "busy" not in asked  # checked first: a person looks at a worker whose GPU still works
    assert asked["workers"] == SpawnWorker(gpu_type=H100, gpus=1, count=2) and asked["gone"].task_ids == ("t1",)


def test_idle_workers_go_after_the_cool_down_only_and_the_decision_does_not_flap():
    pool = Pool()
    workers = [_w("a"), _w("b"), _w("c")]
    idle = {w.worker_id: T0 - timedelta(seconds=900) for w in workers}
    fleet = FleetView(idle_since=idle)
    for s in range(0, 300, 60):  # the surplus must last the cool-down
        assert pool.round(T0 + timedelta(seconds=s), queued=0, in_progress=3, workers=workers, fleet=fleet).decision == "hold"
    evaluated = pool.round(T0 + timedelta(seconds=300), queued=0, in_progress=3, workers=workers, fleet=fleet)
    assert evaluated.decision == "scale_down" and len(evaluated.release) == 2
    pool.tick(T0 + timedelta(seconds=316))
    (request,) = pool.requests()
    assert request.operation == TerminateWorker(worker_ids=evaluated.release)
    pool.complete(request, T0 + timedelta(seconds=320))
    left = [w for w in workers if w.worker_id not in evaluated.release]
    # The next rounds hold: the change starts a new cool-down, and the incident is fixed.
    for s in (360, 420, 480):
        assert pool.round(T0 + timedelta(seconds=s), queued=0, in_progress=3, workers=left, fleet=fleet).decision == "hold"
    assert [e.resolution for e in pool.events if isinstance(e, IncidentResolved)] == ["fixed"]


def test_a_worker_a_person_must_look_at_or_a_drained_one_is_no_capacity_and_the_budget_caps_renting():
    capped = ScalingPolicy(**(SCALING.model_dump() | {"max_cost_per_h": 8.0, "gpu_price_per_h": 2.49}))
    pool = Pool(capped)
    fleet = FleetView(drained=frozenset({"b"}), needs_person={"c": "gpu_lost incident 1 waits for a person"})
    evaluated = pool.round(T0, queued=0, in_progress=9, workers=[_w("a"), _w("b"), _w("c")], fleet=fleet)
    # 3 GPUs wanted, 1 in service; the three bill $7.47/h, and one more would pass $8/h.
    assert evaluated.workers_in_service == 1 and evaluated.decision == "hold"
    assert "the budget of $8.00/h allows 0 more worker(s)" in evaluated.reason


def test_costs_are_counted_over_time():
    pool = Pool()
    workers = [_w("a", price=2.0), _w("b", price=2.0)]
    fleet = FleetView(idle_since={"b": T0})
    pool.round(T0, in_progress=6, workers=workers, fleet=fleet, demand=Demand(queued=0, in_progress=6, complete=100))
    evaluated = pool.round(T0 + timedelta(hours=1), workers=workers, fleet=fleet, demand=Demand(queued=0, in_progress=6, complete=140))
    assert evaluated.cost_total == 4.0 and evaluated.idle_gpu_hours == 1.0 and evaluated.cost_per_task == 0.1


def test_a_worker_the_task_database_has_a_task_on_is_not_ended_however_idle_its_last_sample():
    pool = Pool()
    workers = [_w("a"), _w("b"), _w("c")]
    fleet = FleetView(idle_since={w.worker_id: T0 - timedelta(seconds=900) for w in workers})
    # a took a task since its last sample: the database says so before its GPU does
    records = ([WorkerRecord(w.worker_id, "active", T0) for w in workers], [TaskRecord("t1", "a")])
    for s in range(0, 360, 60):
        evaluated = pool.round(T0 + timedelta(seconds=s), queued=0, in_progress=1, workers=workers, fleet=fleet, records=records)
    assert evaluated.decision == "scale_down" and set(evaluated.release) == {"b", "c"}
    pool.tick(T0 + timedelta(seconds=376))
    (request,) = pool.requests()
    assert "a" not in request.operation.worker_ids


def test_a_burst_that_outgrows_each_rental_rents_again_at_the_ladder_s_pace_and_pages_nobody():
    """A rental still short of a growing burst most of its verification window later fixed its
    incident (it did what it was asked); the next round's incident rents again. Three such rentals
    used to exhaust the ladder, page a person and stop the pool mid-burst."""
    pool = Pool(SCALING.model_copy(update={"max_active_gpus": 64}))
    workers = [_w("w1")]
    at = T0
    for n in range(4):
        pool.round(at, queued=60 * (n + 1), workers=workers)
        pool.tick(at + timedelta(seconds=16))
        request = pool.requests()[-1]
        assert isinstance(request.operation, SpawnWorker) and request.attempt == 1, request
        pool.complete(request, at + timedelta(seconds=20))
        workers = [*workers, *(_w(f"n{n}-{i}", "spawning", 5) for i in range(request.operation.count))]
        pool.round(at + timedelta(seconds=60), queued=60 * (n + 2), workers=workers)  # still short: verifying
        pool.round(at + timedelta(seconds=130), queued=60 * (n + 2), workers=workers)  # 110 s after the rental: fixed
        at += timedelta(seconds=135)
    opened = [e for e in pool.events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.CAPACITY_SHORT]
    short = {e.incident_id for e in opened}
    assert len(short) == 4 and len({r.incident_id for r in pool.requests() if isinstance(r.operation, SpawnWorker)}) == 4
    assert [e.resolution for e in pool.events if isinstance(e, IncidentResolved) and e.incident_id in short] == ["fixed"] * 4
    assert not [e for e in pool.events if type(e).__name__ == "IncidentEscalated" and e.incident_id in short]


def test_each_round_carries_runbook_001s_workers_table():
    from gpumedic_providers.base import SshDetails

    pool = Pool()
    workers = [_w("stuck", "spawning", age_s=400), _w("w1", price=3.5).model_copy(update={"ssh": SshDetails(host="203.0.113.7", port=22041)})]
    records = ([WorkerRecord("w1", "active", T0 - timedelta(seconds=95))], [TaskRecord("task-9", "w1"), TaskRecord("t-orphan", None)])
    rows = {r.worker_id: r for r in pool.round(T0, queued=1, in_progress=1, workers=workers, records=records).worker_rows}
    w1, stuck = rows["w1"], rows["stuck"]
    assert (w1.status, w1.record_status, w1.heartbeat_age_s, w1.host, w1.price_per_h, w1.task, w1.in_service) == (
        "running", "active", 95.0, "203.0.113.7:22041", 3.5, "task-9", True)
    assert (stuck.status, stuck.record_status, stuck.heartbeat_age_s, stuck.host, stuck.task, stuck.in_service) == (
        "spawning", None, None, None, None, False)  # stuck spawning: no capacity, and no record in the task database
    # a queue that cannot be read makes no decision, and the table is still kept
    held = pool.round(T0 + timedelta(seconds=30), workers=workers, records=records, demand=DemandUnavailable("the queue times out"))
    assert held.decision == "hold" and [r.worker_id for r in held.worker_rows] == ["stuck", "w1"]
    assert pool.round(T0 + timedelta(seconds=60), workers=ProviderError("HTTP 502")).worker_rows == ()
