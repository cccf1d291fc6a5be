"""The worker pool's done-when, judged line by line from what a run observed: the queue served
by its deadline, no worker billed for nothing, each scripted worker fault drawing the incident it
should (`gpumedic_sim.fleet.workers` scripts the pool; this scores it)."""

from __future__ import annotations

from datetime import datetime, timedelta

from gpumedic_sim.fleet.plan import POOL_NODE, BadMachine, PoolFigures, PoolPlan, Rollout

WORKER_KINDS_EXPECTED = {
    "stuck_spawning": ("never_came_up", "bad_machine"), "stale_heartbeat": ("died",), "orphaned_tasks": ("died", "ended_busy"),
    "node_silent": ("died",), "vanished_worker": ("ended",), "burn_in": ("ended",),
    "burn_in_failed": ("bad_machine",), "repeat_offender": ("bad_machine",), "gpu_lost": ("bad_machine",), "gpu_xid": ("bad_machine",),
    "black_hole": ("bad_machine",),
}
"""Which workers each kind may be about: the ones that never came up, died, were ended (every
rented one, on trial when it came up), or were rented on a machine with a broken GPU."""


def judge(figures: PoolFigures, plan: PoolPlan, incidents: list, decisions: list[tuple[datetime, str, int]],
          *, burn_in_within_s: float = 0.0, interval_s: float = 5.0, costs: list | None = None) -> list[tuple[bool, str]]:
    """The done-when of the worker pool, line by line: (passed, what). `incidents` are the
    incidents observed on the pool and its workers (`.kind`, `.node_id`); `decisions` the
    autoscaler's (time, decision, GPUs in service) from its CapacityEvaluated events; `costs`
    report-builder's IncidentCosted of them (None: not judged)."""
    bad_hosts = {b.host_id for b in plan.bad_machines}
    who = {"never_came_up": set(figures.never_came_up), "died": set(figures.died), "ended": set(figures.rented),
           "ended_busy": set(figures.ended_busy), "bad_machine": {w for w, m in figures.machines.items() if m in bad_hosts}}
    on_pool = ("capacity_short", "capacity_surplus") + (("failure_jump",) if plan.rollout is not None else ())
    unexpected = [f"{i.kind} on {i.node_id}" for i in incidents
                  if not (i.node_id == POOL_NODE and i.kind in on_pool)
                  and not any(i.node_id in who[w] for w in WORKER_KINDS_EXPECTED.get(i.kind, ()))]
    turns: list[tuple[datetime, str]] = []
    for at, decision, _ in decisions:
        if decision != "hold" and (not turns or turns[-1][1] != decision):
            turns.append((at, decision))
    gaps = [(b[0] - a[0]).total_seconds() for a, b in zip(turns, turns[1:], strict=False)]
    flaps = sum(1 for g in gaps if g < plan.scaling.cooldown_s)
    peak = max((gpus for _, _, gpus in decisions), default=0)
    scaled_in_busy = [w for w in figures.ended_busy if w not in who["bad_machine"]]  # a bad machine's worker is ended busy on purpose
    s = plan.scaling
    return [
        (figures.done + figures.failed == figures.tasks,
         f"{figures.done + figures.failed}/{figures.tasks} tasks finished ({figures.failed} failed), queue wait p95 {figures.wait_p95_s:g}s"),
        (peak <= s.max_active_gpus and any(d == "scale_up" for _, d, _ in decisions),
         f"scaled within the knobs: up to {peak} GPUs in service (MAX {s.max_active_gpus}), {figures.peak_gpus_billed} billed at the peak"),
        (any(d == "scale_down" for _, d, _ in decisions), f"scaled down when the queue was quiet ({len(gaps)} reversal(s))"),
        (flaps == 0, f"{flaps} flap(s): reversals within the {s.cooldown_s:g}s cool-down"),
        (figures.never_came_up_ended == len(figures.never_came_up),
         f"{figures.never_came_up_ended}/{len(figures.never_came_up)} worker(s) stuck spawning ended and replaced"),
        (figures.died_ended == len(figures.died), f"{figures.died_ended}/{len(figures.died)} worker(s) that died silently ended and replaced"),
        (figures.requeued_once, f"{figures.orphaned} task(s) orphaned, {len(figures.requeued)} requeued, "
         f"{sum(1 for n in figures.requeued.values() if n > 1)} more than once"),
        (not scaled_in_busy, f"{len(scaled_in_busy)} worker(s) ended mid-task by a scale-in"
         + (f": {', '.join(scaled_in_busy)}" if scaled_in_busy else "")),
        (not unexpected, f"{len(unexpected)} incident(s) on the pool that no fault explains" + (f": {', '.join(unexpected[:5])}" if unexpected else "")),
        (figures.gpu_s < figures.fixed_gpu_s, f"{figures.gpu_s:g} GPU-seconds billed against {figures.fixed_gpu_s:g} for a fixed fleet of "
         f"MAX ({figures.gpu_s / max(figures.fixed_gpu_s, 1):.2f}); {figures.idle_gpu_s:g} idle; ${figures.cost:.2f}"),
        *(_judge_machine(figures, bad, incidents, burn_in_within_s + 3 * interval_s) for bad in plan.bad_machines),
        *([_judge_rollout(plan.rollout, incidents)] if plan.rollout is not None else []),
        *([_judge_costs(figures, plan, costs, incidents)] if costs is not None else []),
    ]


BILLED_FOR_NOTHING = ("stuck_spawning", "burn_in_failed")
"""A worker's incidents whose cost is its GPUs from its rental to its end (it never worked)."""


def _judge_costs(figures: PoolFigures, plan: PoolPlan, costs: list, incidents: list) -> tuple[bool, str]:
    """What report-builder said the workers billed for nothing cost, against the arithmetic: their
    GPUs from the rental until the provider ended them (its records) or the incident closed, if
    that came first, at the provider's price. A run with no such worker has nothing to check."""
    if not any(i.kind in BILLED_FOR_NOTHING and i.node_id in figures.rented_at for i in incidents):
        return True, "no worker was billed for nothing (none stuck spawning or failing its burn-in): no cost to check"
    checked, wrong = 0, []
    for c in costs:
        if c.kind not in BILLED_FOR_NOTHING or c.node_id not in figures.rented_at or figures.started_at is None or c.closed_at is None:
            continue
        rented = figures.started_at + timedelta(seconds=figures.rented_at[c.node_id])
        ended = figures.ended_at.get(c.node_id)
        billed_until = c.closed_at if ended is None else min(c.closed_at, figures.started_at + timedelta(seconds=ended))
        gpu_hours = plan.scaling.gpus_per_worker * (billed_until - rented).total_seconds() / 3600
        usd = gpu_hours * plan.price_per_gpu_h
        checked += 1
        # the incident knows the rental's start to the second (its billed_s), the figures are kept to 4 and 2 decimals
        slack = plan.scaling.gpus_per_worker * 2.0 / 3600 + 0.0001
        if abs((c.gpu_hours or 0) - gpu_hours) > slack or abs((c.usd or 0) - usd) > slack * plan.price_per_gpu_h + 0.01:
            wrong.append(f"{c.kind} on {c.node_id}: {c.gpu_hours} GPU-h ${c.usd}, the arithmetic {gpu_hours:.4f} GPU-h ${usd:.2f}")
    return checked > 0 and not wrong, (f"{checked} cost(s) of workers billed for nothing match their rental, end and the provider's "
                                      f"${plan.price_per_gpu_h:g}/GPU-h" + (f"; {len(wrong)} do not: {'; '.join(wrong[:3])}" if wrong else ""))


def _judge_rollout(rollout: Rollout, incidents: list) -> tuple[bool, str]:
    """A bad image on every worker: one failure_jump on the pool, naming the image; no worker's."""
    jumps = [i for i in incidents if i.kind == "failure_jump" and i.node_id == POOL_NODE]
    named = [i for i in jumps if rollout.image in i.summary]
    return len(jumps) == 1 and len(named) == 1, (
        f"image {rollout.image} rolled out to the whole pool at {rollout.at:g}s (tasks fail {rollout.fail_share:.0%}): "
        f"{len(jumps)} failure_jump incident(s) on the pool, {len(named)} naming the image")


def _judge_machine(figures: PoolFigures, bad: BadMachine, incidents: list, grace_s: float) -> tuple[bool, str]:
    """A machine with a broken GPU: recognised by its second rental and returned from then on (a GPU
    that falls off the bus while working), or each rental failing its burn-in, never taking a task,
    and ended within its grace (a link at half width from the start)."""
    rentals = [w for w in figures.rented if figures.machines.get(w) == bad.host_id]
    up = [w for w in rentals if w in figures.came_up]
    if bad.fault == "fails_tasks":
        holes = sorted({i.node_id for i in incidents if i.kind == "black_hole" and i.node_id in rentals})
        took = sum(figures.took.get(w, 0) for w in rentals)
        failed = sum(figures.failed_first_on.get(w, 0) for w in holes)
        retried = sum(figures.retried_from.get(w, 0) for w in holes)
        return bool(holes) and all(w in figures.ended_at for w in holes) and retried == failed, (
            f"machine {bad.host_id} (every task fails, its GPUs fine): rented {len(rentals)} time(s), {took} task(s) taken; "
            f"a black hole on {', '.join(holes) or 'none of its rentals'}"
            + (f", {sum(1 for w in holes if w in figures.ended_at)} of them ended, {retried} of the {failed} task(s) that failed "
               "there given another go" if holes else ""))
    if bad.fault == "pcie_narrow":
        late = {w: figures.ended_at[w] - figures.came_up[w] for w in up if w in figures.ended_at}
        failed = {i.node_id for i in incidents if i.kind == "burn_in_failed"}
        returned = {i.node_id for i in incidents if i.kind == "repeat_offender"} - failed
        ok = bool(up) and all(figures.took.get(w, 0) == 0 and w in failed | returned and late.get(w, grace_s + 1) <= grace_s for w in up)
        return ok, (f"machine {bad.host_id} (GPU {bad.gpu}'s PCIe link at half width): {len(up)} of its {len(rentals)} rental(s) came up, "
                    f"{sum(1 for w in up if w in failed)} failed burn-in, {sum(1 for w in up if w in returned)} returned as a repeat "
                    f"offender's, {sum(figures.took.get(w, 0) for w in up)} task(s) taken, ended {max(late.values(), default=0):.0f}s "
                    f"after coming up at the most (grace {grace_s:g}s)")
    offences = [i for i in incidents if i.kind == "repeat_offender" and i.node_id in rentals]
    found_on = sorted({rentals.index(i.node_id) for i in offences if rentals.index(i.node_id) <= 1})
    recognised = min((i.at for i in offences), default=None)
    since = (recognised - figures.started_at).total_seconds() if recognised and figures.started_at else float("inf")
    later = [w for w in rentals if figures.rented_at.get(w, 0.0) > since]
    ok = bool(found_on) and all(figures.took.get(w, 0) == 0 and w in figures.ended_at for w in later)
    where = (f"a repeat offender by its rental {found_on[-1] + 1} ({rentals[found_on[-1]]}), {since:.0f}s in" if found_on
             else f"not a repeat offender by its second rental (of {len(rentals)})")
    return ok, (f"machine {bad.host_id} (GPU {bad.gpu} falls off the bus {bad.after:g}s into each rental): rented {len(rentals)} time(s); "
                f"{where}; {len(later)} rental(s) after that returned, {sum(figures.took.get(w, 0) for w in later)} task(s) taken by them")
