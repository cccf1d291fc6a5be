"""Black holes: workers whose tasks keep failing while every GPU signal may be green. Pure.

A bad image, a broken driver and CUDA pairing or a flaky host fails every task it gets and still
samples healthy; only how its tasks end gives it away. The task database says how each worker's
finished tasks ended over the window of the operator's query (the runbook's `Complete` and
`Failed`), and a worker is a `black_hole` when it fails far more than the rest of the pool:

it finished at least `min_tasks` tasks and its failures stand out from every other worker's
together (`gpumedic_incidents.rates`: at least `min_failed`, `min_ratio` times the rest's rate,
and rarer by chance than `alpha` shared among the workers tested, by a one-sided binomial tail).

A rate that rises on many workers at once is no one worker's doing (a bad image rolled out to
part of the pool): what fires on many workers at once is one fleet incident through the book's
correlation, never many drains. Rolled out to every worker, it leaves each worker's rate near the
rest's, so the pool is compared with itself as it was (`failure_jump`): its rate now, black holes
left out, against its rate `baseline_age_s` before (a round with no jump), by the same binomial
tail; the incident names what changed between the two (the image, the GPU type the workers run).
While the pool's rate jumps, a worker that runs what most of the pool runs is no black hole
(`runs_as_the_pool`): the outcomes query counts each worker's tasks over its window, so a worker
rented after the change has only tasks that ran under it while the rest still count tasks from
before, and it would stand out for the pool's own change (the next one rented would too).
"""

from __future__ import annotations

from collections import Counter, deque
from collections.abc import Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from autoscaler.lifecycle import worker_evidence
from gpumedic_events import IncidentKind, TerminateWorker
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import BlackHolePolicy, FailureJumpPolicy
from gpumedic_incidents.rates import stands_out
from gpumedic_providers.base import Worker


@dataclass(frozen=True)
class Outcomes:
    """How one worker's finished tasks ended over the query's window."""

    worker_id: str
    done: int
    failed: int

    @property
    def finished(self) -> int:
        return self.done + self.failed


def black_holes(
    outcomes: Sequence[Outcomes], policy: BlackHolePolicy, *, workers: dict[str, Worker], present: Collection[str] = (),
    now: datetime, provider: str = "",
) -> list[Finding]:
    """A finding on each worker whose failures stand far above the rest of the pool's (module
    docstring): a rented worker the provider runs now (`workers`) or a node that sampled lately
    (`present`). One that is gone still counts in the rest's rate, as its tasks did."""
    tested = [o for o in outcomes if o.finished >= policy.min_tasks and (o.worker_id in workers or o.worker_id in present)]
    if len(outcomes) < 2 or not tested:
        return []
    all_finished = sum(o.finished for o in outcomes)
    all_failed = sum(o.failed for o in outcomes)
    alpha = policy.alpha / len(tested)
    found = []
    for o in sorted(tested, key=lambda o: o.worker_id):
        others_finished, others_failed = all_finished - o.finished, all_failed - o.failed
        out = stands_out(o.failed, o.finished, others_failed, others_finished, min_failed=policy.min_failed,
                         min_ratio=policy.min_ratio, alpha=alpha)
        if out is None:
            continue
        rate, rest, chance = out.rate, out.rest, out.chance
        evidence: dict = {
            "tasks_finished": o.finished, "tasks_failed": o.failed, "failure_rate": round(rate, 4),
            "rest_of_pool_rate": round(rest, 4), "rest_of_pool_finished": others_finished, "chance": float(f"{chance:.3g}"),
            "alpha_per_worker": float(f"{alpha:.3g}"), "workers_tested": len(tested),
        }
        worker = workers.get(o.worker_id)
        if worker is not None:
            evidence = {**worker_evidence(worker, now, provider), **evidence}
        found.append(Finding(
            kind=IncidentKind.BLACK_HOLE, node_id=o.worker_id,
            summary=(f"{o.failed} of {o.finished} tasks failed on {o.worker_id} ({rate:.0%}) against {rest:.1%} on the rest of "
                     f"the pool: that many by chance has probability {chance:.1e}"),
            evidence=evidence,
            operations={"terminate_worker": TerminateWorker(worker_ids=(o.worker_id,))} if worker else {},
            recommended_action=(f"take {o.worker_id} out of the pool"
                                + (" and rent elsewhere" if worker else "")
                                + "; its failed tasks' logs say why (an image, a driver, the host)"),
        ))
    return found


WORKER_TRAITS = ("image", "gpu_type")
"""What a rented worker runs, as its provider says: what a pool-wide jump may have come with."""


@dataclass(frozen=True)
class PoolRate:
    """The pool's finished and failed tasks as one round read them, and what its workers ran then."""

    at: datetime
    finished: int
    failed: int
    traits: dict[str, Counter] = field(default_factory=dict)
    jumped: bool = False
    """A jump was found in this round: it is no baseline for later ones."""

    @property
    def rate(self) -> float:
        return self.failed / self.finished if self.finished else 0.0


def pool_rate(outcomes: Sequence[Outcomes], workers: Iterable[Worker], now: datetime, *, leave_out: Collection[str] = ()) -> PoolRate:
    """The pool's outcomes this round, the workers in `leave_out` (black holes) left out."""
    counted = [o for o in outcomes if o.worker_id not in leave_out]
    running = [w for w in workers if w.worker_id not in leave_out]
    traits = {key: Counter(str(v) for w in running if (v := getattr(w, key)) is not None) for key in WORKER_TRAITS}
    return PoolRate(now, sum(o.finished for o in counted), sum(o.failed for o in counted), traits)


def failure_jump(current: PoolRate, before: PoolRate | None, policy: FailureJumpPolicy, *, pool: str) -> Finding | None:
    """One finding on the pool when its tasks fail far more than they did (module docstring)."""
    if before is None or current.finished < policy.min_tasks:
        return None
    out = stands_out(current.failed, current.finished, before.failed, before.finished, min_failed=policy.min_failed,
                     min_ratio=policy.min_ratio, alpha=policy.alpha)
    if out is None:
        return None
    was, chance = out.rest, out.chance
    changed = _changed(current, before)
    since = int((current.at - before.at).total_seconds())
    return Finding(
        kind=IncidentKind.FAILURE_JUMP, node_id=pool,
        summary=(f"{current.failed} of {current.finished} tasks failed across the pool ({current.rate:.0%}) against {was:.1%} "
                 f"{since}s before: that many by chance has probability {chance:.1e}"
                 + (f"; what changed: {'; '.join(changed.values())}" if changed else "; nothing the provider lists changed")),
        evidence={"tasks_finished": current.finished, "tasks_failed": current.failed, "failure_rate": round(current.rate, 4),
                  "baseline_rate": round(was, 4), "baseline_finished": before.finished, "baseline_age_s": since,
                  "chance": float(f"{chance:.3g}"), **{f"changed_{key}": text for key, text in changed.items()}},
        recommended_action=("roll back what changed" if changed else "read the failed tasks' logs")
        + "; no worker stands out, so none is ended: the pool's own change is the cause",
    )


def runs_as_the_pool(worker: Worker | None, pool: PoolRate) -> bool:
    """Whether a worker runs what most of the pool runs now (each trait the provider lists); a
    node the provider does not list could run anything, so it is counted as running the same."""
    if worker is None:
        return True
    for key in WORKER_TRAITS:
        value, counts = getattr(worker, key), pool.traits.get(key)
        if value is not None and counts and str(value) != counts.most_common(1)[0][0]:
            return False
    return True


def _changed(current: PoolRate, before: PoolRate) -> dict[str, str]:
    """Each trait whose most common value differs now from the baseline's: 'image a on 9 of 10 workers (was b on 10 of 10)'."""
    changed = {}
    for key in WORKER_TRAITS:
        now_counts, then_counts = current.traits.get(key, Counter()), before.traits.get(key, Counter())
        if not now_counts or not then_counts:
            continue
        (value, n), (old, m) = now_counts.most_common(1)[0], then_counts.most_common(1)[0]
        if value != old:
            changed[key] = (f"{key} {value} on {n} of {sum(now_counts.values())} workers "
                            f"(was {old} on {m} of {sum(then_counts.values())})")
    return changed


class PoolHistory:
    """The pool's rate round by round, for `failure_jump`: the rounds younger than `baseline_age_s`,
    and the newest older one in which no jump was found (the baseline, kept however long a jump
    lasts). In memory: after a restart the pool is judged again once it is `baseline_age_s` old."""

    def __init__(self, policy: FailureJumpPolicy) -> None:
        self.policy = policy
        self.recent: deque[PoolRate] = deque()
        self.before: PoolRate | None = None

    def judge(self, current: PoolRate, *, pool: str) -> Finding | None:
        """The jump `current` shows against the baseline, without keeping `current`."""
        while self.recent and (current.at - self.recent[0].at).total_seconds() >= self.policy.baseline_age_s:
            old = self.recent.popleft()
            if not old.jumped:
                self.before = old
        return failure_jump(current, self.before, self.policy, pool=pool)

    def round(self, current: PoolRate, *, pool: str) -> Finding | None:
        found = self.judge(current, pool=pool)
        self.recent.append(replace(current, jumped=found is not None))
        return found
