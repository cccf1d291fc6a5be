"""The orchestrator runbook's worker checks over what the provider and the user's database report."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.lifecycle import TaskRecord, WorkerRecord, watch
from gpumedic_events import IncidentKind, MarkWorkerEnded, RequeueTasks, TerminateWorker
from gpumedic_incidents import Policy
from gpumedic_providers.base import SshDetails, Worker

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
K = IncidentKind


def _worker(worker_id: str, status: str, age_s: float, ssh: bool = True) -> Worker:
    return Worker(worker_id=worker_id, status=status, gpu_type="H100", gpus=1, price_per_h=2.49,
                  ssh=SshDetails(host="10.0.0.1", port=22) if ssh else None, created_at=T0 - timedelta(seconds=age_s))


WORKERS = [
    _worker("stuck", "spawning", 400, ssh=False),
    _worker("young", "spawning", 100, ssh=False),
    _worker("silent", "running", 3600),
    _worker("busy", "running", 3600),
    _worker("fine", "running", 3600),
    _worker("unknown", "running", 900),
    _worker("newcomer", "running", 60),
]
RECORDS = [
    WorkerRecord("silent", "active", T0 - timedelta(minutes=11)),
    WorkerRecord("busy", "active", T0 - timedelta(minutes=30)),
    WorkerRecord("fine", "active", T0 - timedelta(seconds=30)),
    WorkerRecord("gone", "active", T0 - timedelta(minutes=1)),
    WorkerRecord("lost", "active", T0 - timedelta(minutes=1)),
    WorkerRecord("ended", "terminated", None),
]
TASKS = [TaskRecord("t1", "gone"), TaskRecord("t2", "gone"), TaskRecord("t3", "fine"), TaskRecord("t4", "ended"), TaskRecord("t5", None)]


def _working(worker_id: str) -> str:
    return "its 1 GPU is 97% busy in a sample 20s old" if worker_id == "busy" else ""


def test_the_runbook_worker_checks_each_propose_their_fix():
    found = {(f.kind, f.node_id): f for f in watch(WORKERS, (RECORDS, TASKS), T0, Policy(), gpus_working=_working)}
    assert {k: tuple(f.operations.values()) for k, f in found.items()} == {
        (K.STUCK_SPAWNING, "stuck"): (TerminateWorker(worker_ids=("stuck",)),),
        (K.STALE_HEARTBEAT, "silent"): (TerminateWorker(worker_ids=("silent",)),),
        (K.STALE_HEARTBEAT, "busy"): (TerminateWorker(worker_ids=("busy",)),),
        (K.UNRECORDED_WORKER, "unknown"): (TerminateWorker(worker_ids=("unknown",)),),  # "newcomer" is within its grace
        (K.VANISHED_WORKER, "lost"): (MarkWorkerEnded(worker_id="lost"),),  # "gone" is marked once its tasks are requeued
        (K.ORPHANED_TASKS, "gone"): (RequeueTasks(task_ids=("t1", "t2")),),
        (K.ORPHANED_TASKS, "ended"): (RequeueTasks(task_ids=("t4",)),),  # t5 is on no worker: the queue's business
    }
    assert "spawning for 6m40s: no SSH details yet" in found[(K.STUCK_SPAWNING, "stuck")].summary
    assert "last heartbeat 11m00s ago" in found[(K.STALE_HEARTBEAT, "silent")].summary
    # The check before replacing: a worker whose GPUs still work is not ended on a stale heartbeat.
    assert found[(K.STALE_HEARTBEAT, "silent")].unsafe == ""
    assert "checked first: its 1 GPU is 97% busy" in found[(K.STALE_HEARTBEAT, "busy")].unsafe


def test_without_the_database_only_the_providers_own_check_runs_and_thresholds_come_from_the_policy():
    assert [(f.kind, f.node_id) for f in watch(WORKERS, None, T0, Policy(), gpus_working=_working)] == [(K.STUCK_SPAWNING, "stuck")]
    patient = Policy.model_validate({"kinds": {"stuck_spawning": {"after_s": 600}, "stale_heartbeat": {"after_s": 3600}}})
    kinds = {f.kind for f in watch(WORKERS, (RECORDS, TASKS), T0, patient, gpus_working=_working)}
    assert K.STUCK_SPAWNING not in kinds and K.STALE_HEARTBEAT not in kinds
