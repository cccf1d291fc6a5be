"""The incident lifecycle: opened by a detector, then resolved or escalated to a person."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from gpumedic_events.base import Event, NodeId

_INCIDENT_ID = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"


class IncidentKind(StrEnum):
    """What went wrong. New kinds may be added within v1; consumers must accept unknown ones."""

    ZOMBIE_JOB = "zombie_job"


class IncidentEvent(Event):
    """Fields shared by every incident event; routed by node."""

    subject_key: ClassVar[str | None] = "node_id"

    incident_id: uuid.UUID = Field(description="The incident this event belongs to.")
    node_id: NodeId
    kind: IncidentKind = Field(description="What kind of failure the incident is.")
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="The GPU concerned, if one.")


class IncidentOpened(IncidentEvent):
    """A detector saw a failure and opened an incident for it."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.opened"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "0c6f1e0a-2a55-4e8e-8f61-6a3f1b2c3d01",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:05Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "fingerprint": "gpu-node-07/zombie_job/0",
                    "summary": "GPU 0 below 5% for 600s while the node reports 1 job and no output grows",
                    "evidence": {"idle_seconds": 600.0, "jobs_running": 1, "holder_pids": "41230"},
                }
            ]
        }
    )

    fingerprint: str = Field(max_length=200, description="(node, kind, gpu): one open incident per fingerprint.")
    summary: str = Field(max_length=1000, description="One sentence a person understands.")
    evidence: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="The measurements that led to the incident."
    )


class IncidentResolved(IncidentEvent):
    """The failure is gone: fixed by an action and verified, or cleared by itself."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.resolved"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "5e2d7c10-7a4b-4f0e-b1a2-3c4d5e6f7a02",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:20Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "resolution": "fixed",
                    "summary": "GPU 0 holds no process after the kill; verified by the next sample",
                }
            ]
        }
    )

    resolution: Literal["fixed", "cleared"] = Field(
        description="fixed: an action ran and the next samples confirmed it; cleared: it went away by itself."
    )
    summary: str = Field(max_length=1000)


class IncidentEscalated(IncidentEvent):
    """gpumedic will not (or could not) fix this; a person must look."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.escalated"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c03",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:16:00Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "reason": "2 kill attempts did not free GPU 0",
                }
            ]
        }
    )

    reason: str = Field(max_length=1000, description="Why a person is needed.")
