"""What a scenario's `pool:` section asks of the simulated worker pool (`PoolPlan`), and what the
pool reports of its run (`PoolFigures`): the shapes `gpumedic_sim.fleet.workers` runs and
`gpumedic_sim.runs.pool_judge` scores, apart from the pool itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated, Literal

from autoscaler.scaling import ScalingPolicy
from gpumedic_providers.sim import machine_id
from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, model_validator

from gpumedic.times import parse_time  # the scenario's own time format ("20s", "2m")

POOL_NODE = "workers"
"""The pool's name in the stack (the autoscaler's default): the node of its capacity incidents."""

Seconds = Annotated[float, BeforeValidator(lambda v: _seconds(v)), Field(ge=0)]


class Stretch(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid", populate_by_name=True)

    seconds: Seconds = Field(alias="for", gt=0)
    tasks_per_min: float = Field(ge=0, le=6000)


class BadMachine(BaseModel):
    """One of the provider's machines with a broken GPU, or one that fails every task while its GPUs
    look fine: every worker that lands on it has it."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    machine: int = Field(ge=1, description="Which of the provider's machines (sim-host-001 is 1).")
    gpu: int = Field(default=0, ge=0, le=7)
    fault: Literal["gpu_lost", "pcie_narrow", "fails_tasks"] = Field(
        description="gpu_lost: the GPU falls off the bus `after` its worker came up; pcie_narrow: its PCIe link at x8 of x16; "
        "fails_tasks: every task its workers finish fails (a broken driver and CUDA pairing), every GPU signal green."
    )
    after: Seconds = Field(default=0.0, description="How long after the worker came up the fault shows (0: from the start).")

    @property
    def host_id(self) -> str:
        return machine_id(self.machine)


class PoolPlan(BaseModel):
    """A scenario's `pool:` section."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    demand: tuple[Stretch, ...] = Field(min_length=1, max_length=100, description="Task arrivals, stretch after stretch.")
    task: Seconds = Field(default=20.0, gt=0, description="How long a task runs on a GPU.")
    spawn: Seconds = Field(default=6.0, description="How long a rented worker takes to come up.")
    never_ssh_every: int = Field(default=0, ge=0, description="Every n-th rented worker never comes up (0: none).")
    workers_die_at: tuple[Seconds, ...] = Field(default=(), max_length=100, description="When the busiest worker dies silently.")
    gpu_type: str = Field(default="H100", pattern=r"^[A-Za-z0-9 _.-]{1,64}$")
    price_per_gpu_h: float = Field(default=2.49, gt=0)
    machines: int = Field(default=0, ge=0, le=1000, description="The provider's machines, rented in turn (0: each worker its own).")
    bad_machines: tuple[BadMachine, ...] = Field(default=(), max_length=100)
    fail_share: float = Field(default=0.0, ge=0, lt=1, description="Ordinary failures: each task fails with this chance, on any worker.")
    rollout: Rollout | None = Field(default=None, description="A bad image rolled out to every worker (a failure_jump on the pool).")
    burn_in: bool = Field(
        default=False, description="gpumedic accepts each new worker before it takes tasks (kinds.burn_in.required): its record "
        "is `spawning` until accept_worker promotes it to `active`.",
    )
    scaling: ScalingPolicy = ScalingPolicy(
        min_active_gpus=2, max_active_gpus=16, tasks_per_gpu=3, idle_timeout_s=10, cooldown_s=20, gpus_per_worker=2,
    )

    @model_validator(mode="after")
    def _machines_exist(self) -> PoolPlan:
        for bad in self.bad_machines:
            if bad.machine > self.machines:
                raise ValueError(f"bad_machines: machine {bad.machine} is beyond the provider's {self.machines} machine(s)")
            if bad.gpu >= self.scaling.gpus_per_worker:
                raise ValueError(f"bad_machines: GPU {bad.gpu} is beyond a worker's {self.scaling.gpus_per_worker} GPU(s)")
        return self

    @model_validator(mode="after")
    def _the_type_rented(self) -> PoolPlan:
        if self.scaling.gpu_type not in (None, self.gpu_type):
            raise ValueError(f"scaling.gpu_type {self.scaling.gpu_type!r} is not the pool's gpu_type {self.gpu_type!r}")
        return self.model_copy(update={"scaling": self.scaling.model_copy(update={"gpu_type": self.gpu_type})})

    @property
    def demand_s(self) -> float:
        return sum(s.seconds for s in self.demand)


class Rollout(BaseModel):
    """A new image rolled out to the whole pool at `at` (every pod lists it from then on, new ones
    too): from then, each task fails with `fail_share`, wherever it runs."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    at: Seconds
    image: str = Field(pattern=r"^[A-Za-z0-9._/:@-]{1,200}$")
    fail_share: float = Field(gt=0, lt=1)


@dataclass
class PoolFigures:
    tasks: int
    done: int
    failed: int
    wait_p95_s: float
    gpu_s: float
    fixed_gpu_s: float
    """What a fixed fleet of max_active_gpus would have billed over the same run."""
    idle_gpu_s: float
    cost: float
    peak_gpus_billed: int
    rented: list[str]
    never_came_up: list[str]
    never_came_up_ended: int
    died: list[str]
    died_ended: int
    ended_busy: list[str]
    """Workers ended while running tasks: for their own fault (a bad machine's), or by a scale-in
    that ended a worker mid-task (which the remediator's tasks_query is there to prevent)."""
    orphaned: int
    """Tasks In Progress on a worker when it died or was ended."""
    requeued: dict[str, int]
    """Task id -> times requeued."""
    failed_first_on: dict[str, int] = field(default_factory=dict)
    """Worker -> tasks that failed there first."""
    retried_from: dict[str, int] = field(default_factory=dict)
    """Worker -> tasks that failed there first and were given another go (a black hole's, requeued)."""
    machines: dict[str, str] = field(default_factory=dict)
    """Worker -> the provider's machine it was rented on."""
    took: dict[str, int] = field(default_factory=dict)
    """Worker -> tasks it took."""
    came_up: dict[str, float] = field(default_factory=dict)
    """Worker -> seconds into the run it came up."""
    ended_at: dict[str, float] = field(default_factory=dict)
    """Worker -> seconds into the run the provider ended it (its records: the bill stops there)."""
    rented_at: dict[str, float] = field(default_factory=dict)
    """Worker -> seconds into the run it was rented."""
    started_at: datetime | None = None
    """When the run began, by the wall clock (what incidents are timed by)."""

    @property
    def requeued_once(self) -> bool:
        return self.orphaned == len(self.requeued) and all(n == 1 for n in self.requeued.values())


def _seconds(value: object) -> object:
    return parse_time(value) if isinstance(value, str | int | float) and not isinstance(value, bool) else value
