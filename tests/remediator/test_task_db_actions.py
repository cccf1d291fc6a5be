"""requeue_tasks and mark_worker_ended through the whole action handler: the gate, the policy's own
statements with bound parameters, on a real task database (SQLite and PostgreSQL)."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import text
from sqlalchemy.ext.asyncio import create_async_engine

from gpumedic_bus import Delivery
from gpumedic_events import ActionCompleted, ActionOutcome, ActionRequested, IncidentKind, MarkWorkerEnded, NodeRetired, RequeueTasks
from gpumedic_incidents.policy import Actions, MarkEndedPolicy, Policy, PolicyError, RequeuePolicy, dump_policy, load_policy
from gpumedic_incidents.state import fingerprint
from gpumedic_store import create_engine, session_factory
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator import repository
from remediator.handlers import ActionHandler
from remediator.main import executor_of, gate_of, task_db_of
from tests.fixtures.postgres import create_database, drop_database
from tests.remediator.conftest import incident_waiting_for

REQUEUE = "UPDATE tasks SET status = 'Queued', worker_id = NULL WHERE id IN :task_ids AND status = 'In Progress'"
MARK = "UPDATE workers SET status = 'terminated' WHERE id = :worker_id AND status <> 'terminated'"
SCHEMA = (
    "CREATE TABLE tasks (id VARCHAR(40) PRIMARY KEY, status VARCHAR(20) NOT NULL, worker_id VARCHAR(64))",
    "CREATE TABLE workers (id VARCHAR(64) PRIMARY KEY, status VARCHAR(20) NOT NULL)",
    "INSERT INTO tasks VALUES ('t1', 'In Progress', 'w-dead'), ('t2', 'In Progress', 'w-dead'), ('t3', 'Complete', 'w-dead'), "
    "('t4', 'In Progress', 'w-live')",
    "INSERT INTO workers VALUES ('w-dead', 'running'), ('w-live', 'running')",
)


class _Broker:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes]] = []

    async def publish(self, data, subject, *, headers=None, stream=None, timeout=None):
        self.published.append((subject, data))


@pytest.fixture(params=["sqlite", "postgresql"])
async def task_db(request, tmp_path):
    if request.param == "sqlite":
        url = f"sqlite+aiosqlite:///{tmp_path / 'tasks.db'}"
    else:  # a database of its own on the session's server (an async fixture cannot be asked for here)
        server = request.getfixturevalue("postgres_url")
        url = await create_database(server, "tasks")
    engine = create_async_engine(url)
    async with engine.begin() as conn:
        for statement in SCHEMA:
            await conn.execute(text(statement))
    (tmp_path / "task-db-url").write_text(url + "\n")
    yield engine, tmp_path / "task-db-url"
    await engine.dispose()
    if request.param == "postgresql":
        await drop_database(server, url)


@pytest.fixture
async def make_handler(make_settings, incidents, tmp_path, task_db):
    made = []

    def _make(*, requeue: str | None = REQUEUE, mark: str | None = MARK, configured: bool = True) -> ActionHandler:
        policy_file = tmp_path / "policy.yaml"
        dump_policy(Policy(actions=Actions(requeue_tasks=RequeuePolicy(statement=requeue), mark_worker_ended=MarkEndedPolicy(statement=mark))), policy_file)
        settings = make_settings(policy={"file": policy_file}, task_db_url_file=task_db[1] if configured else None)
        engine = create_engine(settings.store.url)
        handler = ActionHandler(
            settings=settings, gate=gate_of(settings, settings.policy.load()), runtime=SimpleNamespace(broker=_Broker(), metrics=ServiceMetrics("remediator")), sessions=session_factory(engine),
            executor=executor_of(settings), tracer=TracerProvider().get_tracer("test"), incidents=incidents, task_db=task_db_of(settings),
        )
        made.append((engine, handler))
        return handler

    yield _make
    for engine, handler in made:
        if handler.task_db is not None:
            await handler.task_db.close()
        await engine.dispose()


async def ask(handler: ActionHandler, operation, node: str, kind: IncidentKind) -> ActionCompleted:
    request = ActionRequested(
        source="autoscaler", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=node, attempt=1,
        operation=operation, reason="the worker is gone", fingerprint=fingerprint(node, kind, None, None),
    )
    await handler.incidents.save(incident_waiting_for(request, kind=kind, detector="autoscaler"))
    await handler.handle(request, Delivery(request.subject, {}, 1))
    subject, data = handler._runtime.broker.published[-1]
    return ActionCompleted.from_json(data, subject=subject)


async def _rows(engine, query: str) -> list[tuple]:
    async with engine.connect() as conn:
        return [tuple(r) for r in (await conn.execute(text(query))).all()]


async def test_orphaned_tasks_are_requeued_once_and_a_gone_worker_marked_ended(make_handler, task_db):
    engine, _ = task_db
    handler = make_handler()
    # t3 finished and t4 runs on a live worker: neither is named; "t1; DROP TABLE tasks" is refused by the event itself.
    done = await ask(handler, RequeueTasks(task_ids=("t1", "t2")), "w-dead", IncidentKind.ORPHANED_TASKS)
    assert (done.outcome, done.detail) == (ActionOutcome.SUCCEEDED, "requeued 2 of 2 task(s)")
    assert await _rows(engine, "SELECT id, status, worker_id FROM tasks ORDER BY id") == [
        ("t1", "Queued", None), ("t2", "Queued", None), ("t3", "Complete", "w-dead"), ("t4", "In Progress", "w-live"),
    ]
    # Asked again (a second incident, a replayed decision): the status guard changes nothing.
    again = await ask(handler, RequeueTasks(task_ids=("t1", "t2")), "w-dead", IncidentKind.ORPHANED_TASKS)
    assert again.outcome is ActionOutcome.SUCCEEDED and "requeued 0 of 2 task(s); 2 were no longer In Progress" in again.detail
    marked = await ask(handler, MarkWorkerEnded(worker_id="w-dead"), "w-dead", IncidentKind.VANISHED_WORKER)
    assert (marked.outcome, marked.detail) == (ActionOutcome.SUCCEEDED, "marked w-dead ended (1 record(s) changed)")
    assert await _rows(engine, "SELECT id, status FROM workers ORDER BY id") == [("w-dead", "terminated"), ("w-live", "running")]
    subject, data = handler._runtime.broker.published[-2]  # its record closed, the vanished worker is retired
    assert ".node.retired." in subject and NodeRetired.from_json(data, subject=subject).node_id == "w-dead"
    async with handler._sessions() as session:
        record = await repository.get_action(session=session, action_id=done.action_id)
    assert [a["command"] for a in record.audit] == ["task database: actions.requeue_tasks.statement with 2 task id(s)"]


async def test_without_a_statement_or_a_database_nothing_is_written_and_the_result_says_why(make_handler, task_db, tmp_path):
    engine, _ = task_db
    unset = await ask(make_handler(requeue=None), RequeueTasks(task_ids=("t1",)), "w-dead", IncidentKind.ORPHANED_TASKS)
    assert unset.outcome is ActionOutcome.BLOCKED and "actions.requeue_tasks.statement is not set, so it never runs" in unset.detail
    nowhere = await ask(make_handler(configured=False), RequeueTasks(task_ids=("t1",)), "w-dead", IncidentKind.ORPHANED_TASKS)
    assert nowhere.outcome is ActionOutcome.FAILED and "no task database is configured (GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE)" in nowhere.detail
    broken = await ask(make_handler(requeue=REQUEUE.replace("tasks", "no_such_table")), RequeueTasks(task_ids=("t1",)), "w-dead",
                       IncidentKind.ORPHANED_TASKS)
    assert broken.outcome is ActionOutcome.FAILED and "task database on" in broken.detail and "no_such_table" in broken.detail
    assert await _rows(engine, "SELECT status FROM tasks WHERE id = 't1'") == [("In Progress",)]


def test_a_statement_must_bind_its_one_parameter_rather_than_format_it(tmp_path):
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\nactions:\n  requeue_tasks:\n    statement: \"UPDATE tasks SET status = 'Queued' WHERE id = '{task}'\"\n")
    with pytest.raises(PolicyError, match=r"policy.yaml:4: actions.requeue_tasks: .*exactly one bound parameter, :task_ids"):
        load_policy(bad)
