"""The state of one open incident, as its detector persists it and the remediator's gate reads it."""

from __future__ import annotations

import hashlib
import uuid
from datetime import datetime
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_events import IncidentKind, KillGpuProcesses

Phase = Literal["acting", "verifying", "escalated"]
"""acting: an action was requested and no answer came yet; verifying: the action ran and the
next samples will show whether it worked; escalated: a person must look."""


def operation_digest(operation: KillGpuProcesses) -> str:
    """SHA-256 of the operation as the model serialises it: the same operation, the same digest."""
    return hashlib.sha256(operation.model_dump_json().encode()).hexdigest()


class PendingAction(BaseModel):
    """The one action the incident waits for; a request must match it exactly."""

    model_config = ConfigDict(frozen=True)

    action_id: uuid.UUID
    attempt: int = Field(ge=1)
    operation_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    requested_at: datetime


class IncidentState(BaseModel):
    """What the detector remembers of one open incident (persisted between restarts)."""

    incident_id: uuid.UUID
    kind: IncidentKind
    detector: str = Field(description="The service that opened the incident and owns this state.")
    node_id: str
    gpu_index: int | None
    opened_at: datetime
    attempt: int
    phase: Phase
    deadline: datetime | None
    pending_action: PendingAction | None = None
    """Set while acting: the request the remediator may run for this incident, and no other."""
    traceparent: str | None = None
    """The trace context the incident's next step continues (detect, then the action's)."""

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.node_id, self.kind, self.gpu_index)


def fingerprint(node_id: str, kind: IncidentKind | str, gpu_index: int | None) -> str:
    """One open incident per (node, kind, gpu): `gpu-node-07/zombie_job/0`, or `.../node` for node-wide kinds."""
    return f"{node_id}/{IncidentKind(kind).value}/{'node' if gpu_index is None else gpu_index}"
