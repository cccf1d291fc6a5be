"""Black holes: workers whose tasks keep failing while every GPU signal may be green. Pure.

A bad image, a broken driver and CUDA pairing or a flaky host fails every task it gets and still
samples healthy; only how its tasks end gives it away. The task database says how each worker's
finished tasks ended over the window of the operator's query (the runbook's `Complete` and
`Failed`), and a worker is a `black_hole` when it fails far more than the rest of the pool:

- it finished at least `min_tasks` tasks, `min_failed` of them failed, and its failure rate is at
  least `min_ratio` times the rest of the pool's;
- and so many failures would be rare by chance: if its tasks failed at the rate of every other
  worker's together, as many failures or more among as many tasks (a one-sided binomial tail)
  would have a probability below `alpha` shared among the workers tested (Bonferroni). The rest
  of the pool's rate is estimated as (failed + 1/2) / (finished + 1), so a pool that never failed
  still gives a rate above 0.

A rate that rises on most workers at once is no one worker's doing (a bad image rolled out to the
pool): it leaves every worker's rate near the rest's, and what does fire on many workers at once
is one fleet incident through the book's correlation, never many drains.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from datetime import datetime

from autoscaler.lifecycle import worker_evidence
from gpumedic_events import IncidentKind, TerminateWorker
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import BlackHolePolicy
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


def tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely k or more failures among n tasks are at rate p."""
    if k <= 0:
        return 1.0
    if k > n or p <= 0.0:
        return 0.0
    if p >= 1.0:
        return 1.0
    log_p, log_q = math.log(p), math.log1p(-p)
    terms: list[float] = []
    top = -math.inf
    for i in range(k, n + 1):
        term = math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * log_p + (n - i) * log_q
        terms.append(term)
        top = max(top, term)
        if i > n * p and term < top - 50:  # past the mode the terms only shrink: the rest is below e-50 of the sum
            break
    return min(1.0, math.exp(top) * sum(math.exp(t - top) for t in terms))


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
        rest = (others_failed + 0.5) / (others_finished + 1)
        rate = o.failed / o.finished
        chance = tail(o.finished, o.failed, rest)
        if o.failed < policy.min_failed or rate < policy.min_ratio * rest or chance >= alpha:
            continue
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
