"""autoscaler's queue-driven decision: the demand sources against a real SQLite task table and a
real HTTP server, and the scaling rule on its own clock (bounds, hysteresis, cool-down, idle)."""

from __future__ import annotations

import asyncio
import json
import sqlite3
from datetime import UTC, datetime, timedelta

import pytest
from gpumedic_events import GpuSample, NodeSampled

from autoscaler.demand import Demand, DemandUnavailable, HttpDemand, HttpDemandConfig, SqlDemand, SqlDemandConfig
from autoscaler.lifecycle import TaskRecord, WorkerRecord
from autoscaler.capacity import evaluate_demand
from autoscaler.scaling import NodeLoad, Scaler, ScalingPolicy, Supply

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


# --- the scaling rule ------------------------------------------------------------------------------


def test_a_queue_scales_up_at_once_within_the_bounds():
    scaler = Scaler(ScalingPolicy(min_active_gpus=1, max_active_gpus=16, tasks_per_gpu=3))
    up = scaler.decide(Demand(queued=20, in_progress=4), Supply({"a": 4}), T0)
    assert (up.decision, up.gpus_wanted, up.change_gpus) == ("scale_up", 8, 4)
    capped = scaler.decide(Demand(queued=500, in_progress=0), Supply({"a": 4}), T0)
    assert (capped.gpus_wanted, capped.change_gpus) == (16, 12)  # MAX_ACTIVE_GPUS
    floor = scaler.decide(Demand(queued=0, in_progress=0), Supply({}), T0)
    assert (floor.decision, floor.gpus_wanted) == ("scale_up", 1)  # MIN_ACTIVE_GPUS


def test_scaling_down_waits_out_the_cool_down_and_frees_only_nodes_idle_long_enough():
    scaler = Scaler(ScalingPolicy(max_active_gpus=32, tasks_per_gpu=3, cooldown_s=300, idle_timeout_s=600))
    supply = Supply({"a": 8, "b": 8, "c": 8}, idle_since={"b": at(-900), "c": at(-100)})
    quiet = Demand(queued=0, in_progress=20)  # 7 GPUs wanted, 24 in service
    held = scaler.decide(quiet, supply, T0)
    assert held.decision == "hold" and "waits 300s" in held.reason
    assert scaler.decide(quiet, supply, at(299)).decision == "hold"
    down = scaler.decide(quiet, supply, at(300))
    assert (down.decision, down.release, down.change_gpus) == ("scale_down", ("b",), 8)  # c idled 400s only
    # The decision stands until its action is done (an incident waits for it) ...
    assert scaler.decide(quiet, supply, at(305)).release == ("b",)
    scaler.changed(at(306))
    assert scaler.decide(quiet, supply, at(310)).decision == "hold"  # ... then a change was just made


def test_a_noisy_queue_around_capacity_never_flaps():
    scaler = Scaler(ScalingPolicy(max_active_gpus=32, tasks_per_gpu=3, cooldown_s=300, idle_timeout_s=0))
    supply = Supply({"a": 8, "b": 8}, idle_since={"a": at(-1000), "b": at(-1000)})
    decisions = [
        scaler.decide(Demand(queued=0, in_progress=q), supply, at(60 * i)).decision
        for i, q in enumerate([30, 20, 45, 10, 40, 25, 44, 15] * 3)  # 4..15 GPUs wanted, 16 in service
    ]
    assert set(decisions) == {"hold"}


def test_supply_without_a_whole_spare_node_holds():
    scaler = Scaler(ScalingPolicy(max_active_gpus=32, cooldown_s=0, idle_timeout_s=0))
    decided = scaler.decide(Demand(queued=0, in_progress=36), Supply({"a": 8, "b": 8}, {"a": at(-1), "b": at(-1)}), T0)
    assert decided.decision == "hold"  # 12 wanted, 16 in service: freeing a node of 8 would leave too few


def test_policy_refuses_a_floor_above_the_ceiling():
    with pytest.raises(ValueError, match=r"min_active_gpus \(9\) is above max_active_gpus \(8\)"):
        ScalingPolicy(min_active_gpus=9, max_active_gpus=8)


# --- the decision published ------------------------------------------------------------------------


def _sample(node: str, utils: list[int], when: datetime = T0) -> NodeLoad:
    gpus = tuple(GpuSample(index=i, utilization_gpu_pct=u) for i, u in enumerate(utils))
    return NodeLoad.of(NodeSampled(source="node-sampler", node_id=node, occurred_at=when, interval_s=5, gpus=gpus))


def test_an_unreadable_queue_holds_and_says_why_while_a_readable_one_decides_on_nodes_in_service():
    latest = {"a": _sample("a", [90, 95]), "b": _sample("b", [0, 0])}
    kw = {"busy_util_pct": 20, "stale_after_s": 120}
    down = evaluate_demand(DemandUnavailable("sql task database on db1: OperationalError: refused"), Scaler(ScalingPolicy()), latest, T0, **kw)
    assert (down.decision, down.queued, down.demand_error) == ("hold", None, "sql task database on db1: OperationalError: refused")
    assert down.reason.startswith("no decision: sql task database on db1")
    up = evaluate_demand(Demand(queued=9, in_progress=3), Scaler(ScalingPolicy()), latest, T0, drained=frozenset({"b"}), **kw)
    assert (up.decision, up.gpus_total, up.gpus_wanted, up.change_gpus, up.nodes_drained) == ("scale_up", 2, 4, 2, 1)


# --- the sources -----------------------------------------------------------------------------------


def _task_db(tmp_path, rows: list[tuple[str, int]]) -> SqlDemandConfig:
    db = tmp_path / "tasks.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, status TEXT)")
        conn.executemany("INSERT INTO tasks (status) VALUES (?)", [(status,) for status, n in rows for _ in range(n)])
    url_file = tmp_path / "task-db-url"
    url_file.write_text(f"sqlite:///{db}\n")
    return SqlDemandConfig(kind="sql", url_file=url_file)


async def test_the_runbook_task_table_is_read_by_status(tmp_path):
    source = SqlDemand(_task_db(tmp_path, [("Queued", 7), ("In Progress", 3), ("Complete", 50), ("Failed", 2)]))
    try:
        assert await source.read() == Demand(queued=7, in_progress=3, complete=50)
    finally:
        await source.close()


async def test_the_worker_records_and_the_tasks_in_progress_are_read_for_the_worker_checks(tmp_path):
    config = _task_db(tmp_path, [("In Progress", 2)])
    with sqlite3.connect(tmp_path / "tasks.db") as conn:
        conn.execute("ALTER TABLE tasks ADD COLUMN worker_id TEXT")
        conn.execute("UPDATE tasks SET worker_id = 'pod-7' WHERE id = 1")
        conn.execute("CREATE TABLE workers (id TEXT, status TEXT, heartbeat_at TEXT)")
        conn.execute("INSERT INTO workers VALUES ('pod-7', 'active', '2026-11-23 11:50:00'), ('pod-8', 'spawning', NULL)")
    queries = {"workers_query": "SELECT id, status, heartbeat_at FROM workers ORDER BY id",
               "in_progress_query": "SELECT id, worker_id FROM tasks WHERE status = 'In Progress' ORDER BY id"}
    source = SqlDemand(config.model_copy(update=queries))
    hostile = SqlDemand(config.model_copy(update=queries | {"workers_query": "SELECT 'pod;reboot', 'active', NULL"}))
    try:
        workers, tasks = await source.records()
        assert workers == [WorkerRecord("pod-7", "active", datetime(2026, 11, 23, 11, 50, tzinfo=UTC)), WorkerRecord("pod-8", "spawning", None)]
        assert tasks == [TaskRecord("1", "pod-7"), TaskRecord("2", None)]
        with pytest.raises(DemandUnavailable, match=r"workers row 1 is not \(worker_id, status, heartbeat_at\): \('pod;reboot'"):
            await hostile.records()
        assert await SqlDemand(config).records() is None  # no queries: the provider's own check only
    finally:
        await source.close()
        await hostile.close()


async def test_a_task_table_that_cannot_be_read_says_what_and_where(tmp_path):
    config = _task_db(tmp_path, [])
    missing = SqlDemand(config.model_copy(update={"query": "SELECT status, COUNT(*) FROM jobs GROUP BY status"}))
    with pytest.raises(DemandUnavailable, match="no such table: jobs"):
        await missing.read()
    await missing.close()
    odd = SqlDemand(config.model_copy(update={"query": "SELECT 'Queued', -4"}))
    with pytest.raises(DemandUnavailable, match=r"row 1 is not \(status, count\)"):
        await odd.read()
    await odd.close()
    url_file = tmp_path / "pg-url"
    url_file.write_text("postgresql://orchestrator:s3cret-pass@127.0.0.1:1/tasks")
    refused = SqlDemand(SqlDemandConfig(kind="sql", url_file=url_file, timeout_s=2))
    with pytest.raises(DemandUnavailable) as caught:
        await refused.read()
    assert "sql task database on 127.0.0.1" in str(caught.value) and "s3cret" not in str(caught.value)
    await refused.close()
    with pytest.raises(ValueError, match="demand url_file .*nope: No such file"):
        SqlDemand(SqlDemandConfig(kind="sql", url_file=tmp_path / "nope"))


async def _serve(answers: dict[str, tuple[int, bytes]]):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = await reader.readuntil(b"\r\n\r\n")
        path = head.split()[1].decode()
        status, body = answers.get(path, (404, b"{}"))
        if status == 0:  # never answers
            await asyncio.sleep(30)
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (status, len(body), body))
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"


async def test_an_http_demand_endpoint_is_read_by_path_and_every_bad_answer_is_named():
    server, base = await _serve({
        "/ok": (200, json.dumps({"queue": {"depth": 12, "running": 4}}).encode()),
        "/html": (200, b"<html>"),
        "/neg": (200, b'{"queue": {"depth": -1}}'),
        "/str": (200, b'{"queue": {"depth": "12"}}'),
        "/down": (503, b"{}"),
        "/slow": (0, b""),
    })
    try:
        def source(path: str) -> HttpDemand:
            # patient with the answers (a loaded machine can take over 0.5 s); short only where none comes
            return HttpDemand(HttpDemandConfig(kind="http", url=base + path, queued_path="queue.depth",
                                               in_progress_path="queue.running", timeout_s=0.5 if path == "/slow" else 10.0))

        assert await source("/ok").read() == Demand(queued=12, in_progress=4)
        for path, problem in [("/html", "not JSON"), ("/neg", "queue.depth is -1, not a count"), ("/str", "queue.depth is '12'"),
                              ("/down", "answered HTTP 503"), ("/slow", "no answer within 0.5s"), ("/missing", "HTTP 404")]:
            with pytest.raises(DemandUnavailable, match=problem):
                await source(path).read()
        no_path = HttpDemand(HttpDemandConfig(kind="http", url=base + "/ok", queued_path="queue.length"))
        with pytest.raises(DemandUnavailable, match="no 'queue.length' in the answer"):
            await no_path.read()
    finally:
        server.close()


async def test_a_jetstream_work_queue_gives_its_pending_and_unacknowledged_counts(nats_url):
    import uuid

    import nats as nats_client
    from nats.js.api import ConsumerConfig, RetentionPolicy

    from autoscaler.demand import JetStreamDemand, JetStreamDemandConfig

    stream = f"TASKS_{uuid.uuid4().hex[:8]}"
    nc = await nats_client.connect(nats_url)
    js = nc.jetstream()
    await js.add_stream(name=stream, subjects=[f"{stream}.>"], retention=RetentionPolicy.WORK_QUEUE)
    await js.add_consumer(stream, ConsumerConfig(durable_name="workers", ack_wait=60))
    source = JetStreamDemand(JetStreamDemandConfig(kind="jetstream", url=nats_url, stream=stream, consumer="workers"))
    missing = JetStreamDemand(JetStreamDemandConfig(kind="jetstream", url=nats_url, stream=stream, consumer="nobody"))
    down = JetStreamDemand(JetStreamDemandConfig(kind="jetstream", url="nats://127.0.0.1:9", stream=stream, consumer="workers", timeout_s=1))
    try:
        for i in range(5):
            await js.publish(f"{stream}.task", f"task {i}".encode())
        taken = await js.pull_subscribe_bind("workers", stream)
        assert len(await taken.fetch(2, timeout=2)) == 2  # two workers took a task each and work on it
        assert await source.read() == Demand(queued=3, in_progress=2)
        with pytest.raises(DemandUnavailable, match=rf"JetStream consumer {stream}/nobody: no such stream or consumer"):
            await missing.read()
        with pytest.raises(DemandUnavailable, match=rf"JetStream consumer {stream}/workers: unreachable"):
            await down.read()
    finally:
        await source.close()
        await missing.close()
        await js.delete_stream(stream)
        await nc.close()
