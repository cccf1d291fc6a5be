"""The orchestrator runbook's worker checks over what the provider and the user's database report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.lifecycle import LifecyclePolicy, TaskRecord, WorkerRecord, watch
from gpumedic_providers.base import SshDetails, Worker

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _worker(worker_id: str, status: str, age_s: float, ssh: bool = True) -> Worker:
    return Worker(worker_id=worker_id, status=status, gpu_type="H100", gpus=1, price_per_h=2.49,
                  ssh=SshDetails(host="10.0.0.1", port=22) if ssh else None, created_at=T0 - timedelta(seconds=age_s))


def test_the_runbook_worker_checks_each_name_their_fix():
    workers = [
        _worker("stuck", "spawning", 400, ssh=False),
        _worker("young", "spawning", 100, ssh=False),
        _worker("silent", "running", 3600),
        _worker("fine", "running", 3600),
        _worker("unknown", "running", 900),
    ]
    records = [
        WorkerRecord("silent", "active", T0 - timedelta(minutes=11)),
        WorkerRecord("fine", "active", T0 - timedelta(seconds=30)),
        WorkerRecord("gone", "active", T0 - timedelta(minutes=1)),
        WorkerRecord("ended", "terminated", None),
    ]
    tasks = [TaskRecord("t1", "gone"), TaskRecord("t2", "gone"), TaskRecord("t3", "fine"), TaskRecord("t4", "ended"), TaskRecord("t5", "ended")]
    found = {(f.kind, f.worker_id): f for f in watch(workers, records, tasks, T0, LifecyclePolicy(), requeued={"t5"})}
    assert {k: f.fix for k, f in found.items()} == {
        ("stuck_spawning", "stuck"): "terminate_and_replace",
        ("stale_heartbeat", "silent"): "check_then_replace",
        ("unrecorded_worker", "unknown"): "terminate",
        ("vanished_worker", "gone"): "mark_terminated",
        ("orphaned_tasks", "gone"): "requeue",
        ("orphaned_tasks", "ended"): "requeue",
    }
    assert found[("orphaned_tasks", "gone")].tasks == ("t1", "t2")
    assert found[("orphaned_tasks", "ended")].tasks == ("t4",)  # t5 was requeued once already
    assert "spawning for 6m40s" in found[("stuck_spawning", "stuck")].summary
    assert "last heartbeat 11m00s ago" in found[("stale_heartbeat", "silent")].summary
