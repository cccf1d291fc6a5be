"""What operators tell the system: silences and maintenance windows (what not to act on, and until
when), and their verdicts on incidents (a false positive).

A silence matches incidents by node, kind and GPU (an absent field matches anything; none at
all silences everything). A silenced finding is still recorded, as silenced, and requests no
action. Silences are facts on the bus, so every detector (and the store) learns them the same way.
"""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

from pydantic import AwareDatetime, ConfigDict, Field, model_validator

from gpumedic_events.base import Event, NodeId
from gpumedic_events.incident import IncidentKind

_SILENCE_ID = "8e9f0a1b-2c3d-4e5f-8a6b-7c8d9e0f1a2b"


class SilenceAdded(Event):
    """An operator silenced some incidents until `ends_at` (a maintenance window, a known issue)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.silence.added"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T09:00:00Z",
                    "source": "gpumedic-cli",
                    "silence_id": _SILENCE_ID,
                    "node_id": "gpu-node-07",
                    "kind": None,
                    "gpu_index": None,
                    "starts_at": "2026-11-22T09:00:00Z",
                    "ends_at": "2026-11-22T13:00:00Z",
                    "reason": "driver upgrade",
                    "created_by": "alice",
                }
            ]
        }
    )

    silence_id: uuid.UUID
    node_id: NodeId | None = Field(default=None, description="Only this node; None: every node.")
    kind: IncidentKind | None = Field(default=None, description="Only this kind; None: every kind.")
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="Only this GPU; None: every GPU.")
    starts_at: AwareDatetime
    ends_at: AwareDatetime
    reason: str = Field(min_length=1, max_length=500, description="Why, for whoever reads the timeline.")
    created_by: str = Field(min_length=1, max_length=128)

    @model_validator(mode="after")
    def _window(self) -> SilenceAdded:
        if self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        return self


class SilenceRemoved(Event):
    """An operator ended a silence before its time."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.silence.removed"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T11:30:00Z",
                    "source": "gpumedic-cli",
                    "silence_id": _SILENCE_ID,
                    "removed_by": "alice",
                }
            ]
        }
    )

    silence_id: uuid.UUID
    removed_by: str = Field(min_length=1, max_length=128)


class IncidentMarked(Event):
    """An operator's verdict on a closed or open incident: it was a false positive. report-builder
    keeps it in the false-positive ledger (how often each detector's rule was wrong); marking
    again replaces the reason."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.verdict.marked"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "3c4d5e6f-7a8b-4c9d-8e0f-2a3b4c5d6e7f",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T12:00:00Z",
                    "source": "gpumedic-cli",
                    "incident_id": "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11",
                    "verdict": "false_positive",
                    "reason": "the job was loading its dataset",
                    "marked_by": "alice",
                }
            ]
        }
    )

    incident_id: uuid.UUID
    verdict: Literal["false_positive"] = "false_positive"
    reason: str = Field(min_length=1, max_length=500)
    marked_by: str = Field(min_length=1, max_length=128)
