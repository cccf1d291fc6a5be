"""stop_job: a hung job's ranks stopped on every node of the job, so its launcher starts it again.

A hung collective bills every GPU of the job while it waits for a rank that will not come; the
job's own launcher (torchrun's agents, a scheduler's requeue) starts it again from its last
checkpoint once its ranks are gone, without the node that stopped (drained first). No checkpoint
is asked first: a rank blocked inside NCCL runs no signal handler until the collective returns.

It looks before it acts: every node of the job but the incident's (the one that stopped, which may
not answer) must answer, and every rank's GPU must still idle at most `max_gpu_utilization_pct`
(busier: the job works again, and nothing is stopped). Then, node by node and GPU by GPU at once,
each GPU's ranks are stopped as `kill_gpu_processes` stops a GPU's processes: each checked to be
the process seen (it holds that GPU, its start time and command line) right before SIGTERM,
SIGKILL after `grace_s`, then verified gone.
"""

from __future__ import annotations

import asyncio
from collections import defaultdict

from gpumedic_events import ActionOutcome, KillGpuProcesses, RankTarget, StopJob
from gpumedic_events.node import job_key
from gpumedic_incidents.policy import Actions
from gpumedic_nodes.ssh import NodeError
from remediator.catalogue import kill
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means

MAX_SAID = 600
"""Characters of each node's account in the action's detail."""


def per_gpu(operation: StopJob) -> dict[str, dict[int, KillGpuProcesses]]:
    """Per node, per GPU: the kill that stops its ranks there."""
    grouped: dict[str, dict[int, list[RankTarget]]] = defaultdict(lambda: defaultdict(list))
    for rank in operation.ranks:
        grouped[rank.node_id][rank.gpu_index].append(rank)
    return {
        node: {
            gpu: KillGpuProcesses(gpu_index=gpu, targets=tuple(targets), signal="TERM", grace_s=operation.grace_s,
                                  max_gpu_utilization_pct=operation.max_gpu_utilization_pct)
            for gpu, targets in sorted(gpus.items())
        }
        for node, gpus in sorted(grouped.items())
    }


def render(operation: StopJob, actions: Actions) -> tuple[str, ...]:
    seen: set[tuple[str, int]] = set()
    for rank in operation.ranks:
        if (rank.node_id, rank.pid) in seen:
            raise InvalidParameter(f"pid {rank.pid} on {rank.node_id} is listed twice")
        seen.add((rank.node_id, rank.pid))
    commands = [command for kills in per_gpu(operation).values() for one in kills.values() for command in kill.render(one)]
    return tuple(dict.fromkeys(commands))


def fits(operation: StopJob, fit: Fit) -> str:
    """Only a job's own incident, below the kind's idle threshold, with the policy's grace."""
    if fit.incident.key != job_key(operation.job):
        return f"incident {fit.incident.incident_id} is not about the job {operation.job} (its key is {fit.incident.key})"
    limit = getattr(fit.rules, "idle_below_pct", None)
    if limit is None or operation.max_gpu_utilization_pct >= limit:
        return f"the stop would run on GPUs up to {operation.max_gpu_utilization_pct}% busy, not below kinds.{fit.kind}.idle_below_pct ({limit}%)"
    if operation.grace_s != fit.actions.stop_job.grace_s:
        return f"the stop asks {operation.grace_s:g}s grace; the policy's actions.stop_job.grace_s is {fit.actions.stop_job.grace_s:g}s"
    return ""


def reaches(operation: StopJob) -> tuple[str, ...]:
    """Every node it logs in to."""
    return tuple(sorted({rank.node_id for rank in operation.ranks}))


async def execute(operation: StopJob, means: Means) -> ExecutionResult:
    plan = per_gpu(operation)
    stopped_at = means.need("request").node_id
    skipped: dict[str, str] = {}
    for node_id, kills in plan.items():  # look: every node answers, every rank's GPU still idles
        try:
            async with means.node(at=node_id) as node:
                for one in kills.values():
                    if refusal := await kill.gpu_state_refusal(node, one):
                        return ExecutionResult(ActionOutcome.BLOCKED, f"{node_id}: {refusal}; no rank of the job was stopped")
        except NodeError as exc:
            if node_id != stopped_at:
                return ExecutionResult(ActionOutcome.FAILED, f"{node_id} does not answer ({exc}); no rank of the job was stopped")
            skipped[node_id] = f"not reached ({exc}): its ranks are left as they are"
    reached = [node for node in plan if node not in skipped]
    accounts = dict(zip(reached, await asyncio.gather(*(_stop_on(means, node, plan[node]) for node in reached)), strict=True))
    failed = [node for node, (ok, _) in accounts.items() if not ok]
    said = [f"{node}: {text[:MAX_SAID]}" for node, (_, text) in accounts.items()] + [f"{node}: {why}" for node, why in skipped.items()]
    outcome = ActionOutcome.FAILED if failed else ActionOutcome.SUCCEEDED
    head = (f"stopped the job {operation.job}'s ranks on {len(plan) - len(skipped) - len(failed)} of {len(plan)} node(s)"
            + (f"; not on {', '.join(failed)}" if failed else ""))
    return ExecutionResult(outcome, f"{head}: {'; '.join(said)}")


async def _stop_on(means: Means, node_id: str, kills: dict[int, KillGpuProcesses]) -> tuple[bool, str]:
    """Stop the node's ranks, every GPU's at once (one grace for all); whether all went, and how."""
    try:
        async with means.node(at=node_id) as node:
            results = await asyncio.gather(*(kill.execute(one, node, means) for one in kills.values()))
    except NodeError as exc:
        return False, f"lost mid-stop ({exc})"
    ok = all(r.outcome is ActionOutcome.SUCCEEDED for r in results)
    # a GPU whose ranks went on SIGTERM is counted; one that needed SIGKILL, or failed, is told
    told = [(gpu, r) for gpu, r in zip(kills, results, strict=True) if r.outcome is not ActionOutcome.SUCCEEDED or "KILL" in r.detail]
    quiet = len(kills) - len(told)
    parts = ([f"{quiet} GPU(s)' ranks gone on SIGTERM"] if quiet else []) + [f"GPU {gpu}: {r.detail}" for gpu, r in told]
    return ok, " | ".join(parts)
