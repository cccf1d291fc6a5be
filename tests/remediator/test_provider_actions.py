"""spawn_worker, terminate_worker and restart_worker through the whole action handler: the gate (an open incident
that waits for exactly this action, observe mode, the policy's allow-list), a real SQLite store for
the ledger and audit, and RunPod's REST API served on loopback."""

from __future__ import annotations

import functools
import sqlite3
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gpumedic_bus import Delivery
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    IncidentKind,
    RolloutRequest,
    NodeRetired,
    RestartWorker,
    SpawnWorker,
    TerminateWorker,
)
from gpumedic_incidents.policy import Actions, CheckpointPolicy, Kinds, Policy, RequeuePolicy, RestartWorkerPolicy, SpawnPolicy, TerminatePolicy, dump_policy, load_policy
from gpumedic_incidents.state import fingerprint
from gpumedic_store import create_engine, session_factory
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator import repository
from remediator.handlers import ActionHandler
from remediator.main import executor_of, gate_of, provider_of, task_db_of
from remediator.rollout import Rollout
from tests.fixtures.runpod import KEY
from tests.remediator.conftest import incident_waiting_for

H100 = "NVIDIA H100 80GB HBM3"
TASKS_QUERY = "SELECT id FROM tasks WHERE worker_id = :worker_id AND status = 'In Progress'"
REQUEUE = "UPDATE tasks SET status = 'Queued', worker_id = NULL WHERE id IN :task_ids AND status = 'In Progress'"
FAILED_QUERY = "SELECT id FROM tasks WHERE worker_id = :worker_id AND status = 'Failed'"
REQUEUE_FAILED = ("UPDATE tasks SET status = 'Queued', worker_id = NULL, retried = 1 WHERE id IN :task_ids AND status = 'Failed' "
                  "AND retried = 0")


class _Broker:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, data, subject, *, headers=None, stream=None, timeout=None):
        self.published.append((subject, data))


@pytest.fixture
async def remediator(make_settings, incidents, tmp_path, runpod_api):
    fake, base = runpod_api
    (tmp_path / "runpod-key").write_text(KEY + "\n")
    made = []

    def _make(*, gpu_types=(H100,), mode="enforce", provider=True, task_db: Path | None = None, checkpoint: CheckpointPolicy | None = None,
              **settings):
        """`task_db`: a SQLite task database whose tasks the terminations ask about and requeue;
        `checkpoint`: the checkpoint step of the pool's surplus and of a worker stuck spawning."""
        policy_file = tmp_path / "policy.yaml"
        actions = Actions(spawn_worker=SpawnPolicy(gpu_types=gpu_types, max_gpus=8), restart_worker=RestartWorkerPolicy(back_within_s=1.5, poll_s=0.2))
        if task_db is not None:
            (tmp_path / "task-db-url").write_text(f"sqlite+aiosqlite:///{task_db}\n")
            actions = actions.model_copy(update={"terminate_worker": TerminatePolicy(tasks_query=TASKS_QUERY, failed_tasks_query=FAILED_QUERY),
                                                 "requeue_tasks": RequeuePolicy(statement=REQUEUE, failed_statement=REQUEUE_FAILED)})
        kinds = Kinds(capacity_surplus=Kinds().capacity_surplus.model_copy(update={"checkpoint": checkpoint}),
                      stuck_spawning=Kinds().stuck_spawning.model_copy(update={"checkpoint": checkpoint}))
        dump_policy(Policy(actions=actions, kinds=kinds), policy_file)
        settings = make_settings(
            policy={"file": policy_file}, mode=mode,
            provider={"kind": "runpod", "api_key_file": tmp_path / "runpod-key", "image": "ghcr.io/acme/selfplay:7",
                      "base_url": base, "timeout_s": 2} if provider else None,
            task_db_url_file=tmp_path / "task-db-url" if task_db is not None else None, **settings,
        )
        engine = create_engine(settings.store.url)
        handler = ActionHandler(
            settings=settings, gate=gate_of(settings, settings.policy.load()), runtime=SimpleNamespace(broker=_Broker(), metrics=ServiceMetrics("remediator")), sessions=session_factory(engine),
            executor=executor_of(settings), tracer=TracerProvider().get_tracer("test"), incidents=incidents,
            provider=provider_of(settings), task_db=task_db_of(settings),
        )
        made.append((engine, handler))
        return handler

    yield fake, _make
    for engine, handler in made:
        if handler.provider is not None:
            await handler.provider.close()
        if handler.task_db is not None:
            await handler.task_db.close()
        await engine.dispose()


async def ask(handler: ActionHandler, operation, *, node: str = "workers", incident_id: uuid.UUID | None = None,
              kind: IncidentKind | None = None) -> ActionCompleted:
    """A request as the autoscaler makes it, under the incident that waits for it."""
    incident_id = incident_id or uuid.uuid4()
    if isinstance(operation, SpawnWorker):
        kind = IncidentKind.CAPACITY_SHORT
    elif isinstance(operation, RestartWorker):  # a GPU that kills did not free, on a rented node
        kind = IncidentKind.ORPHAN_GPU_HOLDER
    else:  # the pool's surplus, or one worker's own incident
        kind = kind or (IncidentKind.CAPACITY_SURPLUS if node == "workers" else IncidentKind.STUCK_SPAWNING)
    request = ActionRequested(
        source="zombie-detector" if isinstance(operation, RestartWorker) else "autoscaler", action_id=uuid.uuid4(), incident_id=incident_id, node_id=node, attempt=1,
        operation=operation, reason="queue backlog", fingerprint=fingerprint(node, kind, None),
    )
    await handler.incidents.save(incident_waiting_for(request))
    await handler.handle(request, Delivery(request.subject, {}, 1))
    subject, data = handler._runtime.broker.published[-1]
    return ActionCompleted.from_json(data, subject=subject)


async def test_a_worker_is_rented_and_ended_through_the_gate_with_every_call_audited(remediator):
    fake, make = remediator
    handler = make()
    rented = await ask(handler, SpawnWorker(gpu_type=H100, gpus=8, count=2))
    assert rented.outcome is ActionOutcome.SUCCEEDED, rented.detail
    first, second = fake.pods
    assert rented.detail == f"rented 2 worker(s) of 8 x {H100} at $2.99/h each: {first}, {second}"
    assert fake.requests[0][2]["gpuTypeIds"] == [H100] and fake.requests[0][2]["name"].startswith("gpumedic-")
    ended = await ask(handler, TerminateWorker(worker_ids=(first, second)))
    assert (ended.outcome, ended.detail) == (ActionOutcome.SUCCEEDED, f"terminated {first}, {second}")
    assert fake.pods == {} and [m for m, _, _ in fake.requests] == ["POST", "POST", "DELETE", "DELETE", "GET"]
    # The ended workers are retired, before the result: no detector takes their silence for a fault.
    retired = [NodeRetired.from_json(d, subject=s) for s, d in handler._runtime.broker.published[-3:-1]]
    assert [(r.node_id, r.action_id) for r in retired] == [(first, ended.action_id), (second, ended.action_id)]
    assert retired[0].reason == f"terminate_worker: terminated {first}, {second}"
    assert not any(".node.retired." in s for s, _ in handler._runtime.broker.published[:-3])  # a rental retires nothing
    async with handler._sessions() as session:
        record = await repository.get_action(session=session, action_id=ended.action_id)
    assert [a["command"] for a in record.audit] == [
        f"provider: terminate worker {first}", f"provider: terminate worker {second}", "provider: list workers (verify)"
    ]
    assert all(a["exit_status"] == 0 for a in record.audit) and KEY not in str(record.audit)


def _task_table(path: Path, *statements: str) -> list[tuple]:
    """Run `statements` on the runbook's task table in `path`; then its rows (id, status, worker)."""
    with sqlite3.connect(path) as db:
        for statement in statements:
            db.execute(statement)
        return db.execute("SELECT id, status, worker_id FROM tasks ORDER BY id").fetchall()


async def test_no_worker_is_ended_mid_task_and_what_an_ended_worker_ran_goes_back_to_the_queue(remediator, tmp_path):
    """The runbook's task table, asked before each ending: the pool's idle workers are ended only if
    none took a task since the autoscaler chose them; a worker ended for its own fault has its task
    requeued at once (not a round later by orphaned_tasks)."""
    fake, make = remediator
    path = tmp_path / "tasks.db"
    tasks = functools.partial(_task_table, path)

    tasks("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT)")
    handler = make(task_db=path)
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=1, count=3))
    idle, raced, faulty = fake.pods
    tasks(f"INSERT INTO tasks VALUES ('t1', 'In Progress', '{raced}'), ('t2', 'Complete', '{idle}')")
    kept = await ask(handler, TerminateWorker(worker_ids=(idle, raced)))
    assert (kept.outcome, kept.in_use) == (ActionOutcome.BLOCKED, True)
    assert kept.detail == f"refused: no worker is ended mid-task; {raced} took 1 task(s) (t1) since it was chosen as idle"
    assert set(fake.pods) == {idle, raced, faulty} and not any(".node.retired." in s for s, _ in handler._runtime.broker.published)

    tasks("UPDATE tasks SET status = 'Complete' WHERE id = 't1'")  # its task done, the surplus asks again
    ended = await ask(handler, TerminateWorker(worker_ids=(idle, raced)))
    assert (ended.outcome, ended.detail) == (ActionOutcome.SUCCEEDED, f"terminated {idle}, {raced}")
    assert set(fake.pods) == {faulty}
    async with handler._sessions() as session:
        record = await repository.get_action(session=session, action_id=ended.action_id)
    asked = "task database: actions.terminate_worker.tasks_query for {}".format
    assert [a["command"] for a in record.audit] == [
        asked(idle), asked(raced), f"provider: terminate worker {idle}", asked(idle), f"provider: terminate worker {raced}", asked(raced),
        "provider: list workers (verify)",
    ]

    tasks(f"INSERT INTO tasks VALUES ('t3', 'In Progress', '{faulty}')")
    own = await ask(handler, TerminateWorker(worker_ids=(faulty,)), node=faulty)  # its own incident: ended busy or not
    assert (own.outcome, own.detail) == (ActionOutcome.SUCCEEDED, f"terminated {faulty}; requeued 1 of the 1 task(s) (t3) {faulty} was running")
    assert tasks() == [("t1", "Complete", raced), ("t2", "Complete", idle), ("t3", "Queued", None)]


async def test_a_black_hole_s_failed_tasks_go_back_to_the_queue_once_when_it_is_ended(remediator, tmp_path):
    """The policy's failed_tasks_query and guarded failed_statement: ending a black hole requeues
    what failed on it (the host's fault), a task given another go before is not given a third, and
    another kind's termination (stuck spawning) leaves failed tasks failed."""
    fake, make = remediator
    path = tmp_path / "tasks.db"
    tasks = functools.partial(_task_table, path)

    tasks("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT, retried INTEGER NOT NULL DEFAULT 0)")
    handler = make(task_db=path)
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=1, count=2))
    hole, stuck = fake.pods
    tasks(f"INSERT INTO tasks VALUES ('f1', 'Failed', '{hole}', 0), ('f2', 'Failed', '{hole}', 0), ('f3', 'Failed', '{hole}', 1), "
          f"('ok', 'Complete', '{hole}', 0), ('s1', 'Failed', '{stuck}', 0)")
    ended = await ask(handler, TerminateWorker(worker_ids=(hole,)), node=hole, kind=IncidentKind.BLACK_HOLE)
    assert (ended.outcome, ended.detail) == (
        ActionOutcome.SUCCEEDED,
        f"terminated {hole}; requeued 2 of the 3 task(s) (f1, f2, f3) that failed on {hole} (1 had been given another go before)",
    )
    async with handler._sessions() as session:
        record = await repository.get_action(session=session, action_id=ended.action_id)
    assert [a["command"] for a in record.audit] == [
        f"provider: terminate worker {hole}", f"task database: actions.terminate_worker.tasks_query for {hole}",
        f"task database: actions.terminate_worker.failed_tasks_query for {hole}",
        f"task database: actions.requeue_tasks.failed_statement for the tasks that failed on {hole}", "provider: list workers (verify)",
    ]
    other = await ask(handler, TerminateWorker(worker_ids=(stuck,)), node=stuck)  # stuck spawning: its failures are its tasks' own
    assert (other.outcome, other.detail) == (ActionOutcome.SUCCEEDED, f"terminated {stuck}")
    assert tasks() == [("f1", "Queued", None), ("f2", "Queued", None), ("f3", "Failed", hole), ("ok", "Complete", hole), ("s1", "Failed", stuck)]


@pytest.mark.parametrize("section, sql", [
    ("terminate_worker", {"failed_tasks_query": "SELECT id FROM tasks WHERE worker_id = :worker AND status = 'Failed'"}),
    ("requeue_tasks", {"failed_statement": "UPDATE tasks SET status = 'Queued' WHERE id = 't1'"}),
])
def test_the_failed_task_statements_take_exactly_their_bound_parameter(section, sql):
    with pytest.raises(ValueError, match="exactly one bound parameter"):
        Actions.model_validate({section: sql})


async def test_a_worker_ended_for_its_own_fault_has_its_jobs_asked_to_checkpoint_and_the_pool_s_idle_ones_are_not(remediator):
    fake, make = remediator
    handler = make(checkpoint=CheckpointPolicy(how="signal", wait_s=5))
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=1, count=2))
    idle, stuck = fake.pods
    pool = await ask(handler, TerminateWorker(worker_ids=(idle,)))
    assert (pool.outcome, pool.detail) == (
        ActionOutcome.SUCCEEDED, f"no checkpoint asked: the pool chose the workers as idle (nothing to save); then terminated {idle}"
    )
    # Its own incident: its jobs would be asked over SSH, but this worker was never enrolled; it is ended all the same.
    own = await ask(handler, TerminateWorker(worker_ids=(stuck,)), node=stuck)
    assert own.outcome is ActionOutcome.SUCCEEDED and own.detail.endswith(f"; then terminated {stuck}"), own.detail
    assert own.detail.startswith("no checkpoint asked: ") and stuck in own.detail and "inventory" in own.detail, own.detail
    assert fake.pods == {}


async def test_a_task_database_that_answers_nonsense_ends_no_worker(remediator, tmp_path):
    fake, make = remediator
    path = tmp_path / "tasks.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT)")
    handler = make(task_db=path)
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=1))
    (pod,) = fake.pods
    with sqlite3.connect(path) as db:
        db.execute(f"INSERT INTO tasks VALUES ('t1; DROP TABLE tasks', 'In Progress', '{pod}')")
    hostile = await ask(handler, TerminateWorker(worker_ids=(pod,)))
    assert hostile.outcome is ActionOutcome.FAILED and set(fake.pods) == {pod}
    assert hostile.detail == f"nothing terminated: what {pod} runs could not be read: the tasks_query answered 't1; DROP TABLE tasks', which is no task id"
    with sqlite3.connect(path) as db:
        db.execute("DROP TABLE tasks")  # the table gone: the database says so, and nothing is ended
    gone = await ask(handler, TerminateWorker(worker_ids=(pod,)))
    assert gone.outcome is ActionOutcome.FAILED and "nothing terminated" in gone.detail and "no such table: tasks" in gone.detail
    assert set(fake.pods) == {pod}


async def test_what_the_policy_does_not_allow_is_refused_before_the_provider_is_called(remediator):
    fake, make = remediator
    nothing_allowed = await ask(make(gpu_types=()), SpawnWorker(gpu_type=H100, gpus=1))
    assert nothing_allowed.outcome is ActionOutcome.BLOCKED
    assert "refused: spawn_worker: GPU type 'NVIDIA H100 80GB HBM3' is not in actions.spawn_worker.gpu_types (none)" == nothing_allowed.detail
    other_type = await ask(make(), SpawnWorker(gpu_type="RTX4090", gpus=1))
    assert "'RTX4090' is not in actions.spawn_worker.gpu_types" in other_type.detail
    too_many = await ask(make(), SpawnWorker(gpu_type=H100, gpus=1, count=5))
    assert "5 workers is more than actions.spawn_worker.max_count (4)" in too_many.detail
    observed = await ask(make(mode="observe"), SpawnWorker(gpu_type=H100, gpus=2))
    assert observed.outcome is ActionOutcome.OBSERVED and f"would run: provider: rent a worker with 2 x {H100}" in observed.detail
    assert fake.requests == []  # nothing reached the provider
    unconfigured = await ask(make(provider=False), SpawnWorker(gpu_type=H100, gpus=1))
    assert "no provider is configured (GPUMEDIC_REMEDIATOR_PROVIDER)" in unconfigured.detail


async def test_a_provider_that_fails_fails_the_action_saying_why_and_never_the_key(remediator):
    fake, make = remediator
    handler = make()
    gone = await ask(handler, TerminateWorker(worker_ids=("nosuchpod1",)), node="nosuchpod1")
    assert gone.outcome is ActionOutcome.FAILED and "nosuchpod1 not terminated: RunPod: DELETE /pods/nosuchpod1: no such pod" in gone.detail
    assert not any(".node.retired." in s for s, _ in handler._runtime.broker.published)  # a failed ending retires nothing
    fake.silent = True
    slow = await ask(handler, SpawnWorker(gpu_type=H100, gpus=1))
    assert slow.outcome is ActionOutcome.FAILED and "nothing rented: RunPod: POST /pods got no answer in time" in slow.detail
    assert KEY not in gone.detail + slow.detail


async def test_a_rented_node_whose_gpu_kills_did_not_free_has_its_whole_pod_restarted_and_verified(remediator):
    """Runbook 003's last resort, through RunPod's API: the node's pod (its name is the node's id)
    is restarted, and the action succeeds only once RunPod lists it running with a later start."""
    fake, make = remediator
    handler = make()
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=8))
    (pod_id,) = fake.pods
    fake.pods[pod_id].update(name="gpu-node-07", publicIp="203.0.113.7", portMappings={"22": 40022})
    started = fake.pods[pod_id]["lastStartedAt"]
    restarted = await ask(handler, RestartWorker(), node="gpu-node-07")
    assert restarted.outcome is ActionOutcome.SUCCEEDED, restarted.detail
    assert restarted.detail.startswith(f"restarted pod {pod_id}: running again since ")
    assert fake.pods[pod_id]["lastStartedAt"] > started
    assert ("POST", f"/v1/pods/{pod_id}/restart", None) in fake.requests
    async with handler._sessions() as session:
        record = await repository.get_action(session=session, action_id=restarted.action_id)
    assert [a["command"] for a in record.audit][:2] == ["provider: list workers (the node's pod)", "provider: restart the node's pod"]
    assert KEY not in str(record.audit)


async def test_a_restart_the_provider_answers_but_does_not_carry_out_fails_and_a_node_it_does_not_rent_is_a_person(remediator):
    fake, make = remediator
    handler = make()
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=8))
    (pod_id,) = fake.pods
    fake.pods[pod_id].update(publicIp="203.0.113.7", portMappings={"22": 40022})
    fake.restart_ignored = True  # 200 OK, and the pod goes on as it was (runpod-python#450)
    ignored = await ask(handler, RestartWorker(), node=pod_id)
    assert ignored.outcome is ActionOutcome.FAILED
    assert f"pod {pod_id} was asked to restart but is not running again after 1.5s (running, last started " in ignored.detail
    owned = await ask(handler, RestartWorker(), node="gpu-node-01")  # one of your own machines
    assert owned.outcome is ActionOutcome.FAILED
    assert owned.detail == "node gpu-node-01 is no worker RunPod rents (no pod has it as its id or name): a person must restart it"


async def test_the_emergency_stop_ends_every_live_worker_batch_by_batch_through_the_gate_and_requeues_their_tasks(remediator, tmp_path):
    """Runbook 001, "If Workers are Stuck": terminate all workers, and the pool scales up again from
    the queue. A rollout of terminate_worker over the provider's live workers, what each ran requeued."""
    fake, make = remediator
    path = tmp_path / "tasks.db"
    tasks = functools.partial(_task_table, path)
    tasks("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT)")
    inventory = tmp_path / "inventory.yaml"  # the pool's workers, as `gpumedic inventory sync` writes them
    handler = make(task_db=path, inventory=inventory, breaker_max_nodes=10)
    await ask(handler, SpawnWorker(gpu_type=H100, gpus=1, count=4))
    pods = sorted(fake.pods)
    inventory.write_text("nodes:\n" + "".join(f"  {pod}: {{host: 10.0.0.{i}, group: runpod}}\n" for i, pod in enumerate(pods, 1)))
    tasks(f"INSERT INTO tasks VALUES ('t1', 'In Progress', '{pods[1]}'), ('t2', 'In Progress', '{pods[3]}')")
    rollout = Rollout(policy=load_policy(tmp_path / "policy.yaml"), actions=handler, tracer=TracerProvider().get_tracer("test"))

    planned = await rollout.run(RolloutRequest(operation="terminate_worker", workers=("all",), batch=2, dry_run=True))
    assert [s.node_id for s in planned.steps] == pods and {s.status for s in planned.steps} == {"planned"}
    assert sorted(fake.pods) == pods  # a dry run ends nothing

    report = await rollout.run(RolloutRequest(operation="terminate_worker", workers=("all",), batch=2, requested_by="ops-alice"))
    assert report.ok, report.summary()
    assert [(s.batch, s.node_id, s.status) for s in report.steps] == [
        (1, pods[0], "succeeded"), (1, pods[1], "succeeded"), (2, pods[2], "succeeded"), (2, pods[3], "succeeded")]
    assert report.steps[1].detail == f"terminated {pods[1]}; requeued 1 of the 1 task(s) (t1) {pods[1]} was running"
    assert not fake.pods
    assert tasks() == [("t1", "Queued", None), ("t2", "Queued", None)]

    nothing = await rollout.run(RolloutRequest(operation="terminate_worker", workers=("all",)))
    assert nothing.error == "the provider has no live worker" and nothing.steps == ()
    with pytest.raises(ValueError, match="terminate_worker names workers"):
        RolloutRequest(operation="terminate_worker", nodes=("group:runpod",))
