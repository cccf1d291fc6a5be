"""The closed catalogue: the only commands the remediator ever runs on a node.

Each typed operation (one module here) renders to a fixed set of simple commands, built from
validated parameters and quoted with `shlex.quote` even after validation, so no value from a
message can become shell syntax on a node. There is no free-form shell anywhere. Each operation
checks on the node that acting is still safe, acts, and verifies its own effect. A simulated
node's SSH server interprets exactly these command forms, and a real Linux node runs them
unchanged: changing a form here means changing the simulated fleet too.

`OPERATIONS` is the one table of them: for each operation, how it renders, how it runs, and
whether it logs in to the node. Adding one is an entry here and a module beside it. `render`
validates everything (including the policy's allow-lists) before anything runs, and lists every
command the operation may run, which observe mode reports as what it would do.
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
    MarkWorkerEnded,
    RebootNode,
    RequeueTasks,
    RestartJob,
    RestartUnit,
    RestartWorker,
    SpawnWorker,
    TerminateWorker,
    UndrainNode,
)
from gpumedic_incidents.policy import Actions
from remediator.catalogue import accept, admin, docker, drain, gpu, jobs, kill, provider, taskdb, units
from remediator.catalogue.base import CommandResult, ExecutionResult, InvalidParameter, Means, Node, Runner

DEFAULT_ACTIONS = Actions()

Render = Callable[[Any, Actions], tuple[str, ...]]
Run = Callable[[Any, Means], Awaitable[ExecutionResult]]


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


OPERATIONS: dict[type, Spec] = {
    KillGpuProcesses: Spec(kill.render, on_node(kill.execute), logs_in=True),
    RestartUnit: Spec(units.render_restart, on_node(units.restart), logs_in=True),
    GpuReset: Spec(gpu.render, on_node(gpu.execute), logs_in=True),
    DockerPrune: Spec(docker.render, on_node(docker.execute), logs_in=True),
    RebootNode: Spec(units.render_reboot, on_node(units.reboot), logs_in=True),
    HttpAdmin: Spec(admin.render, admin.execute, logs_in=True),
    RestartJob: Spec(jobs.render, on_node(jobs.execute), logs_in=True),
    DrainNode: Spec(drain.render_drain, drain.drain, logs_in=False),
    UndrainNode: Spec(drain.render_undrain, drain.undrain, logs_in=True),
    SpawnWorker: Spec(provider.render, provider.carry_out, logs_in=False),
    TerminateWorker: Spec(provider.render, provider.carry_out, logs_in=False),
    RestartWorker: Spec(provider.render, provider.carry_out, logs_in=False),
    RequeueTasks: Spec(taskdb.render, taskdb.carry_out, logs_in=False),
    MarkWorkerEnded: Spec(taskdb.render, taskdb.carry_out, logs_in=False),
    AcceptWorker: Spec(accept.render, on_node(accept.execute), logs_in=True),
}


def spec_of(operation: object) -> Spec:
    spec = OPERATIONS.get(type(operation))
    if spec is None:
        raise InvalidParameter(f"operation {type(operation).__name__} is not in the catalogue")
    return spec


def render(operation: object, actions: Actions = DEFAULT_ACTIONS) -> tuple[str, ...]:
    """Every distinct command the operation may run, in first-run order; InvalidParameter says
    what is wrong with it (nothing runs then)."""
    return spec_of(operation).render(operation, actions)


def logs_in(operation: object) -> bool:
    """Whether the operation logs in to the node (its commands, or an undrain's validation)."""
    return spec_of(operation).logs_in


async def perform(operation: object, means: Means) -> ExecutionResult:
    """Run one operation through `means`, after validating it; raises only what the means raise
    (the node's, provider's or store's errors) and InvalidParameter."""
    spec = spec_of(operation)
    spec.render(operation, means.actions)
    return await spec.run(operation, means)


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
) -> ExecutionResult:
    """Run one node operation through `run` (one SSH session's, also for an operation called `at`
    another node), as `perform` does."""
    node = Node(run, verify_timeout_s, sleep, clock)

    @asynccontextmanager
    async def session(at: str | None = None) -> AsyncIterator[Node]:
        yield node  # `at` too: the one session given

    return await perform(operation, Means(actions=actions, node=session, request=request, admin_token=lambda: admin_token))


__all__ = [
    "OPERATIONS", "CommandResult", "ExecutionResult", "InvalidParameter", "Means", "Node", "Runner", "execute", "logs_in", "perform", "render",
]
