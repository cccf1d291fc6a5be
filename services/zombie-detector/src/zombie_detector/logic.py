"""Deciding, from node samples and action results alone, when a GPU runs a zombie job and
what happens to the incident next. Pure: no bus, no clock, no I/O; tests drive it directly.

A zombie job: the node says it runs jobs, a GPU that holds compute processes stays at or
under `idle_util_pct` for `idle_for_s`, and no output grows that this GPU could be making.
Output growth is a node-wide signal, so it is credited to the node's busy GPUs when there are
any: one hung job among busy ones is still found. The incident then walks:

    opened + action requested (acting) -> action completed (verifying) -> resolved
                                       -> blocked or observe-only      -> escalated
    verifying past its deadline        -> next attempt, or escalated after `max_attempts`

One open incident per (node, kind, gpu) fingerprint; while it is open, repeats only update it.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from pydantic import BaseModel

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

SOURCE = "zombie-detector"
KIND = IncidentKind.ZOMBIE_JOB


@dataclass(frozen=True)
class Rules:
    idle_util_pct: int = 5
    idle_for_s: float = 600.0
    verify_within_s: float = 60.0
    action_timeout_s: float = 300.0
    max_attempts: int = 2


class TrackedIncident(BaseModel):
    """What the detector remembers of one open incident (persisted between restarts)."""

    incident_id: uuid.UUID
    node_id: str
    gpu_index: int
    opened_at: datetime
    attempt: int
    phase: Literal["acting", "verifying", "escalated"]
    deadline: datetime | None
    traceparent: str | None = None
    """The trace context the incident's next step continues (detect, then the action's)."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.node_id, self.gpu_index)


@dataclass(frozen=True)
class Opened:
    incident: TrackedIncident
    opened: IncidentOpened
    action: ActionRequested


@dataclass(frozen=True)
class Retried:
    incident: TrackedIncident
    action: ActionRequested


@dataclass(frozen=True)
class Followed:
    """The incident's state changed, with no event to publish (persist it)."""

    incident: TrackedIncident


@dataclass(frozen=True)
class Resolved:
    incident: TrackedIncident
    event: IncidentResolved


@dataclass(frozen=True)
class Escalated:
    incident: TrackedIncident
    event: IncidentEscalated


Effect = Opened | Retried | Followed | Resolved | Escalated


def fingerprint(node_id: str, gpu_index: int) -> str:
    return f"{node_id}/{KIND.value}/{gpu_index}"


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
    incidents: dict[str, TrackedIncident] = field(default_factory=dict)
    idle_since: dict[tuple[str, int], datetime] = field(default_factory=dict)
    watched: set[str] = field(default_factory=set)
    """Nodes with an idle timer or an open incident: the only ones a healthy sample concerns."""

    def adopt(self, incident: TrackedIncident) -> None:
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
            since = self.idle_since.setdefault(key, sample.occurred_at)
            idle_s = (sample.occurred_at - since).total_seconds()
            if idle_s >= self.rules.idle_for_s:
                del self.idle_since[key]
                effects.append(self._open(sample, gpu, idle_s, now))
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
        return [Followed(incident)]

    def on_tick(self, now: datetime) -> list[Effect]:
        """Deadlines that pass without any sample: a remediator that never answered."""
        return [
            self._escalate(i, f"no answer from the remediator within {self.rules.action_timeout_s:.0f}s")
            for i in list(self.incidents.values())
            if i.phase == "acting" and i.deadline is not None and now > i.deadline
        ]

    def forget(self, incident: TrackedIncident) -> None:
        self.incidents.pop(incident.fingerprint, None)

    def _follow(
        self, incident: TrackedIncident, gpu: GpuSample, zombie: bool, sample: NodeSampled, now: datetime
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
            incident.attempt += 1
            incident.phase = "acting"
            incident.deadline = now + timedelta(seconds=self.rules.action_timeout_s)
            return [Retried(incident, _kill_request(incident, gpu, f"GPU {gpu.index} still held after attempt {incident.attempt - 1}"))]
        return []

    def _open(self, sample: NodeSampled, gpu: GpuSample, idle_s: float, now: datetime) -> Opened:
        incident = TrackedIncident(
            incident_id=uuid.uuid4(),
            node_id=sample.node_id,
            gpu_index=gpu.index,
            opened_at=now,
            attempt=1,
            phase="acting",
            deadline=now + timedelta(seconds=self.rules.action_timeout_s),
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
        return Opened(incident, opened, _kill_request(incident, gpu, f"zombie job on GPU {gpu.index}"))

    def _escalate(self, incident: TrackedIncident, reason: str) -> Escalated:
        incident.phase = "escalated"
        incident.deadline = None
        return Escalated(incident, IncidentEscalated(source=SOURCE, reason=reason, **_ids(incident)))

    def _resolved(self, incident: TrackedIncident, resolution: str, summary: str) -> Resolved:
        return Resolved(incident, IncidentResolved(source=SOURCE, resolution=resolution, summary=summary, **_ids(incident)))

    def _by_id(self, incident_id: uuid.UUID) -> TrackedIncident | None:
        return next((i for i in self.incidents.values() if i.incident_id == incident_id), None)


def _ids(incident: TrackedIncident) -> dict:
    return {"incident_id": incident.incident_id, "node_id": incident.node_id, "kind": KIND, "gpu_index": incident.gpu_index}


def _kill_request(incident: TrackedIncident, gpu: GpuSample, reason: str) -> ActionRequested:
    targets = tuple(ProcessTarget(pid=p.pid, start_ticks=p.start_ticks, command=p.command) for p in gpu.processes[:64] if p.pid >= 2)
    return ActionRequested(
        source=SOURCE,
        action_id=action_id_for(incident.incident_id, incident.attempt),
        incident_id=incident.incident_id,
        node_id=incident.node_id,
        attempt=incident.attempt,
        operation=KillGpuProcesses(gpu_index=gpu.index, targets=targets),
        reason=reason,
    )


def _after_action_summary(gpu: GpuSample) -> str:
    if not gpu.processes:
        return f"GPU {gpu.index} holds no process after the action ({gpu.memory_used_mib} MiB used); verified by the next sample"
    return f"GPU {gpu.index} is busy again ({gpu.utilization_gpu_pct}%) after the action"
