"""Operations on the provider, not on a node: rent a worker (`spawn_worker`), end one
(`terminate_worker`), a few at a time. Nothing runs over SSH; each provider call is a step in the audit, as a
drain's are, and errors name the provider and the HTTP status, never the API key.

Renting is limited to the policy's GPU types and size (`actions.spawn_worker`): with no GPU type
listed, nothing is ever rented; one action rents or ends at most `max_count` workers. A
termination is verified: the workers must be gone from the provider's list afterwards.
"""

from __future__ import annotations

from gpumedic_events import ActionOutcome, ActionRequested, SpawnWorker, TerminateWorker
from gpumedic_incidents.policy import Actions
from gpumedic_providers.base import Provider, Worker
from remediator.catalogue.base import ExecutionResult, InvalidParameter, Means, Step


def render(operation: SpawnWorker | TerminateWorker, actions: Actions) -> tuple[str, ...]:
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


async def carry_out(operation: SpawnWorker | TerminateWorker, means: Means) -> ExecutionResult:
    request, provider, step = means.need("request"), means.need("provider"), means.step
    commands = render(operation, means.actions)
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


def _listed(workers: list[Worker]) -> str:
    w = workers[0]
    ids = ", ".join(x.worker_id for x in workers)
    return f"{len(workers)} worker(s) of {w.gpus} x {w.gpu_type} at ${w.price_per_h:.2f}/h each: {ids}"
