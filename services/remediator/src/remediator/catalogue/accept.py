"""accept_worker: the on-node half of a newly rented worker's burn-in (`kinds.burn_in`), then its
promotion.

Read-only on the node: pre-flight's look at every GPU (it answers NVML, lets jobs in, runs no
process, nothing but known daemons holds its device file, and it uses at most the policy's
memory), then DCGM's diagnostic at `actions.accept_worker.dcgm_diag` where the node has DCGM (a
node without it is said, and the rest stands). When all pass, the policy's
`actions.accept_worker.statement` promotes the worker in the user's task database (the runbook's
`spawning` -> `active`), where one is set. A check that fails is the outcome FAILED with what
failed, and nothing is promoted; the burn-in then ends the worker.
"""

from __future__ import annotations

from gpumedic_events import AcceptWorker, ActionOutcome
from gpumedic_incidents.policy import Actions
from remediator.catalogue import diag, preflight, taskdb
from remediator.catalogue.base import ExecutionResult, Means, Node

PROMOTE = "task database: actions.accept_worker.statement for the worker"
LOOK = (
    preflight.GPU_STATE,
    "nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=GPU (each GPU)",
    "fuser /dev/nvidiaGPU (each GPU)",
    "cat /proc/PID/stat (each process found)",
)


def render(operation: AcceptWorker, actions: Actions) -> tuple[str, ...]:
    rule = actions.accept_worker
    check = (diag.FIND, diag.command(rule.dcgm_diag)) if rule.dcgm_diag else ()
    promote = (PROMOTE,) if rule.statement else ()
    return (*LOOK, *check, *promote)


async def execute(operation: AcceptWorker, node: Node, means: Means) -> ExecutionResult:
    request, rule = means.need("request"), means.actions.accept_worker
    worker = request.node_id
    try:
        looks = await preflight.inspect(node, None, means.preflight)
    except preflight.NoGpuState as exc:
        return ExecutionResult(ActionOutcome.FAILED, f"{worker} not accepted: {exc}")
    problems = [f"GPU {look.readiness.index}: {'; '.join(look.readiness.problems)}" for look in looks if not look.readiness.ready]
    if not looks:
        problems.append("nvidia-smi lists no GPU")
    if problems:
        return ExecutionResult(ActionOutcome.FAILED, f"{worker} not accepted: " + " | ".join(problems[:8]))
    passed = [f"{len(looks)} GPU(s) free and healthy"]
    if rule.dcgm_diag:
        verdict = await diag.run(node, rule.dcgm_diag, rule.dcgm_diag_timeout_s)
        if verdict.ran and not verdict.passed:
            return ExecutionResult(ActionOutcome.FAILED, f"{worker} not accepted: {verdict.summary}")
        passed.append(verdict.summary)
    if rule.statement:
        error, changed = await taskdb.write(means, PROMOTE, rule.statement, {"worker_id": worker})
        if error:
            return ExecutionResult(ActionOutcome.FAILED, f"{worker} passed its checks but was not promoted: {error}")
        passed.append(f"promoted in the task database ({changed} record(s) changed)")
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"accepted {worker}: {'; '.join(passed)}")
