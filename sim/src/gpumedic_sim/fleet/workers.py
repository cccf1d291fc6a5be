"""A rented worker pool on real time, for `gpumedic sim` with a scenario's `pool:` section: the
user's side of the orchestrator runbook, which the stack's autoscaler and remediator manage
through their real code paths.

- **The provider**: a `SimProvider` served over RunPod's REST API (`gpumedic_sim.fleet.runpod`) on
  loopback, with its key in a file; the autoscaler lists from it, the remediator rents and ends.
  Every `never_ssh_every`-th worker never comes up (stuck spawning, billed).
- **The task database**: SQLite, the runbook's `tasks` (Queued / In Progress / Complete) and
  `workers` (id, status, heartbeat) tables. Tasks arrive on the plan's demand curve.
- **The workers**: each one the provider lists as running is a simulated node that runs the real
  node-sampler (its GPUs busy while it runs tasks), records itself, beats its heartbeat, takes
  queued tasks one per GPU and completes each after `task`. At `workers_die_at` the busiest one
  dies silently: no heartbeat, no samples, its tasks stay In Progress.

`figures()` says what happened: tasks, queue wait p95, GPU-seconds billed against a fixed fleet
of `max_active_gpus`, idle GPU-seconds, cost, workers rented and ended, and each task requeued.
"""

from __future__ import annotations

import asyncio
import json
import math
import random
import secrets
import sqlite3
import time
from collections import Counter
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import Event
from gpumedic_providers.sim import SimProvider

from gpumedic.credentials import write_private
from gpumedic_sim.fleet.plan import BadMachine, PoolFigures, PoolPlan
from gpumedic_sim.fleet.runpod import SimRunPod
from gpumedic_sim.machine.node import SimNode

REQUEUE = "UPDATE tasks SET status = 'Queued', worker_id = NULL, requeues = requeues + 1 WHERE id IN :task_ids AND status = 'In Progress'"
MARK_ENDED = "UPDATE workers SET status = 'ended' WHERE id = :worker_id"
PROMOTE = "UPDATE workers SET status = 'active' WHERE id = :worker_id AND status = 'spawning'"
"""The statements an operator of this task database writes into the policy."""
WORKERS_QUERY = "SELECT id, status, heartbeat_at FROM workers"
IN_PROGRESS_QUERY = "SELECT id, worker_id FROM tasks WHERE status = 'In Progress'"
TASKS_QUERY = "SELECT id FROM tasks WHERE worker_id = :worker_id AND status = 'In Progress'"
FAILED_QUERY = "SELECT id FROM tasks WHERE worker_id = :worker_id AND status = 'Failed'"
REQUEUE_FAILED = ("UPDATE tasks SET status = 'Queued', worker_id = NULL, retried = 1 WHERE id IN :task_ids AND status = 'Failed' "
                  "AND retried = 0")
OUTCOMES_QUERY = ("SELECT worker_id, status, COUNT(*) FROM tasks WHERE status IN ('Complete', 'Failed') AND worker_id IS NOT NULL "
                  "GROUP BY worker_id, status")
STEP_S = 0.5


@dataclass
class _Worker:
    node: SimNode
    sampler: asyncio.Task | None = None
    running: dict[int, tuple[str, float]] = field(default_factory=dict)
    """GPU -> (task id, when it started) of the tasks it runs."""
    dead: bool = False
    fault: BadMachine | None = None
    """Its machine's broken GPU, until it shows (then None)."""
    fault_at: float = 0.0
    fails_tasks: bool = False
    """Every task it finishes fails (its machine's fault), though its GPUs look fine."""


class Hosts(Protocol):
    """Where a worker that came up is reachable over SSH and named in the remediator's inventory
    (`SimFleet`'s), and where it leaves once ended."""

    async def admit(self, node: SimNode) -> None: ...
    async def dismiss(self, node_id: str) -> None: ...


class SimWorkerPool:
    def __init__(self, plan: PoolPlan, workdir: Path, *, interval_s: float, seed: int = 0, fleet: Hosts | None = None) -> None:
        """`fleet`: where a worker that comes up joins, reachable over SSH and in the remediator's
        inventory (a burn-in logs in to it); needed with `plan.burn_in`."""
        if plan.burn_in and fleet is None:
            raise ValueError("a pool whose workers are accepted on the node needs the fleet they join")
        self.plan = plan
        self.workdir = Path(workdir)
        self.interval_s = interval_s
        self._fleet = fleet
        self.provider = SimProvider(prices={plan.gpu_type: plan.price_per_gpu_h}, spawn_s=plan.spawn, never_ssh_every=plan.never_ssh_every,
                                    hosts=plan.machines)
        self.api = SimRunPod(self.provider, key=f"rpa_sim_{secrets.token_urlsafe(18)}")
        self._rng = random.Random(seed)
        self._workers: dict[str, _Worker] = {}
        self._ended: set[str] = set()
        self._beating: asyncio.Task | None = None
        """After the curve, the heartbeats of the workers still rented (until `stop`)."""
        self._died: list[str] = []
        self._ended_busy: list[str] = []
        self._orphaned: set[str] = set()
        self._db: sqlite3.Connection | None = None
        self._t0 = 0.0
        self._gpu_s = self._idle_gpu_s = self._cost = 0.0
        self._peak = 0
        self._machines: dict[str, str] = {}
        self._took: dict[str, int] = {}
        self._came_up: dict[str, float] = {}
        self._rented_at: dict[str, float] = {}
        self._started_at: datetime | None = None

    # --- what the stack is given -------------------------------------------------------------

    @property
    def db_path(self) -> Path:
        return self.workdir / "tasks.db"

    @property
    def key_path(self) -> Path:
        return self.workdir / "provider-key"

    @property
    def url_path(self) -> Path:
        return self.workdir / "task-db-url"

    def provider_config(self) -> dict:
        return {"kind": "runpod", "api_key_file": str(self.key_path), "image": "gpumedic/sim-worker:1", "base_url": self.api.base_url,
                "timeout_s": 5}

    def demand_config(self) -> dict:
        return {"kind": "sql", "url_file": str(self.url_path), "workers_query": WORKERS_QUERY, "in_progress_query": IN_PROGRESS_QUERY,
                "outcomes_query": OUTCOMES_QUERY}

    def env(self) -> dict[str, str]:
        """The autoscaler and the remediator, pointed at this pool (the stack's other settings stay)."""
        return {
            "GPUMEDIC_AUTOSCALER_INTERVAL_S": str(self.interval_s),
            "GPUMEDIC_AUTOSCALER_STALE_AFTER_S": str(3 * self.interval_s),
            "GPUMEDIC_AUTOSCALER_DEMAND": json.dumps(self.demand_config()),
            "GPUMEDIC_AUTOSCALER_PROVIDER": json.dumps(self.provider_config()),
            "GPUMEDIC_AUTOSCALER_SCALING": self.plan.scaling.model_dump_json(),
            "GPUMEDIC_REMEDIATOR_PROVIDER": json.dumps(self.provider_config()),
            "GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE": str(self.url_path),
        }

    def policy(self) -> dict:
        """The policy's pool part, in the run's seconds: the actions this task database needs, and
        the worker checks' thresholds a few sample intervals long instead of the runbook's minutes."""
        i = self.interval_s
        policy = {
            "actions": {
                "spawn_worker": {"gpu_types": [self.plan.gpu_type], "max_gpus": self.plan.scaling.gpus_per_worker},
                "terminate_worker": {"tasks_query": TASKS_QUERY, "failed_tasks_query": FAILED_QUERY},
                "requeue_tasks": {"statement": REQUEUE, "failed_statement": REQUEUE_FAILED},
                "mark_worker_ended": {"statement": MARK_ENDED},
            },
            "kinds": {
                # a rental is verified by the workers being listed: the runbook's 2 minutes are 24 intervals
                "capacity_short": {"ladder": [{"action": "spawn_worker", "attempts": 3, "verify_within_s": 24 * i}]},
                "stuck_spawning": {"after_s": max(self.plan.spawn + 4 * i, 10 * i)},
                "stale_heartbeat": {"after_s": 6 * i},
                "unrecorded_worker": {"after_s": 10 * i},
                "queue_stalled": {"for_s": 30 * i},
            },
        }
        if self.plan.rollout is not None:  # the pool's own rate a few dozen intervals before (the outcomes query has no window)
            policy["kinds"]["failure_jump"] = {"baseline_age_s": 15 * i}
        if self.plan.burn_in:
            policy["actions"]["accept_worker"] = {"statement": PROMOTE}
            policy["kinds"]["burn_in"] = {"required": True, "within_s": self.burn_in_within_s}
        return policy

    @property
    def burn_in_within_s(self) -> float:
        """A new worker's grace to be accepted, in the run's seconds: a few sample intervals."""
        return 12 * self.interval_s

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.db_path.unlink(missing_ok=True)
        self._db = sqlite3.connect(self.db_path, timeout=5, isolation_level=None)
        self._db.execute("PRAGMA journal_mode = WAL")  # the autoscaler reads while the workers write
        self._db.execute("CREATE TABLE tasks (id TEXT PRIMARY KEY, status TEXT NOT NULL, worker_id TEXT, arrived_at REAL NOT NULL, "
                         "first_started_at REAL, started_at REAL, done_at REAL, requeues INTEGER NOT NULL DEFAULT 0, "
                         "first_failed_on TEXT, retried INTEGER NOT NULL DEFAULT 0)")
        self._db.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, status TEXT NOT NULL, heartbeat_at TEXT)")
        write_private(self.key_path, self.api.key.encode())
        write_private(self.url_path, f"sqlite:///{self.db_path}\n".encode())
        await self.api.start()

    async def stop(self) -> None:
        await stop_tasks([t for t in (self._beating, *(w.sampler for w in self._workers.values())) if t is not None])
        await self.api.stop()
        if self._db is not None:
            self._db.close()
            self._db = None

    # --- the run ------------------------------------------------------------------------------

    async def run(self, publish: Callable[[Event], Awaitable[None]], *, drain_s: float) -> None:
        """Arrivals on the demand curve, then up to `drain_s` for the queue to empty and stay quiet
        long enough for an idle worker to be ended (the idle timeout and a cool-down after the last
        change): the judge wants the pool scaled down once the queue was quiet."""
        self._t0, self._started_at = time.monotonic(), datetime.now(UTC)
        arrivals = self._arrivals()
        deaths = sorted(self.plan.workers_die_at)
        last = self._t0
        end = self._t0 + self.plan.demand_s
        quiet_s = self.plan.scaling.idle_timeout_s + self.plan.scaling.cooldown_s + 3 * self.interval_s
        emptied: float | None = None
        while True:
            now = time.monotonic()
            since = now - self._t0
            while arrivals and arrivals[0] <= since:
                arrivals.pop(0)
                self._db.execute("INSERT INTO tasks (id, status, arrived_at) VALUES (?, 'Queued', ?)", (f"task{self._count() + 1:04d}", now))
            if deaths and since >= deaths[0]:
                deaths.pop(0)
                self._kill_busiest()
            if self.plan.rollout is not None and since >= self.plan.rollout.at and self.api.rolled_out is None:
                self.api.rolled_out = self.plan.rollout.image
            await self._step(publish, now, now - last)
            last = now
            emptied = (emptied or now) if now >= end and not self._open_tasks() else None
            if now >= end + drain_s or (emptied is not None and now - emptied >= quiet_s):
                break
            await asyncio.sleep(STEP_S)
        # The curve is over, not the workers: those still rented go on beating until the pool stops
        # (the run is scored meanwhile, and a silent worker would be a stale heartbeat).
        self._beating = asyncio.create_task(self._keep_beating())

    async def _keep_beating(self) -> None:
        while self._db is not None:
            stamp = datetime.now(UTC).isoformat(timespec="seconds")
            for worker_id, worker in self._workers.items():
                if not worker.dead and self.provider.is_live(worker_id):
                    self._db.execute("UPDATE workers SET heartbeat_at = ? WHERE id = ?", (stamp, worker_id))
            await asyncio.sleep(STEP_S)

    async def _step(self, publish, now: float, dt: float) -> None:
        listed = {w.worker_id: w for w in await self.provider.workers()}
        for w in listed.values():
            self._machines.setdefault(w.worker_id, w.host_id or "")
            if w.created_at is not None and self._started_at is not None:
                self._rented_at.setdefault(w.worker_id, round((w.created_at - self._started_at).total_seconds(), 1))
        for worker_id, w in listed.items():
            if w.status == "running" and worker_id not in self._workers and worker_id not in self._ended:
                self._workers[worker_id] = await self._come_up(worker_id, w.gpus, w.host_id or "", publish, now)
        for worker_id in [w for w in self._workers if w not in listed]:
            gone = self._workers.pop(worker_id)  # ended by the provider; its tasks, if any, stay In Progress
            if gone.sampler is not None:
                await stop_tasks([gone.sampler])
            if self._fleet is not None:
                await self._fleet.dismiss(worker_id)
            self._ended.add(worker_id)
            if gone.running and not gone.dead:
                self._ended_busy.append(worker_id)
                self._orphaned.update(task_id for task_id, _ in gone.running.values())
        stamp = datetime.now(UTC).isoformat(timespec="seconds")
        for worker_id, worker in self._workers.items():
            if worker.dead:
                continue
            if worker.fault is not None and now >= worker.fault_at:
                _break(worker.node, worker.fault)
                worker.fault = None
            self._db.execute("UPDATE workers SET heartbeat_at = ? WHERE id = ?", (stamp, worker_id))
            for gpu, (task_id, started) in list(worker.running.items()):
                if now - started >= self.plan.task:
                    failed = worker.fails_tasks or self._rng.random() < self._fail_share
                    self._db.execute("UPDATE tasks SET status = ?, done_at = ?, first_failed_on = COALESCE(first_failed_on, ?) "
                                     "WHERE id = ? AND worker_id = ? AND status = 'In Progress'",
                                     ("Failed" if failed else "Complete", now, worker_id if failed else None, task_id, worker_id))
                    worker.node.finish_job(gpu)
                    del worker.running[gpu]
            if self.plan.burn_in and self._db.execute("SELECT status FROM workers WHERE id = ?", (worker_id,)).fetchone() != ("active",):
                continue  # not promoted yet: the user's workers take tasks only once they are active
            for gpu in range(len(worker.node.gpus)):
                if gpu in worker.running:
                    continue
                row = self._db.execute("SELECT id FROM tasks WHERE status = 'Queued' ORDER BY arrived_at LIMIT 1").fetchone()
                if row is None:
                    break
                self._db.execute("UPDATE tasks SET status = 'In Progress', worker_id = ?, started_at = ?, "
                             "first_started_at = COALESCE(first_started_at, ?) WHERE id = ? AND status = 'Queued'",
                             (worker_id, now, now, row[0]))
                worker.node.start_job(gpu)
                worker.running[gpu] = (row[0], now)
                self._took[worker_id] = self._took.get(worker_id, 0) + 1
        billed = [w for w in listed.values() if w.status in ("spawning", "running")]
        gpus = sum(w.gpus for w in billed)
        self._peak = max(self._peak, gpus)
        self._gpu_s += gpus * dt
        self._cost += sum(w.price_per_h for w in billed) * dt / 3600
        self._idle_gpu_s += sum(len(w.node.gpus) - len(w.running) for w in self._workers.values() if not w.dead) * dt

    async def _come_up(self, worker_id: str, gpus: int, machine: str, publish, now: float) -> _Worker:
        """A worker the provider runs now: it joins the fleet (SSH, the inventory), its node samples,
        and it records itself as the runbook's workers do (`spawning` until promoted, with burn-in)."""
        worker = _Worker(SimNode(worker_id, gpus, seed=self._rng.randrange(1 << 30)))
        bad = next((b for b in self.plan.bad_machines if b.host_id == machine), None)
        if bad is not None and bad.fault == "fails_tasks":
            worker.fails_tasks = True
        elif bad is not None and bad.after == 0:
            _break(worker.node, bad)
        elif bad is not None:
            worker.fault, worker.fault_at = bad, now + bad.after
        if self._fleet is not None:
            await self._fleet.admit(worker.node)
        self._came_up[worker_id] = round(now - self._t0, 1)

        async def publish_while_alive(event: Event) -> None:
            # A worker ended (or dead) sends nothing more, from the moment it is ended.
            if not worker.dead and self.provider.is_live(worker_id):
                await publish(event)

        worker.sampler = asyncio.create_task(worker.node.sampler(self.interval_s, probes=[]).run(publish_while_alive))
        self._db.execute("INSERT OR REPLACE INTO workers (id, status, heartbeat_at) VALUES (?, ?, ?)",
                         (worker_id, "spawning" if self.plan.burn_in else "active", datetime.now(UTC).isoformat(timespec="seconds")))
        return worker

    def _kill_busiest(self) -> None:
        alive = [w for w in self._workers.values() if not w.dead]
        if not alive:
            return
        victim = max(alive, key=lambda w: len(w.running))
        victim.dead = True
        self._died.append(victim.node.node_id)
        self._orphaned.update(task_id for task_id, _ in victim.running.values())

    @property
    def _fail_share(self) -> float:
        """A task's chance to fail wherever it runs: the plan's, or the rolled-out image's once it is out."""
        rollout = self.plan.rollout
        return rollout.fail_share if rollout is not None and self.api.rolled_out is not None else self.plan.fail_share

    # --- the figures -------------------------------------------------------------------------

    def figures(self) -> PoolFigures:
        rows = self._db.execute("SELECT id, status, arrived_at, first_started_at, requeues, first_failed_on, retried FROM tasks").fetchall()
        waits = sorted((started if started is not None else time.monotonic()) - arrived for _, _, arrived, started, *_ in rows)
        rented = self.provider.rented()
        never = [w for w, never_ssh in rented.items() if never_ssh]
        ended = self.provider.ended()
        return PoolFigures(
            tasks=len(rows), done=sum(1 for r in rows if r[1] == "Complete"), failed=sum(1 for r in rows if r[1] == "Failed"),
            wait_p95_s=round(waits[max(0, math.ceil(0.95 * len(waits)) - 1)], 1) if waits else 0.0,
            gpu_s=round(self._gpu_s), fixed_gpu_s=round(self.plan.scaling.max_active_gpus * (time.monotonic() - self._t0)),
            idle_gpu_s=round(self._idle_gpu_s), cost=round(self._cost, 4), peak_gpus_billed=self._peak, rented=list(rented),
            never_came_up=never, never_came_up_ended=sum(1 for w in never if w in ended),
            died=list(self._died), died_ended=sum(1 for w in self._died if w in ended), ended_busy=list(self._ended_busy),
            orphaned=len(self._orphaned), requeued={r[0]: r[4] for r in rows if r[4]},
            failed_first_on=dict(Counter(r[5] for r in rows if r[5])), retried_from=dict(Counter(r[5] for r in rows if r[6])),
            machines=dict(self._machines), took=dict(self._took), came_up=dict(self._came_up), ended_at={w: round((at - self._started_at).total_seconds(), 1) for w, at in ended.items()},
            rented_at=dict(self._rented_at), started_at=self._started_at,
        )

    # --- internals -----------------------------------------------------------------------------

    def _arrivals(self) -> list[float]:
        """Poisson arrivals at each stretch's rate: seconds from the start."""
        out, start = [], 0.0
        for stretch in self.plan.demand:
            t, end = start, start + stretch.seconds
            while stretch.tasks_per_min > 0:
                t += self._rng.expovariate(stretch.tasks_per_min / 60)
                if t >= end:
                    break
                out.append(t)
            start = end
        return out

    def _open_tasks(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM tasks WHERE status IN ('Queued', 'In Progress')").fetchone()[0]

    def _count(self) -> int:
        return self._db.execute("SELECT COUNT(*) FROM tasks").fetchone()[0]


def _break(node: SimNode, bad: BadMachine) -> None:
    """The machine's broken GPU shows on the worker's node."""
    if bad.fault == "gpu_lost":
        node.inject_gpu_lost(bad.gpu)
    else:
        node.gpus[bad.gpu].pcie_link_width = node.gpus[bad.gpu].pcie_link_width_max // 2


