"""restart_job: start the work again after a verified kill (the runbook's `--cleanup-zombies`), or a
hung job across nodes after its ranks' verified stop.

The request names a job (`selfplay`), never a command: the policy's allow-list maps the name to a
systemd unit, restarted and then checked with `systemctl is-active` until the verify timeout, or
to an executable given as an absolute path, run without arguments, whose exit status 0 counts.
It runs on the incident's node, or on each of `nodes` at once (a job across nodes: never the node
that stopped, and only where the ledger verified the job's stop).
"""

from __future__ import annotations

import asyncio

from gpumedic_events import ENDPOINT_PATTERN, ActionOutcome, RestartJob
from gpumedic_incidents.policy import Actions, JobRestart, NodeScoped
from gpumedic_nodes.ssh import NodeError
from remediator.catalogue.base import ExecutionResult, Fit, Means, Node, allowed_name, quoted, said, short


def validate_job(value: object, actions: Actions) -> JobRestart:
    allowed = actions.restart_job.jobs
    name = allowed_name(value, ENDPOINT_PATTERN, allowed, what="job", form="a job name (lower-case letters, digits and _)",
                        listed_in="restart_job list")
    return allowed[name]


def render(operation: RestartJob, actions: Actions) -> tuple[str, ...]:
    job = validate_job(operation.job, actions)
    if job.unit is not None:
        return (f"systemctl restart {quoted(job.unit)}", f"systemctl is-active {quoted(job.unit)}")
    return (quoted(job.command),)


def fits(operation: RestartJob, fit: Fit) -> str:
    """The job is the kind's own, and it restarts only where a kill or stop the remediator's ledger
    verified ended it; a job across nodes never on the node that stopped."""
    job = getattr(fit.rules, "restart_job", None)
    if operation.job != job:
        return f"kinds.{fit.kind} restarts {f'the job {job}' if job else 'no job'}, not {operation.job}"
    across = hasattr(fit.rules, "restart_on")  # a job across nodes
    if across and (not operation.nodes or fit.incident.node_id in operation.nodes):
        return f"the job {operation.job} starts again on its other nodes, never on {fit.incident.node_id}, the node that stopped"
    if not fit.killed:
        ended_by = "stop_job" if across else "kill_gpu_processes"
        return (f"the job restarts after a verified kill, and the remediator's ledger holds no succeeded {ended_by} "
                f"for incident {fit.incident.incident_id}")
    if unstopped := sorted(set(operation.nodes or (fit.incident.node_id,)) - fit.killed):
        return (f"the job restarts only where the remediator's ledger holds its verified kill or stop for incident "
                f"{fit.incident.incident_id}, and it holds none on {', '.join(unstopped[:8])}")
    return ""


def scope(operation: RestartJob, actions: Actions) -> tuple[NodeScoped, str, str] | None:
    if job := actions.restart_job.jobs.get(operation.job):
        return job, f"the job {operation.job} may be restarted", "actions.restart_job.jobs"
    return None


def reaches(operation: RestartJob) -> tuple[str, ...]:
    return operation.nodes


async def run(operation: RestartJob, means: Means) -> ExecutionResult:
    """On the incident's node, or on each of `nodes` at once: succeeded only where every node's did."""
    if not operation.nodes:
        async with means.node() as node:
            return await execute(operation, node, means)

    async def on(node_id: str) -> ExecutionResult:
        try:
            async with means.node(at=node_id) as node:
                return await execute(operation, node, means)
        except NodeError as exc:
            return ExecutionResult(ActionOutcome.FAILED, f"does not answer ({exc})")

    results = dict(zip(operation.nodes, await asyncio.gather(*(on(n) for n in operation.nodes)), strict=True))
    failed = [n for n, r in results.items() if r.outcome is not ActionOutcome.SUCCEEDED]
    head = f"the job {operation.job} started on {len(results) - len(failed)} of {len(results)} node(s)"
    if not failed:
        return ExecutionResult(ActionOutcome.SUCCEEDED, head)
    return ExecutionResult(ActionOutcome.FAILED, f"{head}; not on " + "; ".join(f"{n}: {results[n].detail[:200]}" for n in failed[:8]))


async def execute(operation: RestartJob, node: Node, means: Means) -> ExecutionResult:
    start, *check = render(operation, means.actions)
    result = await node.run(start)
    if result.exit_status != 0:
        return node.result(ActionOutcome.FAILED, f"the job {operation.job} did not start: {said(result)}")
    if not check:
        return node.result(ActionOutcome.SUCCEEDED, f"the job {operation.job} started (its command exited 0)")
    active, answer = await node.poll_command(check[0], lambda r: r.exit_status == 0 and r.stdout.strip() == "active")
    if not active:
        state = answer.stdout.strip() or said(answer)
        return node.result(ActionOutcome.FAILED, f"the job {operation.job} is {short(state)} after {node.verify_timeout_s:g}s, not active")
    return node.result(ActionOutcome.SUCCEEDED, f"the job {operation.job} started; its unit is active")
