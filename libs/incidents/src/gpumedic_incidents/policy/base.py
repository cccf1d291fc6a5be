"""What every section of the policy shares: strict models, node selectors, the URL and command forms."""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from pydantic import BaseModel, ConfigDict

Action = Literal[
    "kill_gpu_processes", "restart_unit", "gpu_reset", "docker_prune", "reboot_node", "http_admin", "drain_node",
    "undrain_node", "spawn_worker", "terminate_worker", "restart_worker", "requeue_tasks", "mark_worker_ended", "restart_job",
    "accept_worker", "stop_job", "kill_pattern",
]
"""The catalogue's operations a ladder may name."""
Mode = Literal["observe", "enforce"]
SAMPLER_UNIT = "gpumedic-node-sampler.service"
MAX_ASKS_WHILE_IN_USE = 80
"""An incident's actions are numbered up to 100 (ActionRequested.attempt): waiting must leave room."""

HOOK_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
"""The scheduler's drain hook, POSTed by the remediator: a plain URL, no user info, no query."""
CHECK_COMMAND = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
"""The node's own readiness check: an absolute path to an executable, no arguments, no `..`."""

HEALTH_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
"""A unit's health endpoint, fetched by `curl` on the node itself: loopback, plain characters only."""


_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
SELECTOR = re.compile(rf"^(?:group:(?P<group>{_NAME})|label:(?P<key>{_NAME})=(?P<value>[A-Za-z0-9_.:/-]{{0,63}})|(?P<node>{_NAME}))$")


@dataclass(frozen=True)
class NodeSelector:
    """Which nodes a rule covers: `gpu-node-07` (one node), `group:lambda` (an inventory group) or
    `label:role=p2p` (nodes with that label). The inventory says which group and labels a node has."""

    text: str

    def __post_init__(self) -> None:
        if not SELECTOR.fullmatch(self.text):
            raise ValueError(f"{self.text[:100]!r} is not a node selector (NODE, group:NAME or label:KEY=VALUE)")

    def matches(self, node_id: str, group: str | None = None, labels: Mapping[str, str] | None = None) -> bool:
        found = SELECTOR.fullmatch(self.text)
        assert found is not None
        if found["group"] is not None:
            return group == found["group"]
        if found["key"] is not None:
            return (labels or {}).get(found["key"]) == found["value"]
        return node_id == found["node"]


def selects(selectors: tuple[NodeSelector, ...] | frozenset[NodeSelector], node_id: str, group: str | None, labels: Mapping[str, str] | None) -> bool:
    return any(s.matches(node_id, group, labels) for s in selectors)


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the file and, where known, the line."""


class Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
