"""How many GPUs the task queue wants, with the orchestrator runbook's knobs. Pure.

`wanted = ceil((queued + in progress) / tasks_per_gpu)`, kept within `min_active_gpus` ..
`max_active_gpus` (the runbook's MIN/MAX_ACTIVE_GPUS and TASKS_PER_GPU_THRESHOLD). Capacity is
the GPUs of nodes in service: sampled lately and not drained. Against flapping:

- up at once when wanted is above capacity (a queue waits while nothing is added), as far as the
  $/h budget (`max_cost_per_h`) lets it;
- down only when wanted stays below capacity by at least one whole node for `cooldown_s`
  without a break, no change was made within `cooldown_s`, and only nodes whose GPUs have all
  idled for `idle_timeout_s` (GPU_IDLE_TIMEOUT_SEC) are proposed, the idlest first.

`Scaler` keeps the little memory that needs: when the surplus began, and the last change made
(`changed`, told when a spawn or a termination succeeded, not when it was decided: a decision
that waits for its action stays the decision).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from gpumedic_events.views import SampleLoad
from pydantic import BaseModel, ConfigDict, Field, model_validator

from autoscaler.demand import Demand


@dataclass(frozen=True, slots=True)
class NodeLoad:
    """What the autoscaler keeps of a node's latest sample: when, and each GPU's utilization. (The
    whole sample, with its processes, holders and jobs, is about 30 KB a node at 8 GPUs: 300 MB
    for a 10,000-node fleet, for four numbers a GPU read.)"""

    node_id: str
    occurred_at: datetime
    gpus: tuple[int, ...]
    """Each GPU's utilization in percent (0 where NVML gave none)."""

    @classmethod
    def of(cls, sample: SampleLoad) -> NodeLoad:
        return cls(sample.node_id, sample.occurred_at, tuple(g.utilization_gpu_pct or 0 for g in sample.gpus))

    def busy(self, above_pct: int) -> list[int]:
        """The utilization of each GPU busier than `above_pct`."""
        return [u for u in self.gpus if u > above_pct]


class ScalingPolicy(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")

    min_active_gpus: int = Field(default=0, ge=0)
    max_active_gpus: int = Field(default=8, ge=1)
    tasks_per_gpu: float = Field(default=3.0, gt=0, description="TASKS_PER_GPU_THRESHOLD: tasks one GPU takes on.")
    idle_timeout_s: float = Field(default=600.0, ge=0, description="GPU_IDLE_TIMEOUT_SEC: a node idle this long may go.")
    cooldown_s: float = Field(default=300.0, ge=0, description="A surplus lasts this long, and no change was made within it, before scaling down.")
    gpu_type: str | None = Field(default=None, max_length=64, description="The provider's GPU type rented (one of actions.spawn_worker.gpu_types).")
    gpus_per_worker: int = Field(default=1, ge=1, le=8)
    max_cost_per_h: float | None = Field(default=None, gt=0, description="The pool's $/h budget: no worker is rented beyond it.")
    gpu_price_per_h: float | None = Field(
        default=None, gt=0, description="What one GPU is expected to cost an hour, for the budget before the provider lists one."
    )

    @model_validator(mode="after")
    def _bounds(self) -> ScalingPolicy:
        if self.min_active_gpus > self.max_active_gpus:
            raise ValueError(f"min_active_gpus ({self.min_active_gpus}) is above max_active_gpus ({self.max_active_gpus})")
        if self.max_cost_per_h is not None and self.gpu_price_per_h is None:
            raise ValueError("max_cost_per_h needs gpu_price_per_h (what a GPU is expected to cost until the provider lists one)")
        return self


@dataclass(frozen=True)
class Supply:
    """The nodes in service and their GPUs; `idle_since` for those whose GPUs all idle."""

    gpus: dict[str, int]
    idle_since: dict[str, datetime] = field(default_factory=dict)
    cost_per_h: float = 0.0
    """What the pool costs an hour now, every billed worker included (for the budget)."""
    gpu_price_per_h: float | None = None
    """What a GPU of the type rented costs, as the provider lists it (None: none listed yet)."""

    @property
    def total(self) -> int:
        return sum(self.gpus.values())


@dataclass(frozen=True)
class Decision:
    decision: Literal["hold", "scale_up", "scale_down"]
    gpus_wanted: int
    change_gpus: int
    """GPUs to add (scale_up) or to remove with `release` (scale_down); 0 to hold."""
    reason: str
    release: tuple[str, ...] = ()
    """The idle nodes proposed for removal, idlest first."""


class Scaler:
    def __init__(self, policy: ScalingPolicy) -> None:
        self.policy = policy
        self._surplus_since: datetime | None = None
        self._last_change: datetime | None = None

    def changed(self, now: datetime) -> None:
        """A spawn or termination succeeded: the cool-down starts again."""
        self._last_change = now
        self._surplus_since = None

    def decide(self, demand: Demand, supply: Supply, now: datetime) -> Decision:
        p = self.policy
        tasks = demand.queued + demand.in_progress
        wanted = min(p.max_active_gpus, max(p.min_active_gpus, math.ceil(tasks / p.tasks_per_gpu)))
        have = supply.total
        load = f"{demand.queued} queued + {demand.in_progress} in progress at {p.tasks_per_gpu:g}/GPU"
        if wanted > have:
            self._surplus_since = None
            add, capped = self._affordable(wanted - have, supply)
            if not add:
                return Decision("hold", wanted, 0, f"{load}: {wanted} GPUs wanted, {have} in service; {capped}")
            return Decision("scale_up", wanted, add, f"{load}: {wanted} GPUs wanted, {have} in service{'; ' + capped if capped else ''}")
        smallest = min(supply.gpus.values(), default=0)
        if not smallest or have - wanted < smallest:
            self._surplus_since = None
            return Decision("hold", wanted, 0, f"{load}: {wanted} GPUs wanted, {have} in service")
        self._surplus_since = self._surplus_since or now
        waited = now - self._surplus_since
        calm = self._last_change is None or now - self._last_change >= timedelta(seconds=p.cooldown_s)
        if waited < timedelta(seconds=p.cooldown_s) or not calm:
            return Decision("hold", wanted, 0, f"{load}: {have - wanted} GPUs spare for {waited.total_seconds():.0f}s; "
                            f"scaling down waits {p.cooldown_s:g}s")
        idle = sorted((since, node) for node, since in supply.idle_since.items()
                      if node in supply.gpus and now - since >= timedelta(seconds=p.idle_timeout_s))
        release, freed = [], 0
        for _, node in idle:
            if have - freed - supply.gpus[node] < wanted:
                continue
            release.append(node)
            freed += supply.gpus[node]
        if not release:
            return Decision("hold", wanted, 0, f"{load}: {have - wanted} GPUs spare, but no node has idled {p.idle_timeout_s:g}s")
        return Decision("scale_down", wanted, freed, f"{load}: {wanted} GPUs wanted, {have} in service; "
                        f"{len(release)} node(s) idle {p.idle_timeout_s:g}s+ may go", tuple(release))

    def _affordable(self, gpus: int, supply: Supply) -> tuple[int, str]:
        """The GPUs of the wanted ones the budget allows (whole workers), and why fewer, if so."""
        p = self.policy
        if p.max_cost_per_h is None:
            return gpus, ""
        price = supply.gpu_price_per_h or p.gpu_price_per_h or 0.0
        per_worker = price * p.gpus_per_worker
        workers = math.ceil(gpus / p.gpus_per_worker)
        room = p.max_cost_per_h - supply.cost_per_h
        fits = min(workers, int(room // per_worker)) if per_worker > 0 else workers
        if fits >= workers:
            return gpus, ""
        why = (f"the budget of ${p.max_cost_per_h:.2f}/h allows {max(fits, 0)} more worker(s) at ${per_worker:.2f}/h "
               f"(the pool costs ${supply.cost_per_h:.2f}/h now)")
        return max(fits, 0) * p.gpus_per_worker, why
