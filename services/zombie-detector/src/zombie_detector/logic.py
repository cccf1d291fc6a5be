"""Deciding, from node samples and action results alone, when a GPU runs a zombie job and
what happens to the incident next. Pure: no bus, no clock, no I/O; tests drive it directly.

A zombie job: the node says it runs jobs, a GPU that holds compute processes stays at or
under `idle_util_pct` for `idle_for_s`, and no output grows that this GPU could be making.
Output growth is a node-wide signal, so it is credited to the node's busy GPUs when there are
any: one hung job among busy ones is still found. Idle time is measured on the detector's own
clock (`now`), never on the timestamps a sender puts in its samples, and only across samples
that come at the node's interval: a burst of samples proves nothing, and a gap of more than
`MAX_GAP_INTERVALS` intervals starts the count again. The incident then walks:

    opened + action requested (acting) -> action completed (verifying) -> resolved
                                       -> blocked or observe-only      -> escalated
    verifying past its deadline        -> next attempt, or escalated after `max_attempts`
    a holder that cannot be identified -> escalated at once (nothing is killed blind)

One open incident per (node, kind, gpu) fingerprint; while it is open, repeats only update it.
Each request carries the incident's fingerprint and the GPU state it assumes (idle), and the
incident records the one request it waits for: the remediator refuses anything else.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    GpuSample,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    KillGpuProcesses,
    NodeSampled,
    ProcessTarget,
    action_id_for,
)
from gpumedic_incidents import IncidentState, PendingAction, operation_digest
from gpumedic_incidents.state import fingerprint as incident_fingerprint

SOURCE = "zombie-detector"
KIND = IncidentKind.ZOMBIE_JOB
MAX_GAP_INTERVALS = 3
"""A GPU unseen for more than this many sample intervals was not watched: its idle count restarts."""


@dataclass(frozen=True)
class Rules:
    idle_util_pct: int = 5
    idle_for_s: float = 600.0
    verify_within_s: float = 60.0
    action_timeout_s: float = 300.0
    max_attempts: int = 2


@dataclass(frozen=True)
class IdleStreak:
    """When this GPU was first and last seen looking like a zombie, by the detector's clock."""

    since: datetime
    last_seen: datetime


@dataclass(frozen=True)
class Opened:
    incident: IncidentState
    opened: IncidentOpened
    action: ActionRequested | None
    """None when no safe action exists; an Escalated effect follows."""


@dataclass(frozen=True)
class Retried:
    incident: IncidentState
    action: ActionRequested


@dataclass(frozen=True)
class Followed:
    """The incident's state changed, with no event to publish (persist it)."""

    incident: IncidentState


@dataclass(frozen=True)
class Resolved:
    incident: IncidentState
    event: IncidentResolved


@dataclass(frozen=True)
class Escalated:
    incident: IncidentState
    event: IncidentEscalated


Effect = Opened | Retried | Followed | Resolved | Escalated


def fingerprint(node_id: str, gpu_index: int) -> str:
    return incident_fingerprint(node_id, KIND, gpu_index)


def _idle_and_held(gpu: GpuSample, rules: Rules) -> bool:
    return (
        gpu.utilization_gpu_pct is not None
        and gpu.utilization_gpu_pct <= rules.idle_util_pct
        and any(p.pid >= 2 for p in gpu.processes)  # pid 1 is never a kill target
    )


def looks_zombie(gpu: GpuSample, sample: NodeSampled, rules: Rules) -> bool:
    """Jobs claimed, this GPU held but idle, and no output growth it could be credited with."""
    if (sample.jobs.running or 0) < 1 or not _idle_and_held(gpu, rules):
        return False
    if sample.jobs.output_growing is not True:
        return True
    return any(
        g is not gpu and g.utilization_gpu_pct is not None and g.utilization_gpu_pct > rules.idle_util_pct
        for g in sample.gpus
    )


def _may_hold_zombie(sample: NodeSampled, rules: Rules) -> bool:
    """The cheap test every sample gets: jobs claimed and some GPU held but idle."""
    return (sample.jobs.running or 0) >= 1 and any(_idle_and_held(g, rules) for g in sample.gpus)


@dataclass
class ZombieDetector:
    rules: Rules = field(default_factory=Rules)
    incidents: dict[str, IncidentState] = field(default_factory=dict)
    idle_since: dict[tuple[str, int], IdleStreak] = field(default_factory=dict)
    watched: set[str] = field(default_factory=set)
    """Nodes with an idle timer or an open incident: the only ones a healthy sample concerns."""

    def adopt(self, incident: IncidentState) -> None:
        """Take over an incident remembered from an earlier run."""
        self.incidents[incident.fingerprint] = incident
        self.watched.add(incident.node_id)

    def on_sample(self, sample: NodeSampled, now: datetime) -> list[Effect]:
        # The hot path: most samples come from nodes whose GPUs all work; nothing to do there.
        if sample.node_id not in self.watched and not _may_hold_zombie(sample, self.rules):
            return []
        effects: list[Effect] = []
        for gpu in sample.gpus:
            zombie = looks_zombie(gpu, sample, self.rules)
            incident = self.incidents.get(fingerprint(sample.node_id, gpu.index))
            if incident is not None:
                effects.extend(self._follow(incident, gpu, zombie, sample, now))
                continue
            key = (sample.node_id, gpu.index)
            if not zombie:
                self.idle_since.pop(key, None)
                continue
            streak = self.idle_since.get(key)
            watched = streak is not None and (now - streak.last_seen).total_seconds() <= MAX_GAP_INTERVALS * sample.interval_s
            since = streak.since if watched else now
            self.idle_since[key] = IdleStreak(since=since, last_seen=now)
            idle_s = (now - since).total_seconds()
            if idle_s >= self.rules.idle_for_s:
                del self.idle_since[key]
                effects.extend(self._open(sample, gpu, idle_s, now))
        self._rewatch(sample.node_id)
        return effects

    def _rewatch(self, node_id: str) -> None:
        if any(n == node_id for n, _ in self.idle_since) or any(i.node_id == node_id for i in self.incidents.values()):
            self.watched.add(node_id)
        else:
            self.watched.discard(node_id)

    def on_action_completed(self, event: ActionCompleted, now: datetime, traceparent: str | None) -> list[Effect]:
        incident = self._by_id(event.incident_id)
        if incident is None or incident.phase != "acting" or event.attempt != incident.attempt:
            return []  # a late or repeated result for a step already taken
        if traceparent:
            incident.traceparent = traceparent
        if event.outcome in (ActionOutcome.BLOCKED, ActionOutcome.OBSERVED):
            verb = "blocked the kill" if event.outcome is ActionOutcome.BLOCKED else "only observed (observe mode)"
            return [self._escalate(incident, f"the remediator {verb}: {event.detail}")]
        incident.phase = "verifying"
        incident.deadline = now + timedelta(seconds=self.rules.verify_within_s)
        incident.pending_action = None
        return [Followed(incident)]

    def on_tick(self, now: datetime) -> list[Effect]:
        """Deadlines that pass without any sample: a remediator that never answered."""
        return [
            self._escalate(i, f"no answer from the remediator within {self.rules.action_timeout_s:.0f}s")
            for i in list(self.incidents.values())
            if i.phase == "acting" and i.deadline is not None and now > i.deadline
        ]

    def forget(self, incident: IncidentState) -> None:
        self.incidents.pop(incident.fingerprint, None)

    def _follow(
        self, incident: IncidentState, gpu: GpuSample, zombie: bool, sample: NodeSampled, now: datetime
    ) -> list[Effect]:
        if incident.phase == "acting":
            return []  # wait for the remediator's answer (on_tick watches its deadline)
        if gpu.processes and (gpu.utilization_gpu_pct is None or sample.jobs.running is None):
            return []  # this sample cannot tell; "could not read" must never count as "fixed"
        if not zombie:
            self.forget(incident)
            if incident.phase == "escalated":
                return [self._resolved(incident, "cleared", f"GPU {gpu.index} no longer looks like a zombie job")]
            return [self._resolved(incident, "fixed", _after_action_summary(gpu))]
        if incident.phase == "verifying" and incident.deadline is not None and now > incident.deadline:
            if incident.attempt >= self.rules.max_attempts:
                return [self._escalate(incident, f"{incident.attempt} attempts did not free GPU {gpu.index}")]
            if unsafe := _unidentified(gpu):
                return [self._escalate(incident, unsafe)]
            incident.attempt += 1
            return [Retried(incident, self._request(incident, gpu, f"GPU {gpu.index} still held after attempt {incident.attempt - 1}", now))]
        return []

    def _request(self, incident: IncidentState, gpu: GpuSample, reason: str, now: datetime) -> ActionRequested:
        """The kill this incident waits for from now on, recorded in it as its pending action."""
        action = _kill_request(incident, gpu, reason, self.rules.idle_util_pct)
        incident.phase = "acting"
        incident.deadline = now + timedelta(seconds=self.rules.action_timeout_s)
        incident.pending_action = PendingAction(
            action_id=action.action_id,
            attempt=action.attempt,
            operation_sha256=operation_digest(action.operation),
            requested_at=now,
        )
        return action

    def _open(self, sample: NodeSampled, gpu: GpuSample, idle_s: float, now: datetime) -> list[Effect]:
        incident = IncidentState(
            incident_id=uuid.uuid4(),
            kind=KIND,
            detector=SOURCE,
            node_id=sample.node_id,
            gpu_index=gpu.index,
            opened_at=now,
            attempt=1,
            phase="acting",
            deadline=None,
        )
        self.incidents[incident.fingerprint] = incident
        pids = " ".join(str(p.pid) for p in gpu.processes)
        opened = IncidentOpened(
            source=SOURCE,
            incident_id=incident.incident_id,
            node_id=incident.node_id,
            kind=KIND,
            gpu_index=gpu.index,
            fingerprint=incident.fingerprint,
            summary=(
                f"GPU {gpu.index} at {gpu.utilization_gpu_pct}% for {idle_s:.0f}s while the node reports "
                f"{sample.jobs.running} job(s) and "
                + ("its output grows only from its busy GPUs" if sample.jobs.output_growing else "no output grows")
                + f"; held by pid {pids}"
            ),
            evidence={
                "idle_seconds": round(idle_s, 1),
                "utilization_gpu_pct": gpu.utilization_gpu_pct,
                "memory_used_mib": gpu.memory_used_mib,
                "jobs_running": sample.jobs.running,
                "output_growing": sample.jobs.output_growing,
                "holder_pids": pids,
            },
        )
        if unsafe := _unidentified(gpu):
            return [Opened(incident, opened, None), self._escalate(incident, unsafe)]
        return [Opened(incident, opened, self._request(incident, gpu, f"zombie job on GPU {gpu.index}", now))]

    def _escalate(self, incident: IncidentState, reason: str) -> Escalated:
        incident.phase = "escalated"
        incident.deadline = None
        incident.pending_action = None
        return Escalated(incident, IncidentEscalated(source=SOURCE, reason=reason, **_ids(incident)))

    def _resolved(self, incident: IncidentState, resolution: str, summary: str) -> Resolved:
        return Resolved(incident, IncidentResolved(source=SOURCE, resolution=resolution, summary=summary, **_ids(incident)))

    def _by_id(self, incident_id: uuid.UUID) -> IncidentState | None:
        return next((i for i in self.incidents.values() if i.incident_id == incident_id), None)


def _ids(incident: IncidentState) -> dict:
    return {"incident_id": incident.incident_id, "node_id": incident.node_id, "kind": KIND, "gpu_index": incident.gpu_index}


def _unidentified(gpu: GpuSample) -> str:
    """Why no kill is safe on this GPU ('' when every holder is fully identified)."""
    pids = [p.pid for p in gpu.processes if p.pid >= 2 and (p.start_ticks is None or not p.command.strip())]
    if not pids:
        return ""
    return (
        f"pid {' '.join(map(str, pids))} on GPU {gpu.index} cannot be identified (no start time or command line "
        "in the sample), so no kill is requested; a person must look"
    )


def _kill_request(incident: IncidentState, gpu: GpuSample, reason: str, idle_util_pct: int) -> ActionRequested:
    targets = tuple(ProcessTarget(pid=p.pid, start_ticks=p.start_ticks, command=p.command) for p in gpu.processes[:64] if p.pid >= 2)
    return ActionRequested(
        source=SOURCE,
        action_id=action_id_for(incident.incident_id, incident.attempt),
        incident_id=incident.incident_id,
        node_id=incident.node_id,
        attempt=incident.attempt,
        operation=KillGpuProcesses(gpu_index=gpu.index, targets=targets, max_gpu_utilization_pct=idle_util_pct),
        reason=reason,
        fingerprint=incident.fingerprint,
    )


def _after_action_summary(gpu: GpuSample) -> str:
    if not gpu.processes:
        return f"GPU {gpu.index} holds no process after the action ({gpu.memory_used_mib} MiB used); verified by the next sample"
    return f"GPU {gpu.index} is busy again ({gpu.utilization_gpu_pct}%) after the action"
