"""Which nodes may take new jobs: facts for the autoscaler and for users' own schedulers.

The remediator publishes them (and nobody else may) when a `drain_node` or `undrain_node`
action changes a node's state, and `NodeRetired` when a worker is gone for good (ended by a
`terminate_worker`, or its record marked ended by `mark_worker_ended`). A node is drained while at least one incident holds it; it is
undrained only after the last one was fixed and validated (its GPUs free and healthy in the
next samples, and the policy's check command passing where one is configured).
"""

from __future__ import annotations

import uuid
from typing import ClassVar

from pydantic import ConfigDict, Field

from gpumedic_events.base import Event, NodeId

_INCIDENT_ID = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"
_ACTION_ID = "1f7e3b2a-6c5d-5e4f-9a8b-7c6d5e4f3a21"


class NodeDrainEvent(Event):
    """Fields shared by the facts of a node's state; routed by node."""

    subject_key: ClassVar[str | None] = "node_id"

    node_id: NodeId
    incident_id: uuid.UUID = Field(description="The incident whose action changed the node's state.")
    action_id: uuid.UUID = Field(description="That action (its ledger entry: `gpumedic actions ID`).")
    reason: str = Field(max_length=1000, description="Why, for a person.")


class NodeDrained(NodeDrainEvent):
    """The node takes no new jobs until a NodeUndrained follows."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.drained"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "8a9b0c1d-2e3f-4a5b-8c6d-7e8f9a0b1c06",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:06Z",
                    "source": "remediator",
                    "node_id": "gpu-node-07",
                    "incident_id": _INCIDENT_ID,
                    "action_id": _ACTION_ID,
                    "reason": "gpu_xid on gpu-node-07 GPU 4: XID 48 (Double-bit ECC error)",
                }
            ]
        }
    )


class NodeUndrained(NodeDrainEvent):
    """The node may take jobs again: the incidents that drained it are fixed and validated."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.undrained"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "9b0c1d2e-3f4a-4b5c-9d6e-8f9a0b1c2d07",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:21:40Z",
                    "source": "remediator",
                    "node_id": "gpu-node-07",
                    "incident_id": _INCIDENT_ID,
                    "action_id": "2a8f4c3b-7d6e-5f50-8b9c-8d7e6f5a4b32",
                    "reason": "validated: 3 samples in a row with every GPU free and healthy",
                }
            ]
        }
    )


class NodeRetired(NodeDrainEvent):
    """The node is gone for good: a worker the pool ended. Detectors forget it and close what they
    had open on it (its silence is its end, not a fault); what it sent before arrives late and is
    dropped, and a node of that id that sends something newer is a new node."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.retired"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e08",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:40:12Z",
                    "source": "remediator",
                    "node_id": "pod7xq2a9k",
                    "incident_id": _INCIDENT_ID,
                    "action_id": "3b9a5d4c-8e7f-4a61-9cad-9e8f7a6b5c43",
                    "reason": "terminate_worker succeeded: terminated pod7xq2a9k",
                }
            ]
        }
    )
