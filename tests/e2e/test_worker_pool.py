"""The orchestrator runbook done by gpumedic, end to end: the autoscaler reads a real SQLite task
database and a local server that speaks RunPod's REST API, and the real remediator, through its
gate, rents workers for a backlog, ends a worker stuck spawning, requeues the tasks a vanished
worker left In Progress (once) and marks its record ended; every incident resolves fixed."""

from __future__ import annotations

import asyncio
import json
import sqlite3

import nats

from autoscaler.main import create_app as autoscaler_app
from autoscaler.settings import Settings as AutoscalerSettings
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import dump_policy
from remediator.main import create_app as remediator_app
from tests.e2e.test_thin_path import remediator_settings
from tests.fixtures.runpod import KEY

H100 = "NVIDIA H100 80GB HBM3"
INTERVAL_S = 0.5


def _task_db(path) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT)")
        conn.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, status TEXT NOT NULL, heartbeat_at TEXT)")
        conn.executemany("INSERT INTO tasks VALUES (?, ?, ?)", [
            *((f"q{i}", "Queued", None) for i in range(4)), ("r1", "In Progress", "podgone"), ("r2", "In Progress", "podgone"),
        ])
        conn.execute("INSERT INTO workers VALUES ('podgone', 'active', '2026-11-23 11:00:00')")


async def test_the_pool_rents_for_a_backlog_ends_a_stuck_worker_and_requeues_orphans_once(
    nats_settings, store_url, apps, tmp_path, runpod_api
):
    fake, base = runpod_api
    fake.pods["podstuck"] = {"id": "podstuck", "name": "old", "desiredStatus": "RUNNING", "costPerHr": 2.99, "publicIp": None,
                             "portMappings": {}, "gpu": {"id": H100, "count": 1}, "lastStartedAt": "2026-11-23T00:00:00.000Z"}
    _task_db(tmp_path / "tasks.db")
    (tmp_path / "task-db-url").write_text(f"sqlite:///{tmp_path / 'tasks.db'}\n")
    (tmp_path / "runpod-key").write_text(KEY + "\n")
    policy = Policy.model_validate({
        "fleet": {"hold_s": 0.5},
        "actions": {
            "spawn_worker": {"gpu_types": [H100]},
            "requeue_tasks": {"statement": "UPDATE tasks SET status = 'Queued', worker_id = NULL WHERE id IN :task_ids AND status = 'In Progress'"},
            "mark_worker_ended": {"statement": "UPDATE workers SET status = 'terminated' WHERE id = :worker_id"},
        },
    })
    dump_policy(policy, tmp_path / "policy.yaml")
    provider = {"kind": "runpod", "api_key_file": str(tmp_path / "runpod-key"), "image": "ghcr.io/acme/worker:1", "base_url": base,
                "timeout_s": 2}
    fleet = SimFleet(1, 1, tmp_path / "fleet", jobs_per_gpu=0)
    await fleet.start()
    base_settings = remediator_settings(nats_settings, store_url, fleet)
    remediator = type(base_settings)(**{**base_settings.model_dump(exclude={"policy"}), "policy": {"file": tmp_path / "policy.yaml"},
                                        "provider": provider, "task_db_url_file": tmp_path / "task-db-url"})
    autoscaler = AutoscalerSettings(
        nats=nats_settings, interval_s=INTERVAL_S, provider=provider,
        demand={"kind": "sql", "url_file": str(tmp_path / "task-db-url"),
                "workers_query": "SELECT id, status, heartbeat_at FROM workers",
                "in_progress_query": "SELECT id, worker_id FROM tasks WHERE status = 'In Progress'"},
        scaling={"max_active_gpus": 4, "tasks_per_gpu": 3, "gpu_type": H100, "gpus_per_worker": 1},
    )
    seen: list[tuple[str, dict]] = []
    nc = await nats.connect(nats_settings.url)

    async def keep(msg) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("gpumedic.v1.>", cb=keep)
    try:
        await apps.start(remediator_app(remediator))
        await apps.start(autoscaler_app(autoscaler, policy=policy))
        wanted = {"capacity_short", "stuck_spawning", "orphaned_tasks", "vanished_worker"}
        for _ in range(200):
            if wanted <= {e["kind"] for e in _resolved(seen)}:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(3 * INTERVAL_S)  # a few more rounds: nothing is asked twice
    finally:
        await apps.stop_all()
        await nc.close()
        await fleet.stop()

    resolved = {e["kind"]: e["resolution"] for e in _resolved(seen)}
    assert resolved == dict.fromkeys(wanted, "fixed"), [(s, e.get("summary") or e.get("reason")) for s, e in seen if ".incident." in s]
    asked = [e for s, e in seen if ".action.requested." in s]
    assert sorted(e["operation"]["operation"] for e in asked) == ["mark_worker_ended", "requeue_tasks", "spawn_worker", "terminate_worker"]
    done = [e for s, e in seen if ".action.completed." in s]
    assert all(e["outcome"] == "succeeded" for e in done), [e["detail"] for e in done]
    # 6 tasks at 3 per GPU: 2 GPUs; the stuck one was no capacity, so two were rented.
    assert [m for m, p, _ in fake.requests if m == "POST"] == ["POST", "POST"] and "podstuck" not in fake.pods
    with sqlite3.connect(tmp_path / "tasks.db") as conn:
        assert conn.execute("SELECT id, status, worker_id FROM tasks WHERE id LIKE 'r%' ORDER BY id").fetchall() == [
            ("r1", "Queued", None), ("r2", "Queued", None)
        ]
        assert conn.execute("SELECT status FROM workers").fetchall() == [("terminated",)]
    evaluated = [e for s, e in seen if ".capacity.evaluated" in s]
    assert evaluated[-1]["workers"] == 2 and evaluated[-1]["cost_per_h"] == 5.98 and evaluated[-1]["decision"] == "hold"


def _resolved(seen: list) -> list[dict]:
    opened = {e["incident_id"]: e for s, e in seen if ".incident.opened." in s}
    return [opened[e["incident_id"]] | {"resolution": e["resolution"]} for s, e in seen
            if ".incident.resolved." in s and e["incident_id"] in opened]
