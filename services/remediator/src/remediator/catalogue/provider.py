"""Operations on the provider, not on a node: rent a worker (`spawn_worker`), end one
(`terminate_worker`). Nothing runs over SSH; each provider call is a step in the audit, as a
drain's are, and errors name the provider and the HTTP status, never the API key.

Renting is limited to the policy's GPU types and size (`actions.spawn_worker`): with no GPU type
listed, nothing is ever rented. A termination is verified: the worker must be gone from the
provider's list afterwards.
"""

from __future__ import annotations

from gpumedic_events import ActionOutcome, ActionRequested, SpawnWorker, TerminateWorker
from gpumedic_incidents.policy import Actions
from gpumedic_providers.base import Provider, Worker
from remediator.catalogue.base import ExecutionResult, InvalidParameter, Step


def render(operation: SpawnWorker | TerminateWorker, actions: Actions) -> tuple[str, ...]:
    if isinstance(operation, TerminateWorker):
        return (f"provider: terminate worker {operation.worker_id}", "provider: list workers (verify)")
    rule = actions.spawn_worker
    if operation.gpu_type not in rule.gpu_types:
        allowed = ", ".join(rule.gpu_types) or "none"
        raise InvalidParameter(f"spawn_worker: GPU type {operation.gpu_type!r} is not in actions.spawn_worker.gpu_types ({allowed})")
    if operation.gpus > rule.max_gpus:
        raise InvalidParameter(f"spawn_worker: {operation.gpus} GPUs is more than actions.spawn_worker.max_gpus ({rule.max_gpus})")
    return (f"provider: rent a worker with {operation.gpus} x {operation.gpu_type}",)


async def carry_out(request: ActionRequested, actions: Actions, provider: Provider, step: Step) -> ExecutionResult:
    operation = request.operation
    commands = render(operation, actions)
    if isinstance(operation, SpawnWorker):
        rented: list[Worker] = []

        async def rent() -> None:
            rented.append(await provider.create(f"gpumedic-{str(request.action_id)[:8]}", operation.gpu_type, operation.gpus))

        if error := await step(commands[0], rent):
            return ExecutionResult(ActionOutcome.FAILED, f"nothing rented: {error}", [])
        worker = rented[0]
        return ExecutionResult(
            ActionOutcome.SUCCEEDED,
            f"rented {worker.worker_id} ({worker.gpus} x {worker.gpu_type}, ${worker.price_per_h:.2f}/h), {worker.status}",
            [],
        )
    if error := await step(commands[0], lambda: provider.terminate(operation.worker_id)):
        return ExecutionResult(ActionOutcome.FAILED, f"{operation.worker_id} not terminated: {error}", [])
    listed: list[Worker] = []

    async def verify() -> None:
        listed.extend(await provider.workers())

    if error := await step(commands[1], verify):
        return ExecutionResult(ActionOutcome.FAILED, f"terminated {operation.worker_id}, but could not verify it: {error}", [])
    if any(w.worker_id == operation.worker_id and w.status in ("spawning", "running") for w in listed):
        return ExecutionResult(ActionOutcome.FAILED, f"{operation.worker_id} is still listed as running after its termination", [])
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"terminated {operation.worker_id}", [])
