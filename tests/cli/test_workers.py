"""`gpumedic workers`: runbook 001's table from the autoscaler's latest round, as report-builder kept it."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta

from gpumedic.workers import workers_text
from gpumedic_events import CapacityEvaluated, WorkerRow
from gpumedic_store import create_engine, session_factory, upgrade
from report_builder import repository

NOW = datetime(2026, 11, 28, 14, 0, tzinfo=UTC)


def _round(at: datetime, rows: tuple[WorkerRow, ...], **fields) -> CapacityEvaluated:
    return CapacityEvaluated(source="autoscaler", occurred_at=at, nodes_seen=len(rows), gpus_total=1, gpus_busy=1, decision="hold",
                             reason="steady", worker_rows=rows, **fields)


async def test_the_latest_rounds_workers_are_listed_with_their_heartbeat_host_price_and_task(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(url)
    assert "no capacity round recorded" in await workers_text(url)  # a store with no round says so
    engine = create_engine(url)
    old = WorkerRow(worker_id="pod-gone", status="running", in_service=True)
    rows = (
        WorkerRow(worker_id="pod-a", status="running", record_status="active", heartbeat_age_s=5400.0, host="203.0.113.7:22041",
                  gpu_type="H100", gpus=1, price_per_h=2.49, task="task-77", in_service=True),
        WorkerRow(worker_id="pod-b", status="spawning", gpu_type="H100", gpus=2, price_per_h=4.98, in_service=False),
    )
    async with session_factory(engine)() as session:
        await repository.record_capacity_check(session, event=_round(NOW - timedelta(minutes=5), (old,)))
        await repository.record_capacity_check(session, event=_round(NOW, rows, provider_error=None))
        await session.commit()
    await engine.dispose()
    text = await workers_text(url)
    assert text.startswith("as of the autoscaler's round at 2026-11-28 14:00:00.000Z")
    assert "pod-gone" not in text  # an older round's
    a = next(line for line in text.splitlines() if line.startswith("pod-a"))
    assert a.split() == ["pod-a", "running", "active", "1.5h", "203.0.113.7:22041", "1x", "H100", "2.49", "task-77", "yes"]
    b = next(line for line in text.splitlines() if line.startswith("pod-b"))
    assert b.split() == ["pod-b", "spawning", "-", "-", "-", "2x", "H100", "4.98", "-", "no"]
    assert text.splitlines()[-1] == "2 worker(s), 1 in service, $7.47/h"
    assert [r["worker_id"] for r in json.loads(await workers_text(url, status="spawning", as_json=True))["workers"]] == ["pod-b"]
    assert (await workers_text(url, status="stopped")).endswith(": no worker stopped")
