"""What the control plane finds when it checks a node from outside (the node cannot say it itself)."""

from __future__ import annotations

from typing import ClassVar, Literal

from pydantic import ConfigDict, Field

from gpumedic_events.base import Event, NodeId

SshCause = Literal["ok", "refused", "timeout", "auth_refused", "host_key_changed", "unreachable", "not_in_inventory"]


class NodeSshChecked(Event):
    """The remediator tried a read-only SSH login to a node (no command runs); sent when the answer changes."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.ssh_checked"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "5c6d7e8f-9a0b-4c1d-8e2f-3a4b5c6d7e8f",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:21:00Z",
                    "source": "remediator",
                    "node_id": "gpu-node-07",
                    "reachable": False,
                    "cause": "refused",
                    "detail": "connection refused",
                    "failures": 2,
                }
            ]
        }
    )

    node_id: NodeId
    reachable: bool = Field(description="The login worked.")
    cause: SshCause = Field(
        description="ok, or why not: refused (nothing listens), timeout (no answer), auth_refused (the key or user "
        "is wrong), host_key_changed (not the key known_hosts trusts), unreachable (other network errors), "
        "not_in_inventory."
    )
    detail: str = Field(default="", max_length=500, description="The client's words, without any secret.")
    failures: int = Field(default=0, ge=0, description="Failed checks in a row, 0 when reachable.")
