"""restart_job: start the work again after a verified kill (the runbook's `--cleanup-zombies`).

The request names a job (`selfplay`), never a command: the policy's allow-list maps the name to a
systemd unit, restarted and then checked with `systemctl is-active` until the verify timeout, or
to an executable given as an absolute path, run without arguments, whose exit status 0 counts.
"""

from __future__ import annotations

from gpumedic_events import ENDPOINT_PATTERN, ActionOutcome, RestartJob
from gpumedic_incidents.policy import Actions, JobRestart, NodeScoped
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
    """The job is the kind's own, and it restarts only after a kill the remediator's ledger verified."""
    job = getattr(fit.rules, "restart_job", None)
    if operation.job != job:
        return f"kinds.{fit.kind} restarts {f'the job {job}' if job else 'no job'}, not {operation.job}"
    if not fit.killed:
        return (f"the job restarts after a verified kill, and the remediator's ledger holds no succeeded kill_gpu_processes "
                f"for incident {fit.incident.incident_id}")
    return ""


def scope(operation: RestartJob, actions: Actions) -> tuple[NodeScoped, str, str] | None:
    if job := actions.restart_job.jobs.get(operation.job):
        return job, f"the job {operation.job} may be restarted", "actions.restart_job.jobs"
    return None


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
