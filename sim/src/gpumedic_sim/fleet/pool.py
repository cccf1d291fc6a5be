"""A simulated worker pool on simulated time: a task queue fed by a demand curve, workers rented
from the simulated provider that take tasks one per GPU, and the faults the orchestrator runbook
fights (spawns that never come up, a worker that dies with tasks In Progress). The autoscaler's
real pool logic (`PoolIncidents`: the scaling decision, the worker checks and the shared incident
book) decides every round; its requests are carried out as the remediator does (the provider
operations through the remediator's own catalogue code), so the figures are the policy's.

`run_curve` plays a whole day in a few seconds and returns the figures: queue wait p95, GPU-hours
and cost, idle GPU-hours, actions, flapping, and the requeues; `fixed=True` runs the same curve
on a fixed fleet of `max_active_gpus` workers for comparison.
"""

from __future__ import annotations

import asyncio
import math
import random
from collections import deque
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

from autoscaler.demand import Demand
from autoscaler.lifecycle import TaskRecord, WorkerRecord
from autoscaler.pool import FleetView, PoolIncidents, Reading
from autoscaler.scaling import ScalingPolicy
from gpumedic_events import ActionCompleted, ActionOutcome, ActionRequested, MarkWorkerEnded, RequeueTasks
from gpumedic_incidents import Policy
from gpumedic_providers.sim import SimProvider
from remediator.catalogue import Means
from remediator.catalogue import provider as provider_ops

GPU = "H100"
T0 = datetime(2026, 11, 23, 0, 0, tzinfo=UTC)


@dataclass(frozen=True)
class Phase:
    hours: float
    tasks_per_h: float


DAY = (Phase(2, 20), Phase(2, 150), Phase(9, 6), Phase(2, 120), Phase(9, 20))
"""A burst, a quiet night, a second burst: tasks arriving per hour, phase by phase."""


@dataclass
class _Task:
    task_id: str
    arrived: datetime
    started: datetime | None = None
    worker_id: str | None = None
    requeues: int = 0


@dataclass
class _Worker:
    worker_id: str
    gpus: int
    running: list[_Task] = field(default_factory=list)
    heartbeat: datetime | None = None
    dead: bool = False
    """Died silently: no heartbeat, no progress, its tasks stay In Progress."""
    idle_since: datetime | None = None


@dataclass
class Figures:
    tasks: int
    done: int
    wait_p95_min: float
    gpu_hours: float
    cost: float
    idle_gpu_hours: float
    peak_gpus: int
    """GPUs billed at the peak (workers stuck spawning included)."""
    peak_in_service: int
    """GPUs in service at the peak: never above max_active_gpus."""
    actions: dict[str, int]
    reversals: int
    """Scale decisions that reverse the one before (up after down, down after up)."""
    flaps: int
    """Of those, reversals within the cool-down of the one before: flapping."""
    requeued: int
    requeued_twice: int
    workers_replaced: int
    """Workers ended because they were stuck spawning or silent (each is no capacity, so replaced)."""


POLICY = Policy.model_validate({
    "actions": {"spawn_worker": {"gpu_types": [GPU], "max_count": 8}, "terminate_worker": {"max_count": 8},
                "requeue_tasks": {"statement": "UPDATE tasks SET status = 'Queued' WHERE id IN :task_ids"},
                "mark_worker_ended": {"statement": "UPDATE workers SET status = 'ended' WHERE id = :worker_id"}},
})
"""The shipped policy, with the pool's actions configured (the statements are the simulated queue's)."""


def run_curve(
    scaling: ScalingPolicy,
    *,
    curve: tuple[Phase, ...] = DAY,
    task_s: float = 600.0,
    step_s: float = 15.0,
    spawn_s: float = 120.0,
    never_ssh_every: int = 7,
    die_at_h: tuple[float, ...] = (3.0, 16.5),
    fixed: bool = False,
    seed: int = 7,
) -> Figures:
    return asyncio.run(_run(scaling, curve, task_s, step_s, spawn_s, never_ssh_every, die_at_h, fixed, seed))


async def _run(scaling, curve, task_s, step_s, spawn_s, never_ssh_every, die_at_h, fixed, seed) -> Figures:
    rng = random.Random(seed)
    now = T0
    provider = SimProvider(prices={GPU: 2.49}, spawn_s=spawn_s, never_ssh_every=0 if fixed else never_ssh_every, clock=lambda: now)
    policy = POLICY
    logic = PoolIncidents("workers", policy, scaling, busy_util_pct=20, stale_after_s=3 * step_s)
    queue: deque[_Task] = deque()
    tasks: list[_Task] = []
    workers: dict[str, _Worker] = {}
    records: dict[str, str] = {}
    pending: list[ActionRequested] = []
    actions: dict[str, int] = {}
    decisions: list[tuple[datetime, str]] = []
    requeued: dict[str, int] = {}
    stuck_ended = 0
    dies = sorted(T0 + timedelta(hours=h) for h in die_at_h)
    billed_gpu_s = cost = idle_gpu_s = 0.0
    peak = peak_in_service = 0
    if fixed:
        for _ in range(math.ceil(scaling.max_active_gpus / scaling.gpus_per_worker)):
            await provider.create("fixed", GPU, scaling.gpus_per_worker)
    end = T0 + timedelta(hours=sum(p.hours for p in curve))
    arrivals = _arrivals(curve, rng)
    while now < end or (queue and now < end + timedelta(hours=6)):
        # Tasks arrive; live workers finish theirs, beat and take more, one per GPU.
        while arrivals and arrivals[0] <= now:
            task = _Task(f"t{len(tasks) + 1}", arrivals.popleft())
            tasks.append(task)
            queue.append(task)
        listed = {w.worker_id: w for w in await provider.workers()}
        for worker_id, w in listed.items():
            if w.status == "running" and worker_id not in workers:
                workers[worker_id] = _Worker(worker_id, w.gpus, heartbeat=now, idle_since=now)
                records[worker_id] = "active"
        for worker_id in [w for w in workers if w not in listed]:
            del workers[worker_id]  # ended: its tasks, if any, stay In Progress until requeued
        if dies and now >= dies[0] and workers:
            dies.pop(0)
            busiest = max(workers.values(), key=lambda w: len(w.running))
            busiest.dead = True
        for w in workers.values():
            if w.dead:
                continue
            w.heartbeat = now
            for task in [t for t in w.running if now - t.started >= timedelta(seconds=task_s)]:
                w.running.remove(task)
                task.worker_id = "done"
            while queue and len(w.running) < w.gpus:
                task = queue.popleft()
                task.started, task.worker_id = now, w.worker_id
                w.running.append(task)
            w.idle_since = (w.idle_since or now) if not w.running else None
        # Billing, this step.
        billed = [w for w in listed.values() if w.status in ("spawning", "running")]
        gpus = sum(w.gpus for w in billed)
        peak = max(peak, gpus)
        billed_gpu_s += gpus * step_s
        cost += sum(w.price_per_h for w in billed) * step_s / 3600
        idle_gpu_s += sum(w.gpus for w in workers.values() if not w.running and not w.dead) * step_s
        if not fixed:
            in_progress = [t for t in tasks if t.started and t.worker_id not in (None, "done")]
            reading = Reading(
                demand=Demand(queued=len(queue), in_progress=len(in_progress), complete=sum(1 for t in tasks if t.worker_id == "done")),
                workers=list(listed.values()),
                records=([WorkerRecord(i, s, workers[i].heartbeat if i in workers else None) for i, s in records.items()],
                         [TaskRecord(t.task_id, t.worker_id) for t in in_progress]),
            )
            fleet = FleetView(idle_since={w.worker_id: w.idle_since for w in workers.values() if w.idle_since and not w.dead})
            evaluated, transitions = logic.on_round(reading, fleet, now)
            transitions += logic.on_tick(now)
            decisions.append((now, evaluated.decision))
            peak_in_service = max(peak_in_service, evaluated.gpus_total)
            for t in transitions:
                pending += [e for span in t.spans for e in span.events if isinstance(e, ActionRequested)]
                logic.book.commit(t)
            # The remediator: each request carried out, its result back to the pool.
            for request in pending:
                name = request.operation.operation
                actions[name] = actions.get(name, 0) + 1
                outcome = await _carry_out(request, policy, provider, queue, tasks, records, requeued)
                if name == "terminate_worker" and request.node_id != "workers":
                    stuck_ended += 1
                done = ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id,
                                       node_id=request.node_id, attempt=request.attempt, outcome=outcome, detail="simulated")
                for t in logic.on_action_completed(done, now, None):
                    logic.book.commit(t)
            pending = []
        now += timedelta(seconds=step_s)
    waits = sorted(((t.started or now) - t.arrived).total_seconds() / 60 for t in tasks)
    turns = []  # (time, decision) where the scale direction turns
    for at, decision in decisions:
        if decision != "hold" and (not turns or turns[-1][1] != decision):
            turns.append((at, decision))
    gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(turns, turns[1:], strict=False)]
    return Figures(
        tasks=len(tasks), done=sum(1 for t in tasks if t.worker_id == "done"),
        wait_p95_min=round(waits[int(0.95 * (len(waits) - 1))] if waits else 0.0, 1),
        gpu_hours=round(billed_gpu_s / 3600, 1), cost=round(cost, 2), idle_gpu_hours=round(idle_gpu_s / 3600, 1), peak_gpus=peak,
        peak_in_service=peak_in_service if not fixed else peak,
        actions=actions, reversals=len(gaps), flaps=sum(1 for g in gaps if g < scaling.cooldown_s),
        requeued=sum(requeued.values()), requeued_twice=sum(1 for n in requeued.values() if n > 1), workers_replaced=stuck_ended,
    )


async def _carry_out(request, policy, provider, queue, tasks, records, requeued) -> ActionOutcome:
    operation = request.operation
    if isinstance(operation, RequeueTasks):
        by_id = {t.task_id: t for t in tasks}
        for task_id in operation.task_ids:
            task = by_id[task_id]
            if task.started and task.worker_id not in (None, "done"):  # the statement's status guard
                task.started, task.worker_id = None, None
                queue.appendleft(task)
                requeued[task_id] = requeued.get(task_id, 0) + 1
        return ActionOutcome.SUCCEEDED
    if isinstance(operation, MarkWorkerEnded):
        records[operation.worker_id] = "ended"
        return ActionOutcome.SUCCEEDED
    return (await provider_ops.carry_out(operation, Means(actions=policy.actions, request=request, provider=provider))).outcome


def _arrivals(curve: tuple[Phase, ...], rng: random.Random) -> deque[datetime]:
    """Poisson arrivals at each phase's rate."""
    out: deque[datetime] = deque()
    start = T0
    for phase in curve:
        t, end = start, start + timedelta(hours=phase.hours)
        while True:
            t += timedelta(hours=rng.expovariate(phase.tasks_per_h))
            if t >= end:
                break
            out.append(t)
        start = end
    return out
