"""drain_node and undrain_node: the node's place in the scheduler, not a command on the node.

A drain records that the incident holds the node out of service (a rollout's, that the operators
do: one hold for every rollout, so any rollout's undrain gives back what any rollout drained),
tells the user's scheduler through the policy's hook (where one is set), and publishes NodeDrained
for the autoscaler and anyone subscribed. An undrain comes only after the detector validated the fix on the samples.
If another incident still holds the node, it only releases this incident's hold: the node stays
drained. Otherwise the policy's `check_command` and DCGM's diagnostics (`dcgm_diag`, where the node
has DCGM) must pass on the node first, then the hook hears `drained: false`, the hold goes, and
NodeUndrained is published. A failed check, diagnostic or hook leaves the node drained, and the
outcome says so.

Each step runs through `step`, which records it in the ledger's steps and audit as a command is.
"""

from __future__ import annotations

from gpumedic_events import ActionOutcome, DrainNode, UndrainNode
from gpumedic_incidents.policy import Actions
from gpumedic_store import OPERATORS_HOLD
from remediator.catalogue import diag
from remediator.catalogue.base import ExecutionResult, Means, quoted, said, short


def render_drain(operation: DrainNode, actions: Actions) -> tuple[str, ...]:
    hook = ("POST drained=true to the scheduler's hook",) if actions.drain_node.hook_url else ()
    return ("hold the node drained (node_drains)", *hook, "publish NodeDrained")


def render_undrain(operation: UndrainNode, actions: Actions) -> tuple[str, ...]:
    check = (check_command(actions),) if actions.undrain_node.check_command else ()
    level = actions.undrain_node.dcgm_diag
    check += (diag.FIND, diag.command(level)) if level else ()
    hook = ("POST drained=false to the scheduler's hook",) if actions.drain_node.hook_url else ()
    return (*check, *hook, "release the node (node_drains)", "publish NodeUndrained")


def _holder(means: Means) -> str:
    return OPERATORS_HOLD if means.rollout else str(means.need("request").incident_id)


def _named(holders: list[str]) -> str:
    incidents = [h for h in holders if h != OPERATORS_HOLD]
    named = ["the operators' rollout drain"] if OPERATORS_HOLD in holders else []
    return " and ".join(named + ([f"incident(s) {', '.join(incidents)}"] if incidents else []))


def check_command(actions: Actions) -> str:
    """The policy's check, validated when the policy loaded, quoted even so."""
    command = actions.undrain_node.check_command
    assert command is not None
    return quoted(command)


async def drain(operation: DrainNode, means: Means) -> ExecutionResult:
    request, actions, scheduler, step = means.need("request"), means.actions, means.need("scheduler"), means.step
    node, holder = request.node_id, _holder(means)
    others = [i for i in await scheduler.holders(node) if i != holder]
    if error := await step("hold the node drained (node_drains)", lambda: scheduler.hold(request, holder)):
        return ExecutionResult(ActionOutcome.FAILED, f"the drain of {node} could not be recorded: {error}")
    if actions.drain_node.hook_url:
        if error := await step("POST drained=true to the scheduler's hook", lambda: scheduler.tell(request, drained=True)):
            return ExecutionResult(
                ActionOutcome.FAILED, f"{node} is drained in gpumedic, but the scheduler's hook did not take it: {error}"
            )
    if error := await step("publish NodeDrained", lambda: scheduler.publish(request, drained=True)):
        return ExecutionResult(ActionOutcome.FAILED, f"{node} is drained, but NodeDrained was not published: {error}")
    also = f" (it already was, for {_named(others)})" if others else ""
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"drained {node}{also}")


async def undrain(operation: UndrainNode, means: Means) -> ExecutionResult:
    request, actions, scheduler, step = means.need("request"), means.actions, means.need("scheduler"), means.step
    node, holder = request.node_id, _holder(means)
    holders = await scheduler.holders(node)
    if means.rollout and holder not in holders:
        return ExecutionResult(ActionOutcome.SUCCEEDED, f"no rollout drained {node}: nothing to give back"
                               + (f" (it stays drained for {_named(holders)})" if holders else ""))
    others = [i for i in holders if i != holder]
    if others:
        whose = "the operators' hold" if means.rollout else "this incident's hold"
        if error := await step(f"release {whose} (node_drains)", lambda: scheduler.release(request, holder)):
            return ExecutionResult(ActionOutcome.FAILED, f"the hold on {node} could not be released: {error}")
        return ExecutionResult(ActionOutcome.SUCCEEDED, f"released {whose}; {node} stays drained for {_named(others)}")
    rule, checked = actions.undrain_node, []
    if rule.check_command or rule.dcgm_diag:
        async with means.node() as on_node:
            if rule.check_command:
                result = await on_node.run(check_command(actions))
                if result.exit_status != 0:
                    return ExecutionResult(
                        ActionOutcome.FAILED, f"{node} stays drained: its check {short(rule.check_command)} failed ({said(result)})"
                    )
                checked.append("its check passed")
            if rule.dcgm_diag:
                verdict = await diag.run(on_node, rule.dcgm_diag, rule.dcgm_diag_timeout_s)
                if verdict.ran and not verdict.passed:
                    return ExecutionResult(ActionOutcome.FAILED, f"{node} stays drained: {verdict.summary}")
                checked.append(verdict.summary)
    if actions.drain_node.hook_url:
        if error := await step("POST drained=false to the scheduler's hook", lambda: scheduler.tell(request, drained=False)):
            return ExecutionResult(ActionOutcome.FAILED, f"{node} stays drained: the scheduler's hook did not take the undrain: {error}")
    if error := await step("release the node (node_drains)", lambda: scheduler.release(request, holder)):
        return ExecutionResult(ActionOutcome.FAILED, f"the hold on {node} could not be released: {error}")
    if error := await step("publish NodeUndrained", lambda: scheduler.publish(request, drained=False)):
        return ExecutionResult(ActionOutcome.FAILED, f"{node} is undrained, but NodeUndrained was not published: {error}")
    return ExecutionResult(ActionOutcome.SUCCEEDED, f"undrained {node}" + (f" ({'; '.join(checked)})" if checked else ""))
