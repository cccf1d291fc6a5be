"""Operations on the provider, not on a node: rent a worker (`spawn_worker`), end one
(`terminate_worker`), a few at a time, or restart the pod a node runs on (`restart_worker`). Nothing runs over SSH; each provider call is a step in the audit, as a
drain's are, and errors name the provider and the HTTP status, never the API key.

Renting is limited to the policy's GPU types and size (`actions.spawn_worker`): with no GPU type
listed, nothing is ever rented; one action rents or ends at most `max_count` workers. A
termination is verified: the workers must be gone from the provider's list afterwards. With the
policy's `tasks_query`, no worker is ended mid-task unawares: if one the pool chose as idle took a
task since, none is ended (refused as in use: the surplus asks again), and what an ended worker
still ran is requeued at once. With `failed_tasks_query` and `requeue_tasks.failed_statement`, a
black hole's failed tasks go back to the queue when it is ended (the statement's guard keeps it
to once per task): they failed for the host. A restart
is verified by the pod running again with a start time past the one before (a provider may
answer a restart it did not carry out), within `actions.restart_worker.back_within_s`.
"""

from __future__ import annotations

import asyncio
import re
import time

from gpumedic_events import TASK_ID_PATTERN, ActionOutcome, ActionRequested, IncidentKind, RestartWorker, SpawnWorker, TerminateWorker
from gpumedic_incidents.policy import Actions
from gpumedic_providers.base import Provider, Worker
from remediator.catalogue import taskdb
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, Step, short

TASK_ID = re.compile(TASK_ID_PATTERN)
MAX_TASKS = 500
"""Tasks one requeue names (`RequeueTasks`); more are left to orphaned_tasks."""


def render(operation: SpawnWorker | TerminateWorker | RestartWorker, actions: Actions) -> tuple[str, ...]:
    if isinstance(operation, RestartWorker):
        return ("provider: list workers (the node's pod)", "provider: restart the node's pod", "provider: list workers (until it runs again)")
    if isinstance(operation, TerminateWorker):
        if len(operation.worker_ids) > actions.terminate_worker.max_count:
            raise InvalidParameter(
                f"terminate_worker: {len(operation.worker_ids)} workers is more than actions.terminate_worker.max_count "
                f"({actions.terminate_worker.max_count})"
            )
        asks = actions.terminate_worker.tasks_query is not None
        retries = _retries_failed(actions)
        return (*(line for w in operation.worker_ids
                  for line in ((_asked(w),) if asks else ()) + (_ending(w),) + ((_asked_failed(w), _requeue_failed(w)) if retries else ())),
                "provider: list workers (verify)")
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
    return await _terminate(request, operation, means, commands[-1])


async def _terminate(request: ActionRequested, operation: TerminateWorker, means: Means, verify_command: str) -> ExecutionResult:
    """End the workers one by one, none mid-task unawares. With `tasks_query`: when the pool chose
    them as idle (the request is the pool's, not a worker's own), none is ended if one took a task
    since (the next round chooses again); and what an ended worker still ran (its work since its
    last checkpoint lost) is requeued at once."""
    provider, step = means.need("provider"), means.step
    asks = means.actions.terminate_worker.tasks_query is not None
    if asks and chosen_as_idle(operation, request):
        busy = []
        for worker_id in operation.worker_ids:
            tasks, error = await _tasks_on(worker_id, means)
            if error:
                return ExecutionResult(ActionOutcome.FAILED, f"nothing terminated: what {worker_id} runs could not be read: {error}", [])
            if tasks:
                busy.append(f"{worker_id} took {_tasks(tasks)} since it was chosen as idle")
        if busy:
            return ExecutionResult(ActionOutcome.BLOCKED, f"refused: no worker is ended mid-task; {'; '.join(busy)}", [], in_use=True)
    ended: list[str] = []
    notes: list[str] = []
    for worker_id in operation.worker_ids:
        if error := await step(_ending(worker_id), lambda w=worker_id: provider.terminate(w)):
            done = f" (terminated {', '.join(ended)})" if ended else ""
            return ExecutionResult(ActionOutcome.FAILED, f"{worker_id} not terminated: {error}{done}", [])
        ended.append(worker_id)
        if asks:
            notes += await _requeue_left(worker_id, means)
        if _retries_failed(means.actions) and _kind(request) is IncidentKind.BLACK_HOLE:
            notes += await _requeue_failed_on(worker_id, means)
    listed: list[Worker] = []

    async def verify() -> None:
        listed.extend(await provider.workers())

    names = ", ".join(ended)
    if error := await step(verify_command, verify):
        return ExecutionResult(ActionOutcome.FAILED, f"terminated {names}, but could not verify it: {error}", [])
    still = [w.worker_id for w in listed if w.worker_id in ended and w.status in ("spawning", "running")]
    if still:
        return ExecutionResult(ActionOutcome.FAILED, f"{', '.join(still)} still listed as running after termination", [])
    return ExecutionResult(ActionOutcome.SUCCEEDED, "; ".join([f"terminated {names}", *notes]), [])


def chosen_as_idle(operation: TerminateWorker, request: ActionRequested | None) -> bool:
    """The pool's surplus chose these workers as idle (its request is the pool's; a worker's own
    incident names that worker)."""
    return request is not None and request.node_id not in operation.worker_ids


def _retries_failed(actions: Actions) -> bool:
    return actions.terminate_worker.failed_tasks_query is not None and actions.requeue_tasks.failed_statement is not None


def _kind(request: ActionRequested) -> IncidentKind | None:
    """The incident's kind, from the request's fingerprint (node/kind/gpu)."""
    try:
        return IncidentKind((request.fingerprint or "").split("/")[1])
    except (IndexError, ValueError):
        return None


async def _tasks_on(worker_id: str, means: Means, query: str = "tasks_query") -> tuple[list[str], str]:
    """The ids of the tasks the worker runs now (`tasks_query`), or failed on (`failed_tasks_query`),
    as the task database says; or what went wrong."""
    db, rows = means.need("task_db"), []

    async def read() -> None:
        rows.extend(await db.rows(getattr(means.actions.terminate_worker, query), {"worker_id": worker_id}))

    if error := await means.step(_asked(worker_id) if query == "tasks_query" else _asked_failed(worker_id), read):
        return [], error
    ids = [row[0] if len(row) == 1 else row for row in rows]
    wrong = [t for t in ids if not isinstance(t, str | int) or isinstance(t, bool) or not TASK_ID.fullmatch(str(t))]
    if wrong:
        return [], f"the {query} answered {short(wrong[0])}, which is no task id"
    return [str(t) for t in ids][:MAX_TASKS], ""


async def _requeue_failed_on(worker_id: str, means: Means) -> list[str]:
    """After a black hole's end: the tasks that failed on it go back to the queue, through the
    policy's guarded statement (a task already given another go is not given one again)."""
    tasks, error = await _tasks_on(worker_id, means, "failed_tasks_query")
    if error:
        return [f"the tasks that failed on {worker_id} could not be read ({error}); none requeued"]
    if not tasks:
        return []
    error, changed = await taskdb.write(means, _requeue_failed(worker_id), means.actions.requeue_tasks.failed_statement, {"task_ids": tasks})
    if error:
        return [f"the {_tasks(tasks)} that failed on {worker_id} not requeued ({error})"]
    left = len(tasks) - changed
    again = f" ({left} had been given another go before)" if left else ""
    return [f"requeued {changed} of the {_tasks(tasks)} that failed on {worker_id}{again}"]


async def _requeue_left(worker_id: str, means: Means) -> list[str]:
    """After its end: what the worker still ran goes back to the queue once (the runbook's
    orphaned-task recovery), with the policy's requeue statement; without one, orphaned_tasks will."""
    tasks, error = await _tasks_on(worker_id, means)
    if error:
        return [f"what {worker_id} ran could not be read ({error}); orphaned_tasks requeues it"]
    if not tasks:
        return []
    statement = means.actions.requeue_tasks.statement
    if statement is None:
        return [f"{worker_id} left {_tasks(tasks)} In Progress (actions.requeue_tasks.statement is not set; orphaned_tasks reports them)"]
    error, changed = await taskdb.write(means, f"task database: actions.requeue_tasks.statement for {worker_id}'s {len(tasks)} task(s)",
                                        statement, {"task_ids": tasks})
    if error:
        return [f"{worker_id}'s {_tasks(tasks)} not requeued ({error}); orphaned_tasks requeues them"]
    return [f"requeued {changed} of the {_tasks(tasks)} {worker_id} was running"]


def _asked(worker_id: str) -> str:
    return f"task database: actions.terminate_worker.tasks_query for {worker_id}"


def _asked_failed(worker_id: str) -> str:
    return f"task database: actions.terminate_worker.failed_tasks_query for {worker_id}"


def _requeue_failed(worker_id: str) -> str:
    return f"task database: actions.requeue_tasks.failed_statement for the tasks that failed on {worker_id}"


def _ending(worker_id: str) -> str:
    return f"provider: terminate worker {worker_id}"


def _tasks(tasks: list[str]) -> str:
    shown = ", ".join(tasks[:5]) + (f" and {len(tasks) - 5} more" if len(tasks) > 5 else "")
    return f"{len(tasks)} task(s) ({shown})"


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
