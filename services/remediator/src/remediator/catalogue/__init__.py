"""The closed catalogue: the only commands the remediator ever runs on a node.

Each typed operation (one module here) renders to a fixed set of simple commands, built from
validated parameters and quoted with `shlex.quote` even after validation, so no value from a
message can become shell syntax on a node. There is no free-form shell anywhere. Each operation
checks on the node that acting is still safe, acts, and verifies its own effect. A simulated
node's SSH server interprets exactly these command forms, and a real Linux node runs them
unchanged: changing a form here means changing the simulated fleet too.

`render` validates everything (including the policy's allow-lists) before anything runs, and
lists every command the operation may run, which observe mode reports as what it would do.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

from gpumedic_events import (
    DockerPrune,
    DrainNode,
    GpuReset,
    HttpAdmin,
    KillGpuProcesses,
    MarkWorkerEnded,
    RebootNode,
    RequeueTasks,
    RestartUnit,
    SpawnWorker,
    TerminateWorker,
    UndrainNode,
)
from gpumedic_incidents.policy import Actions
from remediator.catalogue import admin, docker, drain, gpu, kill, provider, taskdb, units
from remediator.catalogue.base import CommandResult, ExecutionResult, InvalidParameter, Node, Runner

DEFAULT_ACTIONS = Actions()


def render(operation: object, actions: Actions = DEFAULT_ACTIONS) -> tuple[str, ...]:
    """Every distinct command the operation may run, in first-run order; InvalidParameter says
    what is wrong with it (nothing runs then)."""
    match operation:
        case KillGpuProcesses():
            return kill.render(operation)
        case RestartUnit():
            return units.render_restart(operation, actions)
        case GpuReset():
            return gpu.render(operation)
        case DockerPrune():
            return docker.render(operation, actions)
        case RebootNode():
            return units.render_reboot(operation)
        case HttpAdmin():
            return admin.render(operation, actions)
        case DrainNode():
            return drain.render_drain(operation, actions)
        case UndrainNode():
            return drain.render_undrain(operation, actions)
        case SpawnWorker() | TerminateWorker():
            return provider.render(operation, actions)
        case RequeueTasks() | MarkWorkerEnded():
            return taskdb.render(operation, actions)
    raise InvalidParameter(f"operation {type(operation).__name__} is not in the catalogue")


def on_provider(operation: object) -> bool:
    """Whether the operation is a call to the provider (`provider.carry_out`), not a node command."""
    return isinstance(operation, SpawnWorker | TerminateWorker)


def on_task_db(operation: object) -> bool:
    """Whether the operation writes to the user's task database (`taskdb.carry_out`)."""
    return isinstance(operation, RequeueTasks | MarkWorkerEnded)


def on_scheduler(operation: object) -> bool:
    """Whether the operation changes the node's place in the scheduler (`drain`) rather than run
    commands on the node (`execute`)."""
    return isinstance(operation, DrainNode | UndrainNode)


def over_ssh(operation: object) -> bool:
    """Whether the operation logs in to the node (its commands, or an undrain's validation)."""
    return not (on_provider(operation) or on_task_db(operation) or isinstance(operation, DrainNode))


async def execute(
    operation: object,
    run: Runner,
    *,
    actions: Actions = DEFAULT_ACTIONS,
    admin_token: str | None = None,
    verify_timeout_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ExecutionResult:
    """Run one operation through `run`; raises only what `run` raises (the node's errors)."""
    render(operation, actions)
    node = Node(run, verify_timeout_s, sleep, clock)
    match operation:
        case KillGpuProcesses():
            return await kill.execute(operation, node)
        case RestartUnit():
            return await units.restart(operation, node, actions)
        case GpuReset():
            return await gpu.execute(operation, node)
        case DockerPrune():
            return await docker.execute(operation, node, actions)
        case RebootNode():
            return await units.reboot(operation, node)
        case HttpAdmin():
            return await admin.execute(operation, node, actions, admin_token)
    raise InvalidParameter(f"operation {type(operation).__name__} is not in the catalogue")


__all__ = ["CommandResult", "ExecutionResult", "InvalidParameter", "Runner", "drain", "execute", "on_scheduler", "render"]
