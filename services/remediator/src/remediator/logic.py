"""The remediator's gate: may this action run? Pure decisions over plain data, no I/O.

Every side effect in the fleet passes this one function, so its rules are the fleet's safety
policy, in a fixed order: an open circuit breaker, a protected node, another action already
running on the node, too many attempts at the incident, a burst across too many nodes (which
trips the breaker: a sampler bug that reports every GPU idle must never kill the fleet's
jobs), and finally the mode (observe records without acting).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from enum import StrEnum
from typing import Literal

from gpumedic_events import ActionRequested

Mode = Literal["observe", "enforce"]

RESET_HINT = "reset with `gpumedic breaker reset`"


class Verdict(StrEnum):
    ALLOW = "allow"
    OBSERVE = "observe"
    """Decide and record, never act."""
    BLOCK = "block"


@dataclass(frozen=True)
class Decision:
    verdict: Verdict
    reason: str = ""
    trip_reason: str = ""
    """Set when the breaker must open (and stay open) with this decision: why, for the trip record."""

    @property
    def trip_breaker(self) -> bool:
        return bool(self.trip_reason)


@dataclass(frozen=True)
class Policy:
    """The gate's settings, as plain data."""

    mode: Mode = "observe"
    modes: Mapping[str, Mode] = field(default_factory=dict)
    protected_nodes: frozenset[str] = frozenset()
    max_attempts_per_node: int = 3
    breaker_max_nodes: int = 5
    breaker_window_s: float = 600.0

    def mode_for(self, operation: str) -> Mode:
        return self.modes.get(operation, self.mode)


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says about everything other than the action being decided."""

    breaker_open_since: datetime | None = None
    breaker_reason: str = ""
    executing_on_node: tuple[str, ...] = ()
    """Ids of other actions on the same node that are executing now."""
    attempts_for_incident: int = 0
    """Earlier attempts at this incident that ran (or started to)."""
    nodes_in_window: frozenset[str] = frozenset()
    """Distinct nodes with other actions started within the breaker window."""


def decide(request: ActionRequested, *, policy: Policy, ledger_view: LedgerView, now: datetime) -> Decision:
    """The gate's verdict on one request, with the rule that decided it."""
    node = request.node_id
    if ledger_view.breaker_open_since is not None:
        why = f" ({ledger_view.breaker_reason})" if ledger_view.breaker_reason else ""
        return Decision(
            Verdict.BLOCK,
            f"circuit breaker open since {_iso(ledger_view.breaker_open_since)}{why}, {RESET_HINT}",
        )
    if node in policy.protected_nodes:
        return Decision(Verdict.BLOCK, f"node {node} is protected; actions on it need a person")
    if ledger_view.executing_on_node:
        return Decision(
            Verdict.BLOCK,
            f"action {ledger_view.executing_on_node[0]} is already executing on node {node}; one at a time",
        )
    if ledger_view.attempts_for_incident >= policy.max_attempts_per_node:
        return Decision(
            Verdict.BLOCK,
            f"{ledger_view.attempts_for_incident} attempts already made at incident {request.incident_id} "
            f"on node {node} (max {policy.max_attempts_per_node}); needs a person",
        )
    nodes = ledger_view.nodes_in_window | {node}
    if len(nodes) > policy.breaker_max_nodes:
        cause = (
            f"{len(nodes)} distinct nodes needed action within {policy.breaker_window_s:g}s "
            f"(max {policy.breaker_max_nodes})"
        )
        return Decision(
            Verdict.BLOCK,
            f"circuit breaker tripped at {_iso(now)}: {cause}; every action is blocked until a person "
            f"checks the fleet, {RESET_HINT}",
            trip_reason=cause,
        )
    operation = request.operation.operation
    if policy.mode_for(operation) == "observe":
        return Decision(Verdict.OBSERVE, f"observe mode for {operation}: decided and recorded, not run")
    return Decision(Verdict.ALLOW)


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")
