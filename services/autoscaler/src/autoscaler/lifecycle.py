"""The orchestrator runbook's worker checks, as rules over what the provider and the user's
database say. Pure: plain records in, findings out, each naming the fix the runbook applies.

- `stuck_spawning`: the provider has had the worker `spawning` for more than `stuck_spawning_s`
  (5 min): terminate it and spawn a replacement.
- `stale_heartbeat`: a running worker whose heartbeat in the database is older than
  `stale_heartbeat_s` (10 min), or that never beat since it came up: check it, then replace it.
- `orphaned_tasks`: tasks `In Progress` on a worker the provider no longer runs: requeue them,
  once (a task already requeued is never requeued again by this rule).
- `unrecorded_worker`: the provider bills a worker the database has no record of, past the
  spawning grace: terminate it (it runs no task anyone tracks).
- `vanished_worker`: the database holds an active record of a worker the provider no longer has:
  mark the record terminated.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_providers.base import Worker

LifecycleKind = Literal["stuck_spawning", "stale_heartbeat", "orphaned_tasks", "unrecorded_worker", "vanished_worker"]
Fix = Literal["terminate_and_replace", "check_then_replace", "requeue", "terminate", "mark_terminated"]
LIVE = ("spawning", "running")
ENDED_RECORDS = frozenset({"terminated", "dead", "stopped"})


class LifecyclePolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    stuck_spawning_s: float = Field(default=300.0, gt=0)
    stale_heartbeat_s: float = Field(default=600.0, gt=0)


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


@dataclass(frozen=True)
class LifecycleFinding:
    kind: LifecycleKind
    worker_id: str
    fix: Fix
    summary: str
    tasks: tuple[str, ...] = ()


def watch(
    workers: Sequence[Worker],
    records: Sequence[WorkerRecord],
    in_progress: Sequence[TaskRecord],
    now: datetime,
    policy: LifecyclePolicy,
    *,
    requeued: Iterable[str] = (),
) -> list[LifecycleFinding]:
    live = {w.worker_id: w for w in workers if w.status in LIVE}
    recorded = {r.worker_id: r for r in records}
    spawning_grace = timedelta(seconds=policy.stuck_spawning_s)
    stale = timedelta(seconds=policy.stale_heartbeat_s)
    findings: list[LifecycleFinding] = []
    for w in live.values():
        age = now - w.created_at if w.created_at else None
        if w.status == "spawning":
            if age is not None and age > spawning_grace:
                findings.append(LifecycleFinding("stuck_spawning", w.worker_id, "terminate_and_replace",
                                                 f"{w.worker_id} has been spawning for {_span(age)} (more than {_span(spawning_grace)}): "
                                                 f"{'no SSH details yet' if w.ssh is None else 'not up'}, billed at ${w.price_per_h:.2f}/h"))
            continue
        record = recorded.get(w.worker_id)
        if record is None:
            if age is not None and age > spawning_grace:
                findings.append(LifecycleFinding("unrecorded_worker", w.worker_id, "terminate",
                                                 f"{w.worker_id} runs and bills ${w.price_per_h:.2f}/h, but the database has no record of it"))
            continue
        beat = record.heartbeat_at
        silent = now - beat if beat else age
        if silent is not None and silent > stale:
            said = f"last heartbeat {_span(silent)} ago" if beat else f"no heartbeat in the {_span(silent)} since it came up"
            findings.append(LifecycleFinding("stale_heartbeat", w.worker_id, "check_then_replace",
                                             f"{w.worker_id} is running but its {said} (more than {_span(stale)})"))
    for r in records:
        if r.worker_id not in live and r.status.lower() not in ENDED_RECORDS:
            findings.append(LifecycleFinding("vanished_worker", r.worker_id, "mark_terminated",
                                             f"the database has {r.worker_id} as {r.status!r}, but the provider no longer runs it"))
    done = set(requeued)
    orphans: dict[str, list[str]] = {}
    for t in in_progress:
        if t.task_id not in done and (t.worker_id is None or t.worker_id not in live):
            orphans.setdefault(t.worker_id or "", []).append(t.task_id)
    for worker_id, tasks in sorted(orphans.items()):
        where = f"on {worker_id}, which the provider no longer runs" if worker_id else "on no worker"
        findings.append(LifecycleFinding("orphaned_tasks", worker_id, "requeue",
                                         f"{len(tasks)} task(s) In Progress {where}", tuple(sorted(tasks))))
    return findings


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
