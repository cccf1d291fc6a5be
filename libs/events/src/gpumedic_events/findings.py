"""What a detector cell found over the nodes of its partitions, for the decider's incident book.

A cell (`zombie_detector.cell`) runs the rules that look at one node at a time over the samples
and node events of the partitions it holds; the findings of one input, or of one tick, go out in
one `NodeFindings`, to be decided together. A rule finds only where something is wrong or an
incident is open, so these are few: the fleet's faults, not its samples.
"""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_events.action import Operation
from gpumedic_events.base import Event, NodeId
from gpumedic_events.incident import Diagnosis, Evidence, IncidentKind, Severity

MAX_FINDINGS = 64
"""The most findings one message carries (a tick over a partition of a large fleet: several messages)."""


class Found(BaseModel):
    """One rule's word on one fingerprint (`gpumedic_incidents.Finding` on the wire)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    kind: IncidentKind
    node_id: NodeId
    gpu_index: int | None = Field(default=None, ge=0, le=63)
    key: str | None = Field(default=None, max_length=128)
    present: bool = True
    summary: str = Field(default="", max_length=1000)
    evidence: Evidence = Field(default_factory=dict)
    severity: Severity = "warning"
    diagnosis: Diagnosis | None = None
    recommended_action: str = Field(default="", max_length=500)
    operations: dict[str, Operation] = Field(default_factory=dict, description="What would fix it now, by the ladder's action name.")
    unsafe: str = Field(default="", max_length=500, description="Why no operation is safe now: a person instead.")
    occurrence: bool = Field(default=False, description="A new occurrence of an event-reported fault, to be counted.")
    related_incident_id: uuid.UUID | None = None
    ready: bool | None = Field(default=None, description="With present=false: a drained node's readiness on one sample.")


class NodeFindings(Event):
    """The findings of one input (a sample, a node event) or one tick of a detector cell."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.detector.findings"
    subject_key: ClassVar[str | None] = "cell"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "2b3c4d5e-6f70-4a81-9b2c-3d4e5f6a7b08",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:05Z",
                    "source": "zombie-detector",
                    "cell": "p07",
                    "observed_at": "2026-11-22T10:15:04Z",
                    "findings": [
                        {
                            "kind": "zombie_job",
                            "node_id": "gpu-node-07",
                            "gpu_index": 0,
                            "summary": "GPU 0 at 0% for 600s while the node reports 1 job(s) and no output grows; held by pid 41230",
                            "evidence": {"idle_seconds": 600.0, "jobs_running": 1, "holder_pids": "41230"},
                        }
                    ],
                }
            ]
        }
    )

    cell: str = Field(pattern=r"^p[0-9]{2}$", description="The partition whose input or tick it is (`p07`).")
    observed_at: datetime = Field(description="When the node sent what was found (a tick's: the tick's time): a fact "
                                  "sent before its node was retired and found after is no node coming back.")
    findings: tuple[Found, ...] = Field(min_length=1, max_length=MAX_FINDINGS)

