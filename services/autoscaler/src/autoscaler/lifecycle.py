"""The orchestrator runbook's worker checks, as rules over what the provider and the user's
database say. Pure: plain records in, the faults found now out, each with the operation that
fixes it (the incident's ladder asks the remediator for it). Thresholds come from the policy.

- `stuck_spawning`: the provider has had the worker `spawning` longer than `after_s` (5 min):
  end it. A stuck worker is no capacity, so the pool rents a replacement meanwhile.
- `stale_heartbeat`: a running worker whose heartbeat in the database is older than `after_s`
  (10 min), or that never beat since it came up. Checked first: a worker whose GPUs still work
  (fresh samples, busy) has a broken heartbeat writer, not a dead worker, and goes to a person.
  Otherwise it is ended (and replaced, as it is no capacity).
- `orphaned_tasks`: tasks `In Progress` on a worker the provider no longer runs: requeued. Once
  they are back in the queue the finding is gone, and the requeue statement only touches tasks
  still in progress, so a task is requeued once per orphaning.
- `unrecorded_worker`: the provider bills a running worker the database has no record of, past
  `after_s`: ended (it runs no task anyone tracks).
- `vanished_worker`: the database holds an active record of a worker the provider no longer has:
  marked ended, once no task is left In Progress on it (requeued first).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from gpumedic_events import IncidentKind, MarkWorkerEnded, RequeueTasks, TerminateWorker
from gpumedic_incidents import Finding, Policy
from gpumedic_providers.base import Worker

LIVE = ("spawning", "running")
ENDED_RECORDS = frozenset({"terminated", "dead", "stopped", "ended"})
KINDS = (
    IncidentKind.STUCK_SPAWNING, IncidentKind.STALE_HEARTBEAT, IncidentKind.ORPHANED_TASKS,
    IncidentKind.UNRECORDED_WORKER, IncidentKind.VANISHED_WORKER,
)
MAX_TASKS = 500
"""Tasks one requeue names (the operation's limit); more are requeued by the next incident."""


@dataclass(frozen=True)
class WorkerRecord:
    """The user's database row for a worker."""

    worker_id: str
    status: str
    heartbeat_at: datetime | None = None


@dataclass(frozen=True)
class TaskRecord:
    """A task the database has `In Progress`, and the worker it is on."""

    task_id: str
    worker_id: str | None


def stuck(worker: Worker, now: datetime, policy: Policy) -> bool:
    return worker.status == "spawning" and _age(worker, now) > timedelta(seconds=policy.kinds.stuck_spawning.after_s)


def watch(
    workers: Sequence[Worker],
    records: tuple[Sequence[WorkerRecord], Sequence[TaskRecord]] | None,
    now: datetime,
    policy: Policy,
    *,
    gpus_working: Callable[[str], str],
    provider: str = "",
) -> list[Finding]:
    """The faults present now. `records` None: the database was not read, so only the provider's
    own check runs. `gpus_working(worker_id)` says why its GPUs look at work ('' if they do not).
    `provider` names who rents the workers out, in the evidence (what their cost is summed by)."""
    live = {w.worker_id: w for w in workers if w.status in LIVE}
    findings = [_stuck(w, now, provider) for w in live.values() if stuck(w, now, policy)]
    if records is None:
        return findings
    worker_records, in_progress = records
    recorded = {r.worker_id: r for r in worker_records}
    stale = timedelta(seconds=policy.kinds.stale_heartbeat.after_s)
    grace = timedelta(seconds=policy.kinds.unrecorded_worker.after_s)
    for w in live.values():
        if w.status != "running":
            continue
        record = recorded.get(w.worker_id)
        if record is None:
            if _age(w, now) > grace:
                findings.append(Finding(
                    kind=IncidentKind.UNRECORDED_WORKER, node_id=w.worker_id,
                    summary=f"{w.worker_id} runs and bills ${w.price_per_h:.2f}/h, but the task database has no record of it",
                    evidence=worker_evidence(w, now, provider), operations={"terminate_worker": TerminateWorker(worker_ids=(w.worker_id,))},
                    recommended_action="end it: it runs no task anyone tracks",
                ))
            continue
        silent = now - record.heartbeat_at if record.heartbeat_at else _age(w, now)
        if silent > stale:
            said = f"last heartbeat {span(silent)} ago" if record.heartbeat_at else f"no heartbeat in the {span(silent)} since it came up"
            working = gpus_working(w.worker_id)
            findings.append(Finding(
                kind=IncidentKind.STALE_HEARTBEAT, node_id=w.worker_id,
                summary=f"{w.worker_id} is running but its {said} (more than {span(stale)})",
                evidence={**worker_evidence(w, now, provider), "heartbeat_age_s": int(silent.total_seconds())},
                operations={"terminate_worker": TerminateWorker(worker_ids=(w.worker_id,))},
                unsafe=f"checked first: {working}; the heartbeat writer may be what failed, not the worker" if working else "",
                recommended_action="end and replace it" if not working else "look at the worker's heartbeat writer",
            ))
    orphans: dict[str, list[str]] = {}
    for t in in_progress:
        if t.worker_id is None or t.worker_id not in live:
            orphans.setdefault(t.worker_id or "", []).append(t.task_id)
    for r in worker_records:
        # Its tasks are requeued first; then the record is marked ended (one action on a worker at a time).
        if r.worker_id not in live and r.status.lower() not in ENDED_RECORDS and r.worker_id not in orphans:
            findings.append(Finding(
                kind=IncidentKind.VANISHED_WORKER, node_id=r.worker_id,
                summary=f"the task database has {r.worker_id} as {r.status!r}, but the provider no longer runs it",
                operations={"mark_worker_ended": MarkWorkerEnded(worker_id=r.worker_id)},
            ))
    for worker_id, tasks in sorted(orphans.items()):
        if not worker_id:
            continue  # a task In Progress on no worker is the queue's own business
        tasks = sorted(tasks)[:MAX_TASKS]
        findings.append(Finding(
            kind=IncidentKind.ORPHANED_TASKS, node_id=worker_id,
            summary=f"{len(tasks)} task(s) In Progress on {worker_id}, which the provider no longer runs",
            evidence={"tasks": len(tasks), "first_tasks": ", ".join(tasks[:10])},
            operations={"requeue_tasks": RequeueTasks(task_ids=tuple(tasks))},
            recommended_action="requeue them",
        ))
    return findings


def _stuck(w: Worker, now: datetime, provider: str) -> Finding:
    return Finding(
        kind=IncidentKind.STUCK_SPAWNING, node_id=w.worker_id,
        summary=f"{w.worker_id} has been spawning for {span(_age(w, now))}: "
                f"{'no SSH details yet' if w.ssh is None else 'not up'}, billed at ${w.price_per_h:.2f}/h",
        evidence=worker_evidence(w, now, provider), operations={"terminate_worker": TerminateWorker(worker_ids=(w.worker_id,))},
        recommended_action="end it; a replacement is rented as it is no capacity",
    )


def worker_evidence(w: Worker, now: datetime, provider: str) -> dict:
    """What a worker's incident carries: what it is, what it costs, and how long it has been billed."""
    return {"gpu_type": w.gpu_type, "gpus": w.gpus, "price_per_h": w.price_per_h, "status": w.status,
            "billed_s": int(_age(w, now).total_seconds()), "provider": provider or None, "host_id": w.host_id, "image": w.image}


def _age(w: Worker, now: datetime) -> timedelta:
    return now - w.created_at if w.created_at else timedelta(0)


def span(delta: timedelta | float) -> str:
    """A duration for a person: whole days or hours as such (7d, 1h), else minutes and seconds (5m00s, 54s)."""
    seconds = int(delta.total_seconds() if isinstance(delta, timedelta) else delta)
    for unit, size in (("d", 86_400), ("h", 3600)):
        if seconds >= size and seconds % size == 0:
            return f"{seconds // size}{unit}"
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
