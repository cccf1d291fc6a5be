"""Operations on the provider, not on a node: rent a worker (`spawn_worker`), end one
(`terminate_worker`), a few at a time, or restart the pod a node runs on (`restart_worker`). Nothing runs over SSH; each provider call is a step in the audit, as a
drain's are, and errors name the provider and the HTTP status, never the API key.

Renting is limited to the policy's GPU types and size (`actions.spawn_worker`): with no GPU type
listed, nothing is ever rented; one action rents or ends at most `max_count` workers. A
termination is verified: the workers must be gone from the provider's list afterwards. A restart
is verified by the pod running again with a start time past the one before (a provider may
answer a restart it did not carry out), within `actions.restart_worker.back_within_s`.
"""

from __future__ import annotations

import asyncio
import time

from gpumedic_events import ActionOutcome, ActionRequested, IncidentKind, RestartWorker, SpawnWorker, TerminateWorker
from gpumedic_incidents.policy import Actions
from gpumedic_providers.base import Provider, Worker
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, Step


def render(operation: SpawnWorker | TerminateWorker | RestartWorker, actions: Actions) -> tuple[str, ...]:
    if isinstance(operation, RestartWorker):
        return ("provider: list workers (the node's pod)", "provider: restart the node's pod", "provider: list workers (until it runs again)")
    if isinstance(operation, TerminateWorker):
        if len(operation.worker_ids) > actions.terminate_worker.max_count:
            raise InvalidParameter(
                f"terminate_worker: {len(operation.worker_ids)} workers is more than actions.terminate_worker.max_count "
                f"({actions.terminate_worker.max_count})"
            )
        return (*(f"provider: terminate worker {w}" for w in operation.worker_ids), "provider: list workers (verify)")
    rule = actions.spawn_worker
    if operation.gpu_type not in rule.gpu_types:
        allowed = ", ".join(rule.gpu_types) or "none"
        raise InvalidParameter(f"spawn_worker: GPU type {operation.gpu_type!r} is not in actions.spawn_worker.gpu_types ({allowed})")
    if operation.gpus > rule.max_gpus:
        raise InvalidParameter(f"spawn_worker: {operation.gpus} GPUs is more than actions.spawn_worker.max_gpus ({rule.max_gpus})")
    if operation.count > rule.max_count:
        raise InvalidParameter(f"spawn_worker: {operation.count} workers is more than actions.spawn_worker.max_count ({rule.max_count})")
    return (f"provider: rent a worker with {operation.gpus} x {operation.gpu_type}",)


def fits_terminate(operation: TerminateWorker, fit: Fit) -> str:
    """A worker's own incident ends that worker; only the pool's surplus picks which ones."""
    incident = fit.incident
    if incident.kind is not IncidentKind.CAPACITY_SURPLUS and operation.worker_ids != (incident.node_id,):
        return f"a {fit.kind} incident ends worker {incident.node_id} only, not {', '.join(operation.worker_ids)}"
    return ""


async def carry_out(operation: SpawnWorker | TerminateWorker | RestartWorker, means: Means) -> ExecutionResult:
    request, provider, step = means.need("request"), means.need("provider"), means.step
    commands = render(operation, means.actions)
    if isinstance(operation, RestartWorker):
        return await _restart(request.node_id, means.actions, commands, provider, step)
    if isinstance(operation, SpawnWorker):
        return await _spawn(request, operation, commands[0], provider, step)
    ended: list[str] = []
    for worker_id, command in zip(operation.worker_ids, commands, strict=False):
        if error := await step(command, lambda w=worker_id: provider.terminate(w)):
            done = f" (terminated {', '.join(ended)})" if ended else ""
            return ExecutionResult(ActionOutcome.FAILED, f"{worker_id} not terminated: {error}{done}", [])
        ended.append(worker_id)
    listed: list[Worker] = []

    async def verify() -> None:
        listed.extend(await provider.workers())

    names = ", ".join(ended)
    if error := await step(commands[-1], verify):
        return ExecutionResult(ActionOutcome.FAILED, f"terminated {names}, but could not verify it: {error}", [])
    still = [w.worker_id for w in listed if w.worker_id in ended and w.status in ("spawning", "running")]
    if still:
        return ExecutionResult(ActionOutcome.FAILED, f"{', '.join(still)} still listed as running after termination", [])
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"terminated {names}", [])


async def _spawn(request: ActionRequested, operation: SpawnWorker, command: str, provider: Provider, step: Step) -> ExecutionResult:
    """Rent the workers one by one; a failure stops there and says what was rented before it."""
    rented: list[Worker] = []
    for n in range(operation.count):

        async def rent(n: int = n) -> None:
            rented.append(await provider.create(f"gpumedic-{str(request.action_id)[:8]}-{n + 1}", operation.gpu_type, operation.gpus))

        if error := await step(command, rent):
            if not rented:
                return ExecutionResult(ActionOutcome.FAILED, f"nothing rented: {error}", [])
            return ExecutionResult(ActionOutcome.FAILED, f"rented {_listed(rented)}, then: {error}", [])
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"rented {_listed(rented)}", [])


async def _restart(node: str, actions: Actions, commands: tuple[str, ...], provider: Provider, step: Step) -> ExecutionResult:
    """Find the node's pod (its id or name is the node's id), restart it, wait for it to run again."""
    rule = actions.restart_worker
    listed: list[Worker] = []

    async def find() -> Worker | None:
        listed[:] = await provider.workers()
        return _pod_of(node, listed)

    if error := await step(commands[0], find):
        return ExecutionResult(ActionOutcome.FAILED, f"the provider's workers could not be listed: {error}", [])
    pod = _pod_of(node, listed)
    if pod is None:
        return ExecutionResult(
            ActionOutcome.FAILED, f"node {node} is no worker {provider.name} rents (no pod has it as its id or name): a person must restart it", []
        )
    before = pod.started_at
    if error := await step(commands[1], lambda: provider.restart(pod.worker_id)):
        return ExecutionResult(ActionOutcome.FAILED, f"pod {pod.worker_id} not restarted: {error}", [])
    deadline = time.monotonic() + rule.back_within_s
    seen = "not listed"
    while time.monotonic() < deadline:
        await asyncio.sleep(min(rule.poll_s, max(0.0, deadline - time.monotonic())))
        if await step(commands[2], find):
            continue  # the provider may be slow to answer while the pod restarts: ask again
        now = _pod_of(node, listed)
        if now is None:
            return ExecutionResult(ActionOutcome.FAILED, f"pod {pod.worker_id} is gone from {provider.name}'s list after its restart", [])
        seen = f"{now.status}, last started {now.started_at:%Y-%m-%d %H:%M:%S}Z" if now.started_at else now.status
        if now.status == "running" and now.started_at is not None and (before is None or now.started_at > before):
            return ExecutionResult(ActionOutcome.SUCCEEDED, f"restarted pod {pod.worker_id}: running again since {now.started_at:%H:%M:%S}Z", [])
    return ExecutionResult(
        ActionOutcome.FAILED, f"pod {pod.worker_id} was asked to restart but is not running again after {rule.back_within_s:g}s ({seen})", []
    )


def _pod_of(node: str, workers: list[Worker]) -> Worker | None:
    return next((w for w in workers if w.worker_id == node), None) or next((w for w in workers if w.name == node), None)


def _listed(workers: list[Worker]) -> str:
    w = workers[0]
    ids = ", ".join(x.worker_id for x in workers)
    return f"{len(workers)} worker(s) of {w.gpus} x {w.gpu_type} at ${w.price_per_h:.2f}/h each: {ids}"
