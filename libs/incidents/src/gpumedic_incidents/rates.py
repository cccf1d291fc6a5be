"""Whether one member's failures stand far above the rest's: the judgement a black hole is found
by, whatever counts as a try (a worker's tasks, a node's containers, the pool against itself).

A member stands out when it failed at least `min_failed` times, its failure rate is at least
`min_ratio` times the rest's, and so many failures would be rare by chance: if its tries failed
at the rest's rate, as many failures or more among as many tries (a one-sided binomial tail)
would have a probability below `alpha`. The rest's rate is estimated as (failed + 1/2) /
(tries + 1), so a rest that never failed still gives a rate above 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass


def tail(n: int, k: int, p: float) -> float:
    """P(X >= k) for X ~ Binomial(n, p): how likely k or more failures among n tries are at rate p."""
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


@dataclass(frozen=True)
class StandsOut:
    rate: float
    """The member's failure rate."""
    rest: float
    """The rest's, estimated (module docstring)."""
    chance: float
    """How likely so many failures are at the rest's rate."""


def stands_out(failed: int, tries: int, rest_failed: int, rest_tries: int, *, min_failed: int, min_ratio: float,
               alpha: float) -> StandsOut | None:
    """The member's figures when its failures stand far above the rest's (module docstring), else None."""
    if tries <= 0 or failed < min_failed:
        return None
    rest = (rest_failed + 0.5) / (rest_tries + 1)
    rate = failed / tries
    chance = tail(tries, failed, rest)
    if rate < min_ratio * rest or chance >= alpha:
        return None
    return StandsOut(rate, rest, chance)
