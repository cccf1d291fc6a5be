"""The worker pool's incidents: each round's readings (the queue, the provider's workers, the
user's worker records) through the scaling decision and the worker checks into the shared
incident book, which asks the remediator's gate for every side effect. Pure.

Capacity is the workers that can take tasks: spawning or running at the provider, and not stuck
spawning, not drained, not silent on their heartbeat (unless their GPUs work), not on trial or
failed in their burn-in (`autoscaler.burnin`; one on trial counts for the decision as a spawning
one does), not on a repeat offender's machine (`autoscaler.offenders`), and with no incident on
them that waits for a person. A worker that is no capacity is replaced by the
scaling decision, whatever else is done about it. The decision becomes at most one incident on
the pool at a time (its node is the pool's name):

- `capacity_short`: the queue wants more GPUs than are in service: `spawn_worker`, verified
  when the new workers are listed (they count while they spawn).
- `capacity_surplus`: idle workers the queue has not needed for the cool-down: `terminate_worker`
  (never one the task database has a task In Progress on, whatever its last sample said).
- `queue_stalled`: tasks wait while every GPU in service idles: the workers do not take them.

A reading that failed makes no decision and changes no incident: a provider that errors, times
out or answers nonsense, or a queue that cannot be read, is said in the published evaluation
(`provider_error`, `demand_error`), and the open incidents wait for a trustworthy round.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpumedic_events import ActionCompleted, ActionOutcome, CapacityEvaluated, IncidentKind, SpawnWorker, TerminateWorker, WorkerRow
from gpumedic_incidents import Finding, IncidentBook, Policy, Transition
from gpumedic_providers.base import ProviderError, Worker

from autoscaler import lifecycle
from autoscaler.demand import Demand, DemandUnavailable
from autoscaler.burnin import Trials
from autoscaler.lifecycle import TaskRecord, WorkerRecord
from autoscaler.outcomes import Outcomes, PoolHistory, black_holes, pool_rate, runs_as_the_pool
from autoscaler.offenders import RepeatOffenders
from autoscaler.scaling import Decision, NodeLoad, Scaler, ScalingPolicy, Supply

SOURCE = "autoscaler"
SCALING_KINDS = (IncidentKind.CAPACITY_SHORT, IncidentKind.CAPACITY_SURPLUS)
"""The pool incidents whose fix is a scale change (it restarts the cool-down)."""
POOL_KINDS = (*SCALING_KINDS, IncidentKind.QUEUE_STALLED)
COST_WINDOW_S = 3600.0
"""$/task is taken over this window."""


@dataclass(frozen=True)
class Reading:
    """What one round read; the error in place of what could not be read."""

    demand: Demand | DemandUnavailable
    workers: list[Worker] | ProviderError
    records: tuple[list[WorkerRecord], list[TaskRecord]] | DemandUnavailable | None = None
    """None: the demand source keeps no worker records."""
    outcomes: list[Outcomes] | DemandUnavailable | None = None
    """How each worker's finished tasks ended; None: the demand source does not say."""


@dataclass
class FleetView:
    """What the bus says about the nodes: latest loads, since when each idles, the drained, and
    the nodes with an incident that waits for a person (node id -> why)."""

    latest: dict[str, NodeLoad] = field(default_factory=dict)
    idle_since: dict[str, datetime] = field(default_factory=dict)
    drained: frozenset[str] = frozenset()
    needs_person: dict[str, str] = field(default_factory=dict)


@dataclass
class _Ledger:
    """Running cost figures since start: $ spent, idle GPU-hours, and (time, $ so far, tasks done)
    points for $/task over the window."""

    last: datetime | None = None
    cost_per_h: float = 0.0
    idle_gpus: int = 0
    cost_total: float = 0.0
    idle_gpu_hours: float = 0.0
    points: deque = field(default_factory=deque)

    def advance(self, now: datetime, cost_per_h: float, idle_gpus: int, complete: int | None) -> float | None:
        if self.last is not None:
            hours = max(0.0, (now - self.last).total_seconds()) / 3600
            self.cost_total += self.cost_per_h * hours
            self.idle_gpu_hours += self.idle_gpus * hours
        self.last, self.cost_per_h, self.idle_gpus = now, cost_per_h, idle_gpus
        if complete is None:
            return None
        self.points.append((now, self.cost_total, complete))
        while self.points and now - self.points[0][0] > timedelta(seconds=COST_WINDOW_S):
            self.points.popleft()
        _, cost0, done0 = self.points[0]
        done = complete - done0
        return (self.cost_total - cost0) / done if done > 0 else None


class PoolIncidents:
    def __init__(
        self, pool: str, policy: Policy, scaling: ScalingPolicy, *, busy_util_pct: int, stale_after_s: float, provider: str = "",
    ) -> None:
        """`provider` names who rents the workers out (their incidents' evidence carries it)."""
        self.pool = pool
        self.provider = provider
        self.policy = policy
        self.scaling = scaling
        self.book = IncidentBook(SOURCE, policy)
        self.scaler = Scaler(scaling)
        self.busy_util_pct = busy_util_pct
        self.stale_after_s = stale_after_s
        self._ledger = _Ledger()
        self.offenders = RepeatOffenders(policy.kinds.repeat_offender)
        self.trials = Trials(policy.kinds.burn_in)
        self.outcomes: dict[str, tuple[str, Outcomes]] = {}
        """Each worker's host and how its tasks ended, as the task database last said (`task_figures`)."""
        self.history = PoolHistory(policy.kinds.failure_jump)
        self._rented_at: datetime | None = None
        """When the capacity_short incident's rental succeeded (its workers listed)."""
        self._workers: set[str] = set()
        """Every worker the provider has listed live: of the nodes, those it can say are gone."""

    # --- inputs --------------------------------------------------------------------------------

    def on_round(self, reading: Reading, fleet: FleetView, now: datetime) -> tuple[CapacityEvaluated, list[Transition]]:
        if isinstance(reading.workers, ProviderError):
            return self._no_decision(fleet, provider_error=str(reading.workers)), []
        workers = [w for w in reading.workers if w.status in lifecycle.LIVE]
        for w in workers:
            self.book.saw_node(w.worker_id, now)
        retired = self._retired(reading.workers, workers, now)
        self.offenders.learn(workers, now)
        present = _present(fleet, now, self.stale_after_s)
        for node_id in present:
            self.book.saw_node(node_id, now)
        records = reading.records if not isinstance(reading.records, DemandUnavailable) else None
        found = lifecycle.watch(workers, records, now, self.policy, gpus_working=lambda w: self._working(w, fleet, now),
                                provider=self.provider)
        checked = set(lifecycle.KINDS) if records is not None else {IncidentKind.STUCK_SPAWNING}
        offending = self.offenders.findings(now, {w.worker_id: w for w in workers}, present, provider=self.provider)
        trials = {s.node_id for s in self.book.incidents.values() if s.kind is IncidentKind.BURN_IN}
        found += (offending or []) + self.trials.round(workers, now, open_trials=trials, returned={f.node_id for f in offending or ()},
                                                       provider=self.provider)
        checked |= {IncidentKind.BURN_IN, IncidentKind.BURN_IN_FAILED} | ({IncidentKind.REPEAT_OFFENDER} if offending is not None else set())
        if isinstance(reading.outcomes, list):
            # a worker gone since keeps the host it had; one listed now has the provider's word
            hosts = {w: host for w, (host, _) in self.outcomes.items()} | {w.worker_id: w.host_id or "" for w in workers}
            self.outcomes = {o.worker_id: (hosts.get(o.worker_id, ""), o) for o in reading.outcomes}
            listed = {w.worker_id: w for w in workers}
            holes = black_holes(reading.outcomes, self.policy.kinds.black_hole, workers=listed, present=present, now=now,
                                provider=self.provider)
            rate = pool_rate(reading.outcomes, workers, now, leave_out={f.node_id for f in holes})
            if holes and (self._jump_open() or self.history.judge(rate, pool=self.pool) is not None):
                # the pool's own change, not theirs (`autoscaler.outcomes`): they count in its rate
                holes = [f for f in holes if not runs_as_the_pool(listed.get(f.node_id), rate)]
                rate = pool_rate(reading.outcomes, workers, now, leave_out={f.node_id for f in holes})
            jump = self.history.round(rate, pool=self.pool)
            found += holes + ([jump] if jump else [])
            checked |= {IncidentKind.BLACK_HOLE, IncidentKind.FAILURE_JUMP}
        retiring = {t.before.node_id for t in retired if t.before is not None}
        found = [f for f in found if f.node_id not in retiring]  # its tasks' failures still in the window are no news
        transitions = retired + self.book.reconcile(found, checked, now)
        in_service = self._in_service(workers, found, fleet, now)
        on_task = {t.worker_id for t in records[1] if t.worker_id} if records is not None else set()
        supply = self._supply(workers, in_service, fleet, on_task)
        idle_gpus = sum(g for w, g in supply.gpus.items() if w in supply.idle_since)
        if isinstance(reading.demand, DemandUnavailable):
            self._ledger.advance(now, supply.cost_per_h, idle_gpus, None)
            return self._no_decision(fleet, demand_error=str(reading.demand), workers=workers, in_service=in_service,
                                     records=records, now=now), transitions
        demand = reading.demand
        decided = self.scaler.decide(demand, supply, now)
        transitions += self.book.reconcile(self._pool_findings(decided, demand, supply, now), set(POOL_KINDS), now)
        per_task = self._ledger.advance(now, supply.cost_per_h, idle_gpus, demand.complete)
        evaluated = CapacityEvaluated(
            source=SOURCE, nodes_seen=len(workers), nodes_drained=sum(1 for w in workers if w.worker_id in fleet.drained),
            gpus_total=supply.total, gpus_busy=self._busy(fleet, in_service), decision=decided.decision, reason=decided.reason[:1000],
            queued=demand.queued, in_progress=demand.in_progress, gpus_wanted=decided.gpus_wanted, change_gpus=decided.change_gpus,
            release=decided.release[:100], **self._costs(workers, in_service), cost_per_task=None if per_task is None else round(per_task, 4),
            **self._outcomes(reading), worker_rows=worker_rows(workers, in_service, records, now),
        )
        return evaluated, transitions

    def _retired(self, listed: list[Worker], live: list[Worker], now: datetime) -> list[Transition]:
        """What closes because a worker of the pool is gone for good (ended, or no longer listed): a
        terminated black hole waited to validate on samples of a machine that no longer exists."""
        alive = {w.worker_id for w in live}
        self._workers |= alive
        said = {w.worker_id: w.status for w in listed}
        transitions: list[Transition] = []
        for node in sorted({s.node_id for s in self.book.incidents.values() if s.phase == "validating"} & self._workers - alive):
            why = f"the provider lists worker {node} as {said[node]}" if node in said else f"the provider no longer lists worker {node}"
            transitions += self.book.gone(node, now, why)
        return transitions

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]:
        state = self.book.by_id(event.incident_id)
        if state is not None and state.kind in SCALING_KINDS and event.outcome is ActionOutcome.SUCCEEDED:
            self.scaler.changed(now)
            if state.kind is IncidentKind.CAPACITY_SHORT:
                self._rented_at = now
        if state is not None and state.kind is IncidentKind.BURN_IN:
            if event.outcome is ActionOutcome.SUCCEEDED:
                self.trials.accept(state.node_id)
            elif event.outcome is ActionOutcome.FAILED:
                self.trials.fail(state.node_id, event.detail or "its acceptance checks failed")
            else:  # refused by the gate, or observe only: still on trial, and the reason kept for its end
                self.trials.refuse(state.node_id, event.detail or event.outcome.value)
        return self.book.on_action_completed(event, now, traceparent)

    def on_tick(self, now: datetime) -> list[Transition]:
        return self.book.on_tick(now)

    # --- the pool ------------------------------------------------------------------------------

    def _pool_findings(self, decided: Decision, demand: Demand, supply: Supply, now: datetime) -> list[Finding]:
        s, spawn = self.scaling, self.policy.actions.spawn_worker
        evidence = {"queued": demand.queued, "in_progress": demand.in_progress, "gpus_wanted": decided.gpus_wanted,
                    "gpus_in_service": supply.total, "cost_per_h": round(supply.cost_per_h, 2)}
        found = []
        if decided.decision != "scale_up":
            self._rented_at = None
        elif not self._rental_in(now):
            workers = min(math.ceil(decided.change_gpus / s.gpus_per_worker), spawn.max_count)
            operations = {"spawn_worker": SpawnWorker(gpu_type=s.gpu_type, gpus=s.gpus_per_worker, count=workers)} if s.gpu_type else {}
            found.append(Finding(
                kind=IncidentKind.CAPACITY_SHORT, node_id=self.pool, summary=f"the queue waits: {decided.reason}", evidence=evidence,
                operations=operations, recommended_action=f"rent {workers} worker(s) of {s.gpus_per_worker} GPU(s)"
                + ("" if s.gpu_type else " (set the scaling policy's gpu_type to let gpumedic rent them)"),
            ))
        if decided.decision == "scale_down":
            release = decided.release[: self.policy.actions.terminate_worker.max_count]
            found.append(Finding(
                kind=IncidentKind.CAPACITY_SURPLUS, node_id=self.pool, severity="info", summary=f"idle workers: {decided.reason}",
                evidence={**evidence, "release": ", ".join(release)},
                operations={"terminate_worker": TerminateWorker(worker_ids=release)}, recommended_action=f"end {', '.join(release)}",
            ))
        stalled = self._stalled(demand, supply, now)
        if stalled:
            found.append(Finding(kind=IncidentKind.QUEUE_STALLED, node_id=self.pool, summary=stalled, evidence=evidence,
                                 recommended_action="check that the workers reach the queue (credentials, network, the worker loop)"))
        return found

    def _jump_open(self) -> bool:
        """A failure_jump on the pool is still open: a round whose rate dips below the jump's bar
        does not end it, nor does a restart that forgot the pool's history."""
        return any(s.kind is IncidentKind.FAILURE_JUMP and s.node_id == self.pool for s in self.book.incidents.values())

    def _rental_in(self, now: datetime) -> bool:
        """The incident's rental succeeded most of its verification window ago and the queue still
        wants more: a burst outgrowing each rental. Its incident is fixed now (the rental did what it
        was asked), once, and the next round opens the next one; rentals keep the ladder's pace, and
        a growing burst never pages a person and stops the pool after three rentals that each fell behind."""
        ladder = self.policy.kinds.capacity_short.ladder
        if self._rented_at is None or not ladder or now - self._rented_at < 0.9 * timedelta(seconds=ladder[0].verify_within_s):
            return False
        self._rented_at = None
        return True

    def _stalled(self, demand: Demand, supply: Supply, now: datetime) -> str:
        """Tasks wait while every GPU in service has idled for `for_s` (and some are in service)."""
        idle = demand.queued > 0 and supply.gpus and all(w in supply.idle_since for w in supply.gpus)
        if not idle:
            return ""
        since = max(supply.idle_since[w] for w in supply.gpus)
        if now - since < timedelta(seconds=self.policy.kinds.queue_stalled.for_s):
            return ""
        return (f"{demand.queued} task(s) queued while all {supply.total} GPUs in service idle since "
                f"{since.isoformat(timespec='seconds')}: the workers do not take them")

    # --- capacity ------------------------------------------------------------------------------

    def _in_service(self, workers: list[Worker], found: list[Finding], fleet: FleetView, now: datetime) -> dict[str, Worker]:
        dead = {f.node_id for f in found if f.kind is IncidentKind.STALE_HEARTBEAT and not f.unsafe}
        dead |= {f.node_id for f in found if f.kind in (IncidentKind.REPEAT_OFFENDER, IncidentKind.BLACK_HOLE)} | self.trials.on_trial()
        return {
            w.worker_id: w for w in workers
            if not lifecycle.stuck(w, now, self.policy) and w.worker_id not in dead and w.worker_id not in fleet.drained
            and w.worker_id not in fleet.needs_person
        }

    def _supply(self, workers: list[Worker], in_service: dict[str, Worker], fleet: FleetView, on_task: set[str]) -> Supply:
        typed = [w for w in workers if w.gpu_type == self.scaling.gpu_type and w.gpus]
        # A worker on trial counts for the decision as a spawning one does (no second rental in its
        # place), but is never in service, nor released as idle: it has taken no task.
        trial = {w.worker_id: w.gpus for w in workers if w.worker_id in self.trials.started}
        return Supply(
            gpus={w.worker_id: w.gpus for w in in_service.values()} | trial,
            # Only a running worker that samples can idle; one still spawning is never released. Nor
            # is one the task database has a task In Progress on: it may have taken it since its
            # last sample (ending it would orphan the task), whatever that sample said.
            idle_since={w: t for w, t in fleet.idle_since.items()
                        if w in in_service and in_service[w].status == "running" and w not in on_task},
            cost_per_h=sum(w.price_per_h for w in workers),
            gpu_price_per_h=typed[0].price_per_h / typed[0].gpus if typed else None,
        )

    def task_figures(self) -> list[tuple[tuple[str, str, str], float]]:
        """Each worker's finished tasks over the outcomes window, by host and how they ended (a gauge:
        summed by host or over the pool, the failure rate and throughput each level shows)."""
        return [((worker, host, ended), n) for worker, (host, o) in sorted(self.outcomes.items())
                for ended, n in (("done", o.done), ("failed", o.failed))]

    @staticmethod
    def _outcomes(reading: Reading) -> dict:
        if not isinstance(reading.outcomes, list):
            return {}
        return {"tasks_done": sum(o.done for o in reading.outcomes), "tasks_failed": sum(o.failed for o in reading.outcomes)}

    def _working(self, worker_id: str, fleet: FleetView, now: datetime) -> str:
        sample = fleet.latest.get(worker_id)
        if sample is None or now - sample.occurred_at > timedelta(seconds=self.stale_after_s):
            return ""
        busy = sample.busy(self.busy_util_pct)
        if not busy:
            return ""
        age = int((now - sample.occurred_at).total_seconds())
        return f"{len(busy)} of its {len(sample.gpus)} GPU(s) busy (up to {max(busy)}%) in a sample {age}s old"

    def _busy(self, fleet: FleetView, in_service: dict[str, Worker]) -> int:
        return sum(len(s.busy(self.busy_util_pct)) for n in in_service if (s := fleet.latest.get(n)))

    def _costs(self, workers: list[Worker], in_service: dict[str, Worker]) -> dict:
        return {
            "workers": len(workers), "workers_in_service": len(in_service),
            "cost_per_h": round(sum(w.price_per_h for w in workers), 4),
            "cost_total": round(self._ledger.cost_total, 4), "idle_gpu_hours": round(self._ledger.idle_gpu_hours, 4),
        }

    def _no_decision(self, fleet: FleetView, *, provider_error: str | None = None, demand_error: str | None = None,
                     workers: list[Worker] | None = None, in_service: dict[str, Worker] | None = None,
                     records: Records | None = None, now: datetime | None = None) -> CapacityEvaluated:
        """Hold, saying which reading failed; the workers' figures when the provider answered."""
        in_service = in_service or {}
        return CapacityEvaluated(
            source=SOURCE, nodes_seen=len(workers or ()), gpus_total=sum(w.gpus for w in in_service.values()),
            gpus_busy=self._busy(fleet, in_service), decision="hold", reason=f"no decision: {provider_error or demand_error}"[:1000],
            provider_error=provider_error and provider_error[:500], demand_error=demand_error and demand_error[:500],
            **(self._costs(workers, in_service) if workers is not None else {}),
            worker_rows=worker_rows(workers, in_service, records, now) if workers is not None and now is not None else (),
        )


class HostIncidents:
    """The detector without a worker pool to manage: the repeat offenders among the nodes only."""

    def __init__(self, policy: Policy, *, stale_after_s: float) -> None:
        self.book = IncidentBook(SOURCE, policy)
        self.offenders = RepeatOffenders(policy.kinds.repeat_offender)
        self.stale_after_s = stale_after_s

    def on_round(self, fleet: FleetView, now: datetime) -> list[Transition]:
        present = _present(fleet, now, self.stale_after_s)
        for node_id in present:
            self.book.saw_node(node_id, now)
        offending = self.offenders.findings(now, {}, present)
        return self.book.reconcile(offending, {IncidentKind.REPEAT_OFFENDER}, now) if offending is not None else []

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Transition]:
        return self.book.on_action_completed(event, now, traceparent)

    def on_tick(self, now: datetime) -> list[Transition]:
        return self.book.on_tick(now)


Records = tuple[list[WorkerRecord], list[TaskRecord]]


def worker_rows(workers: list[Worker], in_service: dict[str, Worker], records: Records | None, now: datetime) -> tuple[WorkerRow, ...]:
    """The round's workers as runbook 001's table shows them: the provider's status, host and price
    beside the task database's status, heartbeat age and task (what it lacks stays None)."""
    rows = {r.worker_id: r for r in records[0]} if records is not None else {}
    tasks: dict[str, str] = {}
    for task in records[1] if records is not None else ():
        if task.worker_id:
            tasks.setdefault(task.worker_id, task.task_id)
    out = []
    for w in workers[:1000]:
        record, task = rows.get(w.worker_id), tasks.get(w.worker_id)
        beat = record.heartbeat_at if record is not None else None
        out.append(WorkerRow(
            worker_id=w.worker_id, status=w.status, record_status=record.status[:64] if record is not None else None,
            heartbeat_age_s=round(max(0.0, (now - beat).total_seconds()), 1) if beat is not None else None,
            host=f"{w.ssh.host}:{w.ssh.port}"[:253] if w.ssh is not None else None, gpu_type=w.gpu_type, gpus=w.gpus,
            price_per_h=round(w.price_per_h, 4), task=task[:128] if task else None,
            in_service=w.worker_id in in_service,
        ))
    return tuple(out)


def _present(fleet: FleetView, now: datetime, stale_after_s: float) -> set[str]:
    """The nodes that sampled lately."""
    return {n for n, s in fleet.latest.items() if now - s.occurred_at <= timedelta(seconds=stale_after_s)}
