"""restart_job: start the work again after a verified kill (the runbook's `--cleanup-zombies`).

The request names a job (`selfplay`), never a command: the policy's allow-list maps the name to a
systemd unit, restarted and then checked with `systemctl is-active` until the verify timeout, or
to an executable given as an absolute path, run without arguments, whose exit status 0 counts.
"""

from __future__ import annotations

import re

from gpumedic_events import ENDPOINT_PATTERN, ActionOutcome, RestartJob
from gpumedic_incidents.policy import Actions, JobRestart
from remediator.catalogue.base import ExecutionResult, InvalidParameter, Means, Node, quoted, said, short


def validate_job(value: object, actions: Actions) -> JobRestart:
    if not isinstance(value, str) or not re.match(ENDPOINT_PATTERN, value):
        raise InvalidParameter(f"job {short(value)} is not a job name (lower-case letters, digits and _)")
    allowed = actions.restart_job.jobs
    if value not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise InvalidParameter(f"job {value} is not in the policy's restart_job list (allowed: {names})")
    return allowed[value]


def render(operation: RestartJob, actions: Actions) -> tuple[str, ...]:
    job = validate_job(operation.job, actions)
    if job.unit is not None:
        return (f"systemctl restart {quoted(job.unit)}", f"systemctl is-active {quoted(job.unit)}")
    return (quoted(job.command),)


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
