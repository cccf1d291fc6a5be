"""Writes to the user's task database, not to a node: requeue the tasks left on a worker that is
gone (`requeue_tasks`), mark a worker's record ended (`mark_worker_ended`). Each runs the one
statement the policy holds for it (`actions.<operation>.statement`), with its parameter bound by
the driver; with no statement it never runs. The statement is the operator's, so a requeue
guarded by `status = 'In Progress'` happens once however often it is asked; the rows it changed
are the outcome's evidence.
"""

from __future__ import annotations

from gpumedic_events import ActionOutcome, MarkWorkerEnded, RequeueTasks
from gpumedic_incidents.policy import Actions, TaskDbPolicy
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means


def _rule(operation: RequeueTasks | MarkWorkerEnded, actions: Actions) -> TaskDbPolicy:
    rule = actions.of(operation.operation)
    if rule.statement is None:
        raise InvalidParameter(f"{operation.operation}: actions.{operation.operation}.statement is not set, so it never runs")
    return rule


def render(operation: RequeueTasks | MarkWorkerEnded, actions: Actions) -> tuple[str, ...]:
    _rule(operation, actions)
    if isinstance(operation, RequeueTasks):
        return (f"task database: actions.requeue_tasks.statement with {len(operation.task_ids)} task id(s)",)
    return (f"task database: actions.mark_worker_ended.statement for {operation.worker_id}",)


def fits_mark_ended(operation: MarkWorkerEnded, fit: Fit) -> str:
    if operation.worker_id != fit.incident.node_id:
        return f"a {fit.kind} incident marks worker {fit.incident.node_id} ended only, not {operation.worker_id}"
    return ""


async def carry_out(operation: RequeueTasks | MarkWorkerEnded, means: Means) -> ExecutionResult:
    statement = _rule(operation, means.actions).statement
    params = {"task_ids": list(operation.task_ids)} if isinstance(operation, RequeueTasks) else {"worker_id": operation.worker_id}
    error, changed = await write(means, render(operation, means.actions)[0], statement, params)
    if error:
        return ExecutionResult(ActionOutcome.FAILED, f"{operation.describe()}: not done: {error}", [])
    if isinstance(operation, RequeueTasks):
        left = len(operation.task_ids) - changed
        note = f"; {left} were no longer In Progress (already requeued or finished)" if left > 0 else ""
        return ExecutionResult(ActionOutcome.SUCCEEDED, f"requeued {changed} of {len(operation.task_ids)} task(s){note}", [])
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"marked {operation.worker_id} ended ({changed} record(s) changed)", [])


async def write(means: Means, command: str, statement: str, params: dict) -> tuple[str, int]:
    """Run one of the policy's statements in the task database as an audited step: ('', the rows
    it changed), or (what went wrong, 0)."""
    db, changed = means.need("task_db"), []

    async def run() -> None:
        changed.append(await db.execute(statement, params))

    error = await means.step(command, run)
    return error, changed[0] if changed else 0
