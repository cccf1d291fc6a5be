"""The closed catalogue: the only commands the remediator ever runs on a node.

Each typed operation (one module here) renders to a fixed set of simple commands, built from
validated parameters and quoted with `shlex.quote` even after validation, so no value from a
message can become shell syntax on a node. There is no free-form shell anywhere. Each operation
checks on the node that acting is still safe, acts, and verifies its own effect. A simulated
node's SSH server interprets exactly these command forms, and a real Linux node runs them
unchanged: changing a form here means changing the simulated fleet too.

`OPERATIONS` is the one table of them: for each operation, how it renders and runs, whether it
logs in to the node, whether it counts as a fix, when it fits an incident, which nodes the policy
limits it to, which workers it retires, whether it needs the admin token and whose work it ends
(the checkpoint step asks them first). The gate and the
handler ask the table, never the operation's type. Adding one is an entry here and a module
beside it. `render` validates everything (including the policy's allow-lists) before anything
runs, and lists every command the operation may run, which observe mode reports as what it
would do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

from gpumedic_events import (
    AcceptWorker,
    ActionRequested,
    DockerPrune,
    DrainNode,
    GpuReset,
    HttpAdmin,
    KillGpuProcesses,
    KillPattern,
    MarkWorkerEnded,
    RebootNode,
    RequeueTasks,
    RestartJob,
    RestartUnit,
    RestartWorker,
    SpawnWorker,
    StopJob,
    TerminateWorker,
    UndrainNode,
)
from gpumedic_incidents.policy import Actions, CheckpointPolicy, NodeScoped
from remediator.catalogue import accept, admin, checkpoint, docker, drain, gpu, jobs, kill, pattern, provider, stop, taskdb, units
from remediator.catalogue.base import CommandResult, ExecutionResult, Fit, InvalidParameter, Means, Node, Runner

DEFAULT_ACTIONS = Actions()

Render = Callable[[Any, Actions], tuple[str, ...]]
Run = Callable[[Any, Means], Awaitable[ExecutionResult]]
Fits = Callable[[Any, Fit], str]
Scope = Callable[[Any, Actions], tuple[NodeScoped, str, str] | None]
Retires = Callable[[Any], tuple[str, ...]]
Reaches = Callable[[Any], tuple[str, ...]]


def fits_any(operation: object, fit: Fit) -> str:
    return ""


def unscoped(operation: object, actions: Actions) -> None:
    return None


def retires_none(operation: object) -> tuple[str, ...]:
    return ()


def reaches_its_own(operation: object) -> tuple[str, ...]:
    return ()


def on_node(execute: Callable[[Any, Node, Means], Awaitable[ExecutionResult]]) -> Run:
    """An operation of commands on the node: it runs in one SSH session."""

    async def run(operation: Any, means: Means) -> ExecutionResult:
        async with means.node() as node:
            return await execute(operation, node, means)

    return run


@dataclass(frozen=True)
class Spec:
    render: Render
    """Every distinct command it may run; InvalidParameter on a parameter it cannot take."""
    run: Run
    logs_in: bool
    """Whether it logs in to the node (its commands, or an undrain's check), so needs it in the inventory."""
    fix: bool = True
    """Whether it may harm a job, so counts towards the per-node limit and the breaker. Moving jobs
    away from a node or back, adding a worker, requeueing a gone worker's tasks, marking its record
    ended, starting a job again and accepting a new worker harm none (an open breaker still holds them)."""
    rollout_counts: bool = False
    """Whether a fleet operation of it counts towards the breaker though it is no fix: a drain of the
    whole fleet takes its capacity as surely as a fix on every node would (the nodes rollouts
    drained within the window count as acted on)."""
    fits: Fits = fits_any
    """Why it does not fit the incident now ('' when it does), beyond the ladder naming it."""
    scope: Scope = unscoped
    """The policy's entry that limits it to some nodes, what that entry allows and where it is."""
    retires: Retires = retires_none
    """The workers it ends for good when it succeeds."""
    admin_token: bool = False
    """Whether it carries the admin endpoints' token (read only for it: a token file may be rotated)."""
    after_kill: bool = False
    """Whether it runs only after a kill the ledger verified (the handler looks up the ledger's kill)."""
    ends_work: checkpoint.Jobs | None = None
    """Whose work it ends: those the checkpoint step asks first, where the kind's policy sets one."""
    reaches: Reaches = reaches_its_own
    """Every node it logs in to beyond the request's (a job's ranks): each must be in the inventory and unprotected.
    It counts once for the breaker: one decision about one incident."""


OPERATIONS: dict[type, Spec] = {
    KillGpuProcesses: Spec(kill.render, on_node(kill.execute), logs_in=True, fits=kill.fits, ends_work=checkpoint.targets),
    RestartUnit: Spec(units.render_restart, on_node(units.restart), logs_in=True, fits=units.fits_restart, scope=units.scope),
    GpuReset: Spec(gpu.render, on_node(gpu.execute), logs_in=True, ends_work=checkpoint.one_gpu),
    DockerPrune: Spec(docker.render, on_node(docker.execute), logs_in=True),
    RebootNode: Spec(units.render_reboot, on_node(units.reboot), logs_in=True, ends_work=checkpoint.whole_node),
    HttpAdmin: Spec(admin.render, admin.execute, logs_in=True, fits=admin.fits, scope=admin.scope, admin_token=True),
    RestartJob: Spec(jobs.render, jobs.run, logs_in=True, fix=False, fits=jobs.fits, scope=jobs.scope, after_kill=True,
                     reaches=jobs.reaches),
    DrainNode: Spec(drain.render_drain, drain.drain, logs_in=False, fix=False, rollout_counts=True, ends_work=checkpoint.whole_node),
    UndrainNode: Spec(drain.render_undrain, drain.undrain, logs_in=True, fix=False),
    SpawnWorker: Spec(provider.render, provider.carry_out, logs_in=False, fix=False),
    TerminateWorker: Spec(provider.render, provider.carry_out, logs_in=False, fits=provider.fits_terminate,
                          retires=lambda operation: tuple(operation.worker_ids), ends_work=checkpoint.the_worker),
    RestartWorker: Spec(provider.render, provider.carry_out, logs_in=False, ends_work=checkpoint.whole_node),
    RequeueTasks: Spec(taskdb.render, taskdb.carry_out, logs_in=False, fix=False),
    MarkWorkerEnded: Spec(taskdb.render, taskdb.carry_out, logs_in=False, fix=False, fits=taskdb.fits_mark_ended,
                          retires=lambda operation: (operation.worker_id,)),
    AcceptWorker: Spec(accept.render, on_node(accept.execute), logs_in=True, fix=False),
    StopJob: Spec(stop.render, stop.execute, logs_in=True, fits=stop.fits, reaches=stop.reaches),
    KillPattern: Spec(pattern.render, on_node(pattern.execute), logs_in=True, fits=pattern.fits, scope=pattern.scope,
                      ends_work=checkpoint.idle_node),
}

NOT_FIXES = tuple(sorted(kind.model_fields["operation"].default for kind, spec in OPERATIONS.items() if not spec.fix))
"""The names of the operations that are no fix, as the ledger stores them (its breaker queries read them)."""


def spec_of(operation: object) -> Spec:
    spec = OPERATIONS.get(type(operation))
    if spec is None:
        raise InvalidParameter(f"operation {type(operation).__name__} is not in the catalogue")
    return spec


def render(operation: object, actions: Actions = DEFAULT_ACTIONS) -> tuple[str, ...]:
    """Every distinct command the operation may run, in first-run order; InvalidParameter says
    what is wrong with it (nothing runs then)."""
    return spec_of(operation).render(operation, actions)



async def perform(operation: object, means: Means) -> ExecutionResult:
    """Run one operation through `means`, after validating it; raises only what the means raise
    (the node's, provider's or store's errors) and InvalidParameter."""
    spec = spec_of(operation)
    spec.render(operation, means.actions)
    if spec.ends_work is None or means.checkpoint is None:
        return await spec.run(operation, means)
    asked = await checkpoint.first(spec.ends_work(operation, means.request), means.checkpoint, means)
    result = await spec.run(operation, means)
    result.detail = f"{asked}; then {result.detail}"
    return result


async def execute(
    operation: object,
    run: Runner,
    *,
    actions: Actions = DEFAULT_ACTIONS,
    admin_token: str | None = None,
    request: ActionRequested | None = None,
    verify_timeout_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
    checkpoint: CheckpointPolicy | None = None,
) -> ExecutionResult:
    """Run one node operation through `run` (one SSH session's, also for an operation called `at`
    another node), as `perform` does; `checkpoint`: the incident's kind's checkpoint step."""
    node = Node(run, verify_timeout_s, sleep, clock)

    @asynccontextmanager
    async def session(at: str | None = None) -> AsyncIterator[Node]:
        yield node  # `at` too: the one session given

    return await perform(operation, Means(actions=actions, node=session, request=request, admin_token=lambda: admin_token,
                                          checkpoint=checkpoint))


__all__ = [
    "NOT_FIXES", "OPERATIONS", "CommandResult", "ExecutionResult", "Fit", "InvalidParameter", "Means", "Node", "Runner", "Spec", "execute", "perform",
    "render", "spec_of",
]
