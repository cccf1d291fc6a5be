"""The state of one open incident, as its detector persists it and the remediator's gate reads it,
and the `Finding` a rule reports about one fingerprint."""

from __future__ import annotations

import dataclasses
import hashlib
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_events import Diagnosis, Evidence, IncidentKind, KillGpuProcesses, Operation, Severity
from gpumedic_events.redact import redact, redact_tree

Phase = Literal["held", "acting", "waiting", "verifying", "validating", "escalated", "silenced"]
"""held: waiting out the fleet hold before its first action; acting: an action was requested and
no answer came yet; waiting: the action was refused only because its target is in use (a GPU
reset under a running job), and is asked for again at the deadline; verifying: the action ran and
the next findings will show whether it worked;
validating: the fault is gone, and the node it drained waits for healthy samples before it is
undrained; escalated: a person must look; silenced: a silence covers it, nothing is done."""

def operation_digest(operation: Operation) -> str:
    """SHA-256 of the operation as the model serialises it: the same operation, the same digest."""
    return hashlib.sha256(operation.model_dump_json().encode()).hexdigest()


def fingerprint(node_id: str, kind: IncidentKind | str, gpu_index: int | None, key: str | None = None) -> str:
    """One open incident per (node, kind, gpu[, key]): `gpu-node-07/zombie_job/0`,
    `gpu-node-07/disk_pressure/node`, `gpu-node-07/container_died/node/3f9c2a7d4b1e`."""
    base = f"{node_id}/{IncidentKind(kind).value}/{'node' if gpu_index is None else gpu_index}"
    return f"{base}/{key}" if key else base


ENDS_WORK = frozenset({"kill_gpu_processes", "stop_job", "gpu_reset", "reboot_node", "restart_worker", "terminate_worker", "kill_pattern"})
"""The operations that end processes on the nodes they reach: a container's exit 137 or 143 there,
while one runs, is gpumedic's own doing (`book.RecentActions`)."""


def ends_work_on(operation: Operation, node_id: str) -> tuple[str, ...]:
    """The nodes whose processes `operation`, asked for on `node_id`, may end (a job's stop: every
    node of its ranks); none for an operation that ends no work."""
    if operation.operation not in ENDS_WORK:
        return ()
    return tuple(sorted({node_id, *(rank.node_id for rank in getattr(operation, "ranks", ()))}))


class PendingAction(BaseModel):
    """The one action the incident waits for; a request must match it exactly."""

    model_config = ConfigDict(frozen=True)

    action_id: uuid.UUID
    attempt: int = Field(ge=1)
    operation_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    requested_at: datetime
    request_sha256: str | None = Field(default=None, pattern=r"^[0-9a-f]{64}$")
    """The request's `ActionRequested.request_sha256`: the answer taken is the one to this request."""
    ends_work_on: tuple[str, ...] = ()
    """The nodes whose processes it may end (`ends_work_on`): what ends there meanwhile is its doing."""


class Unpublished(BaseModel):
    """One event of an incident's outbox: its type's name and its JSON."""

    model_config = ConfigDict(frozen=True)

    event: str
    body: str


class IncidentState(BaseModel):
    """What a detector remembers of one open incident (persisted between restarts). Frozen: every
    change is a new state, saved before anything about it is published."""

    model_config = ConfigDict(frozen=True)

    incident_id: uuid.UUID
    kind: IncidentKind
    detector: str = Field(description="The service that opened the incident and owns this state.")
    node_id: str
    gpu_index: int | None
    key: str | None = None
    """What tells apart several incidents of one kind on one node and GPU (a container)."""
    cluster: str | None = None
    """The peer cluster it is about (leader-health's), which a silence may match."""
    opened_at: datetime
    last_seen_at: datetime
    occurrences: int = 1
    phase: Phase
    deadline: datetime | None = None
    step: int = 0
    """The ladder step being tried."""
    step_attempts: int = 0
    """Actions requested at this step."""
    attempt: int = 0
    """Actions requested in all; the n-th action's id is action_id_for(incident, n)."""
    pending_action: PendingAction | None = None
    """Set while acting: the request the remediator may run for this incident, and no other."""
    proposed: Operation | None = None
    """The latest operation the rule proposed (taken when the hold ends, or for the next attempt)."""
    unsafe: str = ""
    """Why no operation is safe now, if the rule said so."""
    summary: str = ""
    related_incident_id: uuid.UUID | None = None
    silence_id: uuid.UUID | None = None
    traceparent: str | None = None
    """The trace context the incident's next step continues (detect, then the action's)."""
    outbox: tuple[Unpublished, ...] = ()
    """The events of this incident's last transition (its announcement, its action request, ...),
    kept only until all are published: a detector that stopped between saving the transition and
    publishing them publishes them when it resumes (their ids de-duplicate), so no incident acts
    unannounced and no action it waits for is never asked for."""
    waiting_since: datetime | None = None
    """When the current step was first refused because its target was in use (phase `waiting`)."""
    drained: bool = False
    """A drain_node step of its ladder succeeded: the node stays drained until this incident is
    validated and undrained (or a person steps in)."""
    resolution: Literal["fixed", "cleared"] | None = None
    """Set once the fault is gone (and a job's restart or a drained node's validation is still to
    come): how the incident resolves."""
    restarting: bool = False
    """While the kind's job restart after the fix is asked for (before validation, on a drained node)."""
    ready_samples: int = 0
    """While validating: samples in a row that showed the GPUs free and healthy."""
    traits: dict[str, str] = Field(default_factory=dict)
    """What its evidence said the node ran when it opened (`TRAITS`: the image, the driver, the
    provider, the GPU type): a fleet incident names what most of its nodes share."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.node_id, self.kind, self.gpu_index, self.key)


TRAITS = ("image", "driver_version", "cuda_version", "provider", "gpu_type")
"""Evidence a fleet-wide fault may come with (a rollout, a driver update, one provider's machines)."""


def traits_of(evidence: Evidence) -> dict[str, str]:
    return {key: value[:200] for key in TRAITS if isinstance(value := evidence.get(key), str) and value}


@dataclass(frozen=True)
class Finding:
    """What a rule says about one fingerprint now: the fault is there (with its evidence and what
    would fix it), or it is gone (`present=False`)."""

    kind: IncidentKind
    node_id: str
    gpu_index: int | None = None
    key: str | None = None
    present: bool = True
    summary: str = ""
    evidence: Evidence = field(default_factory=dict)
    severity: Severity = "warning"
    diagnosis: Diagnosis | None = None
    recommended_action: str = ""
    operations: Mapping[str, Operation] = field(default_factory=dict)
    """What would fix it now, by the ladder's action name (e.g. the processes to kill)."""
    unsafe: str = ""
    """Why no operation is safe now (a holder that cannot be identified): a person instead."""
    occurrence: bool = False
    """A new occurrence of an event-reported fault (an XID repeat), counted; level findings are not."""
    related_incident_id: uuid.UUID | None = None
    ready: bool | None = None
    """With present=False, a readiness verdict on one sample of a drained node's GPUs (validation):
    True when they are free and healthy, False (with `summary` saying why) when not."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.node_id, self.kind, self.gpu_index, self.key)

    @property
    def cluster(self) -> str | None:
        """The peer cluster it is about, where its evidence names one."""
        cluster = self.evidence.get("cluster")
        return cluster if isinstance(cluster, str) else None


def masked(finding: Finding) -> Finding:
    """`finding` with the job text it copies from a node masked again (`gpumedic_events.redact`): a
    node-sampler masks before it publishes, but an old one or a hostile node may not, and whatever a
    finding says goes into incidents, action requests and the incident state on the bus. A kill's
    target keeps its masked command line: the remediator masks the node's the same way to compare."""
    operations = {
        name: op.model_copy(update={"targets": tuple(t.model_copy(update={"command": redact(t.command)}) for t in op.targets)})
        if isinstance(op, KillGpuProcesses) else op
        for name, op in finding.operations.items()
    }
    diagnosis = finding.diagnosis and finding.diagnosis.model_copy(
        update={"explanation": redact(finding.diagnosis.explanation), "remedies": tuple(map(redact, finding.diagnosis.remedies))}
    )
    return dataclasses.replace(
        finding, summary=redact(finding.summary), evidence=redact_tree(finding.evidence), diagnosis=diagnosis,
        recommended_action=redact(finding.recommended_action), unsafe=redact(finding.unsafe), operations=operations,
    )


def cleared(kind: IncidentKind, node_id: str, gpu_index: int | None = None, key: str | None = None) -> Finding:
    """The finding that says a fault is gone."""
    return Finding(kind=kind, node_id=node_id, gpu_index=gpu_index, key=key, present=False)
