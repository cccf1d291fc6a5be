"""The incident lifecycle: one pure state machine that every detector shares.

    finding ──► opened ──► held ──hold_s──► acting ──result──► verifying ──cleared──► resolved "fixed"
                  │          │                │                    └──still there after verify_within_s──►
                  │          │                │                       next attempt, next step, or escalated
                  │          │                └──blocked or observe only, or no answer──► escalated
                  │          └──part of a fleet incident──► escalated (never acts)
                  ├──no ladder, or no safe operation──► escalated
                  └──a silence covers it──► silenced ──silence over, still there──► held
    held, escalated, silenced ──cleared──► resolved "cleared"
    escalated, silenced (kinds with clear_after_s) ──not seen for clear_after_s──► resolved "cleared"

A `drain_node` step that succeeds marks the incident `drained` and goes straight on to the next
step (or to a person, when it was the last). A drained incident never resolves on the fault going
away alone: it is `validating` until `validation.ready_samples` samples in a row show its GPUs
free and healthy, then asks for `undrain_node`, and resolves once that succeeded. A fault that
comes back, validation that does not come within `validation.within_s`, or an undrain that does
not succeed, escalate with the node still drained. A kind whose policy names a `restart_job` asks
for that job's restart once its fix is verified (a hung job across nodes: on its other nodes,
before the drained one's validation), and resolves "fixed" when the restart succeeded (else a
person: fixed, but the work did not start again).

Every function takes plain values and returns a `Transition` (or None: nothing changed): the new
state (None when the incident closed) and the events to publish, grouped in the steps of the
incident's trace they belong to. Nothing is mutated: the handler persists the new state,
publishes, then swaps it in, so a failed publish needs no rollback. The ladder, attempts and
deadlines come from the policy file (`gpumedic_incidents.policy`), the only place they are set.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from gpumedic_bus.topology import FLEET_NODE
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    DrainNode,
    Event,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    Operation,
    RestartJob,
    UndrainNode,
    action_id_for,
)
from gpumedic_incidents.policy import Policy, Step
from gpumedic_incidents.state import Finding, IncidentState, PendingAction, ends_work_on, operation_digest, traits_of

SpanName = Literal["detect", "decide", "verify", "update"]
UPDATE_AT = (2, 10, 100, 1000, 10_000)
"""Occurrence counts at which a repeating incident publishes an IncidentUpdated (not every repeat)."""


@dataclass(frozen=True)
class Span:
    """One step of the incident's trace and the events published inside it."""

    name: SpanName
    events: tuple[Event, ...] = ()


@dataclass(frozen=True)
class Transition:
    """What one input does to one incident. `spans` nest: each is a child of the one before, and
    the first continues the incident's trace (a `detect` starts a new trace)."""

    before: IncidentState | None
    after: IncidentState | None
    spans: tuple[Span, ...] = ()

    @property
    def state(self) -> IncidentState:
        """The incident concerned (after the change, or as it was when it closed)."""
        state = self.after or self.before
        assert state is not None
        return state

    @property
    def events(self) -> tuple[Event, ...]:
        return tuple(e for span in self.spans for e in span.events)


def open_incident(
    finding: Finding,
    now: datetime,
    *,
    detector: str,
    policy: Policy,
    hold: bool = True,
    silence_id: uuid.UUID | None = None,
    fleet_incident_id: uuid.UUID | None = None,
    reason: str = "",
) -> Transition:
    """A new incident for a present finding: held for the fleet hold, silenced, part of a fleet
    incident, escalated (no ladder or nothing safe), or acting at once."""
    related = fleet_incident_id or finding.related_incident_id
    state = IncidentState(
        incident_id=uuid.uuid4(),
        kind=finding.kind,
        detector=detector,
        node_id=finding.node_id,
        gpu_index=finding.gpu_index,
        key=finding.key,
        cluster=finding.cluster,
        opened_at=now,
        last_seen_at=now,
        phase="held",
        proposed=_proposal(finding, policy, step=0),
        unsafe=finding.unsafe,
        summary=finding.summary,
        related_incident_id=related,
        silence_id=silence_id,
        traits=traits_of(finding.evidence),
    )
    opened = IncidentOpened(
        source=detector,
        incident_id=state.incident_id,
        node_id=state.node_id,
        kind=state.kind,
        gpu_index=state.gpu_index,
        fingerprint=state.fingerprint,
        summary=finding.summary[:1000] or f"{state.kind.value} on {state.node_id}",
        evidence=dict(finding.evidence),
        severity=finding.severity,
        diagnosis=finding.diagnosis,
        recommended_action=finding.recommended_action[:500],
        related_incident_id=related,
        silence_id=silence_id,
    )
    detect = Span("detect", (opened,))
    if silence_id is not None:
        return Transition(None, state.model_copy(update={"phase": "silenced"}), (detect,))
    if fleet_incident_id is not None:
        return _escalated(None, state, now, reason or f"part of fleet incident {fleet_incident_id}: no node action", (detect,))
    ladder = policy.of(state.kind, state.key).ladder
    if not ladder:
        why = reason or f"no automatic fix for {state.kind.value}" + (f": {finding.recommended_action}" if finding.recommended_action else "")
        if hold and policy.fleet.hold_s > 0 and state.node_id != FLEET_NODE:
            # A person is called after the fleet hold too: much of the fleet at once is one page (the
            # fleet incident's), not one per node.
            held = state.model_copy(update={"deadline": now + timedelta(seconds=policy.fleet.hold_s), "unsafe": why[:1000]})
            return Transition(None, held, (detect,))
        return _escalated(None, state, now, why, (detect,))
    if hold and policy.fleet.hold_s > 0:
        return Transition(None, state.model_copy(update={"deadline": now + timedelta(seconds=policy.fleet.hold_s)}), (detect,))
    return _act(None, state, now, policy, f"{state.kind.value} on {_where(state)}", (detect,))


def observe(state: IncidentState, finding: Finding, now: datetime, *, policy: Policy) -> Transition | None:
    """The fault is still there: count it, keep the latest proposal, and after a verify window
    that passed without the fault going, take the next attempt."""
    occurrences = state.occurrences + (1 if finding.occurrence else 0)
    proposed = _proposal(finding, policy, step=state.step) or state.proposed
    # A level finding (a lost GPU in every sample) is the fault seen too, or a kind that clears when
    # quiet would clear while it is there. It refreshes `last_seen_at` a few times per quiet period,
    # not every sample: each change is a state write.
    quiet_s = policy.of(state.kind, state.key).clear_after_s
    refresh = quiet_s is not None and now - state.last_seen_at >= timedelta(seconds=quiet_s / 4)
    changes = {
        "occurrences": occurrences,
        "proposed": proposed,
        "unsafe": finding.unsafe,
        "last_seen_at": now if finding.occurrence or refresh else state.last_seen_at,
        # A level finding repeats every sample with fresh numbers; only a new occurrence is news.
        "summary": (finding.summary or state.summary) if finding.occurrence else state.summary,
    }
    linked = finding.related_incident_id is not None and finding.related_incident_id != state.related_incident_id
    if linked:
        changes["related_incident_id"] = finding.related_incident_id
    updated = state.model_copy(update=changes)
    if state.phase == "validating":
        return _escalated(state, updated, now, f"the fault came back while validating {_where(state)}; the node stays drained")
    if state.phase == "verifying" and state.deadline is not None and now > state.deadline:
        return _next_attempt(state, updated, now, policy, finding)
    spans: tuple[Span, ...] = ()
    if linked or (occurrences != state.occurrences and occurrences in UPDATE_AT):
        event = IncidentUpdated(
            source=state.detector,
            occurrences=occurrences,
            summary=(finding.summary or state.summary)[:1000],
            evidence=dict(finding.evidence),
            related_incident_id=finding.related_incident_id if linked else None,
            **_ids(state),
        )
        spans = (Span("update", (event,)),)
    if updated == state:
        return None
    return Transition(state, updated, spans)


def clear(state: IncidentState, finding: Finding, now: datetime, *, policy: Policy) -> Transition | None:
    """The fault is gone: resolved, `fixed` when an action ran and this verifies it, else `cleared`;
    on a node the incident drained, validation first. While acting, the remediator's answer comes
    first. `finding.ready` is a readiness verdict on one sample (validation's input)."""
    if state.phase == "acting":
        return None
    if state.phase == "validating":
        return _validate(state, finding.ready, now, policy) if finding.ready is not None else None
    if finding.ready is False:
        return None  # not ready is no news about a fault that is not gone yet
    fixed = state.phase == "verifying"
    summary = finding.summary or ("the fault is gone after the action" if fixed else "the fault went away by itself")
    rules = policy.of(state.kind, state.key)
    job = getattr(rules, "restart_job", None)
    if fixed and job is not None:
        # The work starts again before the incident ends (the runbook's --cleanup-zombies), then
        # validation: a node's job on its node; a job across nodes where its rule proposes (its
        # nodes but the one that stopped), and not at all when it runs again by itself.
        restart = finding.operations.get("restart_job")
        if restart is None and not hasattr(rules, "restart_on"):
            restart = RestartJob(job=job)
        if isinstance(restart, RestartJob) and restart.job == job:
            restarting = state.model_copy(update={"resolution": "fixed", "restarting": True, "summary": summary[:1000]})
            return _request(state, restarting, restart, now, policy, f"{summary}; {restart.describe()} again"[:1000])
    if state.drained:
        return _start_validation(state, "fixed" if fixed else "cleared", summary, now, policy, ready=bool(finding.ready))
    event = IncidentResolved(source=state.detector, resolution="fixed" if fixed else "cleared", summary=summary[:1000], **_ids(state))
    return Transition(state, None, (Span("verify", (event,)),))


def action_completed(
    state: IncidentState, result: ActionCompleted, now: datetime, *, policy: Policy, traceparent: str | None
) -> Transition | None:
    """The remediator answered: verify what ran; a refusal or observe mode needs a person."""
    pending = state.pending_action
    if state.phase != "acting" or pending is None or (result.action_id, result.attempt) != (pending.action_id, pending.attempt):
        return None  # a late or repeated result for a step already taken
    if None not in (result.request_sha256, pending.request_sha256) and result.request_sha256 != pending.request_sha256:
        return None  # the answer to another request sent under this action id (a forgery): ours is still to come
    waits = result.outcome is ActionOutcome.BLOCKED and result.in_use
    before, state = state, state.model_copy(update={
        "traceparent": traceparent or state.traceparent, "pending_action": None, "waiting_since": state.waiting_since if waits else None,
    })
    if state.resolution is not None:  # after the fix: the job's restart, or the undrain (after validation)
        outcome = f"{result.outcome.value}: {result.detail}"
        if state.restarting or not state.drained:
            done, failed = "restarted", f"fixed, but the job's restart was {outcome}"
            if state.drained:
                failed += "; the node stays drained"
                if result.outcome is ActionOutcome.SUCCEEDED:  # the job runs again; the node waits for validation
                    summary = f"{state.summary}; restarted, {result.detail}"
                    return _start_validation(before, state.resolution, summary, now, policy, ready=False,
                                             update={"restarting": False})
        else:
            done, failed = "validated", f"validated, but the undrain was {outcome}; the node stays drained"
        if result.outcome is ActionOutcome.SUCCEEDED:
            event = IncidentResolved(
                source=state.detector,
                resolution=state.resolution,
                summary=f"{state.summary}; {done}, {result.detail}"[:1000],
                **_ids(state),
            )
            return Transition(before, None, (Span("verify", (event,)),))
        return _escalated(before, state, now, failed)
    ladder = policy.of(state.kind, state.key).ladder
    step = ladder[min(state.step, len(ladder) - 1)]
    if step.action == "drain_node" and result.outcome is not ActionOutcome.SUCCEEDED:
        # A failed or interrupted drain may have half-happened: count the node as drained, so that
        # only validation gives it back.
        drained = result.outcome in (ActionOutcome.FAILED, ActionOutcome.INTERRUPTED)
        return _escalated(before, state.model_copy(update={"drained": drained}), now, f"the drain was {result.outcome.value}: {result.detail}")
    if waits and step.wait_while_in_use_s:
        return _wait_until_free(before, state, step, result, now)
    if result.outcome in (ActionOutcome.BLOCKED, ActionOutcome.OBSERVED):
        verb = "refused the action" if result.outcome is ActionOutcome.BLOCKED else "only observed it (observe mode)"
        return _escalated(before, state, now, f"the remediator {verb}: {result.detail}")
    if step.action == "drain_node":
        drained = state.model_copy(update={"drained": True})
        if state.step + 1 < len(ladder):
            nxt = drained.model_copy(update={"step": state.step + 1, "step_attempts": 0})
            return _act(before, nxt, now, policy, f"{_where(state)} is drained; next: {ladder[state.step + 1].action}")
        return _escalated(before, drained, now, f"{_where(state)} is drained ({result.detail}); the rest needs a person")
    after = state.model_copy(update={"phase": "verifying", "deadline": now + timedelta(seconds=step.verify_within_s)})
    return Transition(before, after)


def _wait_until_free(before: IncidentState, state: IncidentState, step: Step, result: ActionCompleted, now: datetime) -> Transition:
    """The step was refused only because its target is in use (a job still holds the drained
    node's GPU): ask again later, for as long as the step allows, then a person."""
    since = state.waiting_since or now
    left = since + timedelta(seconds=step.wait_while_in_use_s) - now
    if left <= timedelta(0):
        waited = f"{step.wait_while_in_use_s / 3600:g} h" if step.wait_while_in_use_s >= 3600 else f"{step.wait_while_in_use_s:g}s"
        return _escalated(before, state, now, f"{step.action} waited {waited} for {_where(state)} to be free: {result.detail}")
    again = min(timedelta(seconds=step.ask_again_every_s), left)
    waiting = state.model_copy(update={
        "phase": "waiting", "waiting_since": since, "deadline": now + again,
        "step_attempts": max(state.step_attempts - 1, 0),  # a refusal is no try: the step's attempts are for runs
    })
    summary = f"{step.action} waits for {_where(state)} to be free ({result.detail}); asking again in {again.total_seconds() / 60:.0f} min"
    event = IncidentUpdated(source=state.detector, occurrences=state.occurrences, summary=summary[:1000], **_ids(state))
    return Transition(before, waiting, (Span("update", (event,)),))


def tick(state: IncidentState, now: datetime, *, policy: Policy, silenced: bool) -> Transition | None:
    """What time alone changes: a hold or a silence that ended, a remediator that never answered,
    a step waiting for its target to be free, an event-reported incident that stayed quiet."""
    kind = policy.of(state.kind, state.key)
    if state.phase == "waiting" and state.deadline is not None and now >= state.deadline:
        return _act(state, state, now, policy, f"asking again whether {_where(state)} is free for {kind.ladder[state.step].action}")
    if state.phase == "held" and not silenced and state.deadline is not None and now >= state.deadline:
        return _act(state, state, now, policy, f"{state.kind.value} on {_where(state)}")
    if state.phase == "held" and silenced:
        return Transition(state, state.model_copy(update={"phase": "silenced", "deadline": None}))
    if state.phase == "silenced" and not silenced:
        if kind.ladder:
            return _act(state, state.model_copy(update={"silence_id": None}), now, policy, "the silence ended and the fault is still there")
        return _escalated(state, state, now, "the silence ended and the fault is still there")
    if state.phase == "acting" and state.deadline is not None and now > state.deadline:
        return _escalated(state, state, now, f"no answer from the remediator within {kind.action_timeout_s:g}s")
    if state.phase == "verifying" and state.drained and state.deadline is not None and now > state.deadline:
        # On a drained node the samples' readiness verifies the fix, and no finding may come to say it
        # did not (an XID does not repeat): time says so.
        return _next_attempt(state, state, now, policy)
    if state.phase == "validating" and state.deadline is not None and now > state.deadline:
        return _escalated(
            state,
            state,
            now,
            f"the fault is gone, but {policy.validation.ready_samples} samples in a row with the GPUs free and healthy "
            f"did not come within {policy.validation.within_s:g}s; the node stays drained",
        )
    if (
        state.phase in ("escalated", "silenced")
        and kind.clear_after_s is not None
        and now - state.last_seen_at >= timedelta(seconds=kind.clear_after_s)
    ):
        if state.drained:
            return _start_validation(state, "cleared", f"not seen again for {kind.clear_after_s:g}s", now, policy, ready=False)
        event = IncidentResolved(
            source=state.detector,
            resolution="cleared",
            summary=f"not seen again for {kind.clear_after_s:g}s",
            **_ids(state),
        )
        return Transition(state, None, (Span("verify", (event,)),))
    return None


def link_to_fleet(state: IncidentState, fleet_incident_id: uuid.UUID, now: datetime) -> Transition | None:
    """A held incident turns out to be part of a fleet incident: it never acts."""
    if state.phase != "held":
        return None
    linked = state.model_copy(update={"related_incident_id": fleet_incident_id})
    update = IncidentUpdated(
        source=state.detector,
        occurrences=state.occurrences,
        summary=state.summary[:1000] or state.kind.value,
        related_incident_id=fleet_incident_id,
        **_ids(state),
    )
    return _escalated(state, linked, now, f"part of fleet incident {fleet_incident_id}: no node action", (Span("update", (update,)),))


def close(state: IncidentState, now: datetime, summary: str) -> Transition:
    """Resolve an incident whose fault went away for a reason outside its own findings (a fleet
    incident whose members all closed, a node retired): fixed if its fix was already verified
    (it was validating), else cleared."""
    event = IncidentResolved(source=state.detector, resolution=state.resolution or "cleared", summary=summary[:1000], **_ids(state))
    return Transition(state, None, (Span("verify", (event,)),))


# --- internals -------------------------------------------------------------------------------


def _proposal(finding: Finding, policy: Policy, *, step: int):
    """What the rule proposes for the first step from `step` on that needs the rule (a drain does not)."""
    ladder = policy.of(finding.kind, finding.key).ladder
    for rung in ladder[min(step, len(ladder) - 1) :]:
        if rung.action != "drain_node":
            return finding.operations.get(rung.action)
    return None


def _act(
    before: IncidentState | None, state: IncidentState, now: datetime, policy: Policy, reason: str, spans: tuple[Span, ...] = ()
) -> Transition:
    """Request the ladder's current step, or escalate when nothing safe can be requested."""
    ladder = policy.of(state.kind, state.key).ladder
    if not ladder:  # a person's from the start, held only for the fleet hold
        return _escalated(before, state, now, state.unsafe or f"no automatic fix for {state.kind.value}", spans)
    step = ladder[state.step]
    if step.action == "drain_node" and not state.unsafe:  # needs nothing from the rule
        return _request(before, state, DrainNode(), now, policy, reason, spans)
    proposed = state.proposed if state.proposed is not None and state.proposed.operation == step.action else None
    if proposed is None or state.unsafe:
        why = state.unsafe or f"no safe {step.action} for {_where(state)}"
        if state.drained:
            why += " (the node is drained)"
        return _escalated(before, state, now, why, spans)
    return _request(before, state, proposed, now, policy, reason, spans)


def _request(
    before: IncidentState | None,
    state: IncidentState,
    operation: Operation,
    now: datetime,
    policy: Policy,
    reason: str,
    spans: tuple[Span, ...] = (),
) -> Transition:
    """Ask the remediator for `operation`; the incident waits for exactly this action."""
    attempt = state.attempt + 1
    action_id = action_id_for(state.incident_id, attempt)
    request = ActionRequested(
        source=state.detector,
        action_id=action_id,
        incident_id=state.incident_id,
        node_id=state.node_id,
        attempt=attempt,
        operation=operation,
        reason=reason[:1000],
        fingerprint=state.fingerprint,
    )
    after = state.model_copy(
        update={
            "phase": "acting",
            "attempt": attempt,
            "step_attempts": state.step_attempts + 1,
            "deadline": now + timedelta(seconds=policy.of(state.kind, state.key).action_timeout_s),
            "pending_action": PendingAction(
                action_id=action_id, attempt=attempt, operation_sha256=operation_digest(operation), requested_at=now,
                request_sha256=request.request_sha256, ends_work_on=ends_work_on(operation, state.node_id),
            ),
        }
    )
    return Transition(before, after, (*spans, Span("decide", (request,))))


def _next_attempt(
    before: IncidentState, state: IncidentState, now: datetime, policy: Policy, finding: Finding | None = None
) -> Transition:
    """Another attempt of the step, or the next step; `finding` (the fault seen again) proposes that
    step's operation (a rule offers each rung's own: a kill, then a pod restart)."""
    ladder = policy.of(state.kind, state.key).ladder
    if state.step_attempts < ladder[state.step].attempts:
        nxt = state
    elif state.step + 1 < len(ladder):
        proposed = (_proposal(finding, policy, step=state.step + 1) if finding is not None else None) or state.proposed
        nxt = state.model_copy(update={"step": state.step + 1, "step_attempts": 0, "proposed": proposed})
    else:
        return _escalated(before, state, now, f"{state.attempt} attempt(s) did not fix {_where(state)}", (Span("verify"),))
    return _act(before, nxt, now, policy, f"still there after attempt {state.attempt}", (Span("verify"),))


def _start_validation(
    state: IncidentState, resolution: str, summary: str, now: datetime, policy: Policy, *, ready: bool, update: dict | None = None
) -> Transition:
    """The fault is gone on a node this incident drained: wait for healthy samples before the undrain."""
    validating = state.model_copy(
        update={
            "phase": "validating",
            "resolution": resolution,
            "summary": summary[:1000],
            "ready_samples": 0,
            "deadline": now + timedelta(seconds=policy.validation.within_s),
            "pending_action": None,
            **(update or {}),
        }
    )
    update = IncidentUpdated(
        source=state.detector,
        occurrences=state.occurrences,
        summary=(
            f"{summary}; the node stays drained until {policy.validation.ready_samples} samples in a row show "
            f"{_gpus(state)} free and healthy"
        )[:1000],
        **_ids(state),
    )
    started = Transition(state, validating, (Span("verify", (update,)),))
    if not ready:
        return started
    counted = _validate(validating, True, now, policy)
    return Transition(state, counted.after, (*started.spans, *counted.spans))


def _validate(state: IncidentState, ready: bool, now: datetime, policy: Policy) -> Transition | None:
    """One readiness verdict while validating: count a ready sample, or start over."""
    if not ready:
        if state.ready_samples == 0:
            return None
        return Transition(state, state.model_copy(update={"ready_samples": 0}))
    in_a_row = state.ready_samples + 1
    counted = state.model_copy(update={"ready_samples": in_a_row})
    if in_a_row < policy.validation.ready_samples:
        return Transition(state, counted)
    reason = f"validated: {in_a_row} samples in a row with {_gpus(state)} free and healthy"
    return _request(state, counted, UndrainNode(), now, policy, reason)


def _escalated(
    before: IncidentState | None, state: IncidentState, now: datetime, reason: str, spans: tuple[Span, ...] = ()
) -> Transition:
    after = state.model_copy(
        update={"phase": "escalated", "deadline": None, "pending_action": None, "resolution": None, "restarting": False, "ready_samples": 0}
    )
    event = IncidentEscalated(source=state.detector, reason=reason[:1000], **_ids(state))
    if spans and spans[-1].name == "verify":
        return Transition(before, after, (*spans[:-1], Span("verify", (*spans[-1].events, event))))
    return Transition(before, after, (*spans, Span("verify", (event,))))


def _ids(state: IncidentState) -> dict:
    return {"incident_id": state.incident_id, "node_id": state.node_id, "kind": state.kind, "gpu_index": state.gpu_index}


def _gpus(state: IncidentState) -> str:
    return "every GPU" if state.gpu_index is None else f"GPU {state.gpu_index}"


def _where(state: IncidentState) -> str:
    return state.node_id if state.gpu_index is None else f"{state.node_id} GPU {state.gpu_index}"
