"""The remediator's gate: may this action run? Pure decisions over plain data, no I/O.

Every side effect in the fleet passes this gate, so its rules are the fleet's safety policy,
in a fixed order. First the request itself (`refusal`): it must be young enough, name an
incident that is open on that node and GPU and waits for exactly this action, and identify
every process fully. A request that fails any of these was forged, replayed or overtaken by
events; it is refused and counts for nothing. Then the fleet (`fleet_verdict`): an open circuit
breaker, a protected node, another action already running on the node, too many actions on the
node lately, a burst across too many nodes (which trips the breaker: a sampler bug that
reports every GPU idle must never kill the fleet's jobs), and finally the mode (observe
records without acting). The handler takes `fleet_verdict` one request at a time under a lock in
the store, so a burst of requests cannot slip past the breaker together.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from enum import StrEnum
from typing import Literal

from gpumedic_bus.topology import owner_of
from gpumedic_events import ActionRequested, Matcher, operation_gpu
from gpumedic_incidents import IncidentState, operation_digest
from gpumedic_incidents.policy import Actions, Kinds, NodeSelector, PreflightPolicy, selects
from gpumedic_nodes.inventory import NodeAddress
from remediator.catalogue import Fit, InvalidParameter, render, spec_of
from remediator.catalogue.base import KnownLeader

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
class Gate:
    """The gate's settings, as plain data."""

    mode: Mode = "observe"
    """The remediator's master switch: observe overrides every action's own mode."""
    actions: Actions = field(default_factory=Actions)
    """The policy file's per-operation modes and allow-lists."""
    kinds: Kinds = field(default_factory=Kinds)
    """The policy file's kinds: each one's ladder and the thresholds that make its actions safe."""
    preflight: PreflightPolicy = field(default_factory=PreflightPolicy)
    """When a GPU is free and healthy (a new worker's acceptance)."""
    protected_nodes: frozenset[NodeSelector] = frozenset()
    """Selectors (a node, group:NAME, label:KEY=VALUE) of the nodes never acted on."""
    max_actions_per_node: int = 3
    """Actions on one node within `node_window_s` (from the policy file's `gate`)."""
    node_window_s: float = 3600.0
    breaker_max_nodes: int = 5
    breaker_max_share: float = 0.25
    """Nor more than this share of the inventory's nodes (at least one node may always act)."""
    breaker_window_s: float = 600.0
    max_request_age_s: float = 120.0

    def mode_for(self, operation: str) -> Mode:
        return "observe" if self.mode == "observe" else self.actions.of(operation).mode

    def protects(self, node_id: str, node: NodeAddress | None) -> bool:
        return selects(self.protected_nodes, node_id, node and node.group, node and node.labels)


@dataclass(frozen=True)
class OwnFacts:
    """What the gate knows from sources of its own, never from a request or a detector's state:
    where an operation goes and whether it may follow another are derived from these."""

    leader: KnownLeader | None = None
    """leader-health's latest check of the cluster the request's node is in (None: no check names it)."""
    killed: frozenset[str] = frozenset()
    """The nodes where the remediator's own ledger holds a succeeded (verified) kill or job stop for
    the request's incident."""


@dataclass(frozen=True)
class LedgerView:
    """What the ledger says about everything other than the action being decided."""

    breaker_open_since: datetime | None = None
    breaker_reason: str = ""
    executing_on_node: tuple[str, ...] = ()
    """Ids of other actions on the same node that are executing now."""
    actions_on_node: int = 0
    """Other actions on the same node within the node window that ran (or started to)."""
    nodes_in_window: frozenset[str] = frozenset()
    """Distinct nodes with other actions started within the breaker window."""
    fleet_size: int = 0
    """Nodes in the inventory; 0 when unknown (then only the count limit applies)."""


def refusal(
    request: ActionRequested,
    *,
    incident: IncidentState | None,
    gate: Gate,
    now: datetime,
    stored_at: datetime | None,
    facts: OwnFacts = OwnFacts(),
    fleet: IncidentState | None = None,
) -> str:
    """Why this request must be refused whatever the fleet looks like ('' when it may go on).

    `incident` is the open incident stored under the request's fingerprint (None if none);
    `stored_at` is when the stream stored the request, by the server's clock: a sender can
    choose `occurred_at`, not that, so the older of the two counts; `facts` what the remediator
    knows of its own (the cluster's leader, its ledger's kills); `fleet` the open fleet incident
    over the incident's kind (`gpumedic_incidents.fleet_fingerprint`; None if none).
    """
    oldest = min(request.occurred_at, stored_at) if stored_at is not None else request.occurred_at
    age_s = (now - oldest).total_seconds()
    if age_s > gate.max_request_age_s:
        return (
            f"refused: the request is {age_s:.0f}s old (limit {gate.max_request_age_s:g}s); a stale request never "
            "runs, and the detector asks again if the fault is still there"
        )
    where = f"incident {request.incident_id}"
    if request.fingerprint is None:
        return f"refused: the request names no incident fingerprint, so {where} cannot be checked"
    if incident is None:
        return f"refused: {where} is not open (no open incident has fingerprint {request.fingerprint})"
    if incident.incident_id != request.incident_id:
        return f"refused: {where} is not open (the open incident on {request.fingerprint} is {incident.incident_id})"
    owner = owner_of(incident.kind, incident.key)
    if incident.detector != owner:
        return (
            f"refused: the state of {where} names {incident.detector} as its detector, but {incident.kind.value} "
            f"incidents are opened by {owner or 'no detector'} (gpumedic_bus.topology.OPENS)"
        )
    if incident.detector != request.source:
        return f"refused: {where} was opened by {incident.detector}, not by {request.source}"
    gpu = operation_gpu(request.operation)
    if incident.node_id != request.node_id or (gpu is not None and gpu != incident.gpu_index):
        asked = request.node_id if gpu is None else f"{request.node_id} GPU {gpu}"
        return f"refused: the request is for node {asked}, but {where} is on {_where(incident)}"
    if incident.fingerprint != request.fingerprint:
        return f"refused: the state stored under {request.fingerprint} is that of {incident.fingerprint}"
    pending = incident.pending_action
    if incident.phase != "acting" or pending is None:
        return f"refused: {where} is {incident.phase}, not waiting for an action"
    if (pending.action_id, pending.attempt) != (request.action_id, request.attempt):
        return (
            f"refused: {where} waits for attempt {pending.attempt} (action {pending.action_id}), not attempt "
            f"{request.attempt} (action {request.action_id})"
        )
    if operation_digest(request.operation) != pending.operation_sha256:
        return f"refused: the operation differs from the one {incident.detector} decided for {where}"
    if fleet is not None and incident.resolution is None:
        # The detector links only incidents still held; one already acting when much of the fleet
        # showed the same kind stops here, as does one decided by a detector that sees part of the fleet.
        return (
            f"refused: fleet incident {fleet.incident_id} is open for {incident.kind.value} ({fleet.summary[:200]}); "
            "no node's fault step runs while it is"
        )
    if why := policy_refusal(request, incident, gate, facts, now):
        return f"refused: {why}"
    try:
        render(request.operation, gate.actions)
    except InvalidParameter as exc:
        return f"refused: {exc}"
    return ""


def policy_refusal(request: ActionRequested, incident: IncidentState, gate: Gate, facts: OwnFacts, now: datetime) -> str:
    """Why the policy does not allow this operation for this incident now ('' when it does).

    The request only names a step: which operation the incident's ladder calls for at its current
    step, and every parameter that makes that operation safe (the kill's GPU state, signal and
    grace, the unit, the endpoint and where it is called, the workers), come from the policy file,
    the incident and the remediator's own sources (the catalogue's `fits`), so nothing a request
    (or a state written by its detector) carries can loosen a check."""
    kind = incident.kind
    rules = gate.kinds.of(kind, incident.key)
    name = request.operation.operation
    if incident.resolution is not None and (incident.restarting or not incident.drained):
        expected, rung = "restart_job", f"the restart after the fix (kinds.{kind.value}.restart_job)"
    elif incident.resolution is not None:
        expected, rung = "undrain_node", "validation (the incident drained its node)"
    elif incident.step < len(rules.ladder):
        expected, rung = rules.ladder[incident.step].action, f"kinds.{kind.value}.ladder step {incident.step + 1}"
    else:
        return f"the policy's kinds.{kind.value}.ladder has no step {incident.step + 1}, so no action is due"
    if name != expected:
        return f"{rung} is {expected}, not {name}"
    fit = Fit(incident=incident, rules=rules, actions=gate.actions, now=now, max_age_s=gate.max_request_age_s,
              leader=facts.leader, killed=facts.killed)
    return spec_of(request.operation).fits(request.operation, fit)


def fleet_verdict(
    request: ActionRequested,
    *,
    gate: Gate,
    ledger_view: LedgerView,
    now: datetime,
    address: NodeAddress | None = None,
    in_inventory: bool = True,
    reached: Mapping[str, NodeAddress | None] | None = None,
) -> Decision:
    """The fleet's verdict on one request that passed `refusal`, with the rule that decided it.

    `address` is the node's inventory entry (its group and labels), None when the inventory lacks
    it; `in_inventory` is False only when the inventory was read and does not name the node;
    `reached`: the other nodes the operation logs in to (a job's ranks), with their entries (None:
    the inventory, read, lacks it), each held to the same protection and inventory rules."""
    node = request.node_id
    if ledger_view.breaker_open_since is not None:
        why = f" ({ledger_view.breaker_reason})" if ledger_view.breaker_reason else ""
        return Decision(
            Verdict.BLOCK,
            f"circuit breaker open since {_iso(ledger_view.breaker_open_since)}{why}, {RESET_HINT}",
        )
    if gate.protects(node, address):
        return Decision(Verdict.BLOCK, f"node {node} is protected; actions on it need a person")
    operation = request.operation
    spec = spec_of(operation)
    if not in_inventory and spec.logs_in:
        return Decision(Verdict.BLOCK, f"node {node} is not in the remediator's inventory: nothing is run on a node it "
                                       "cannot name (add it to the inventory if it is one of yours)")
    for other, entry in sorted((reached or {}).items()):
        if gate.protects(other, entry):
            return Decision(Verdict.BLOCK, f"node {other}, which {operation.operation} would act on too, is protected; actions on it need a person")
        if entry is None:
            return Decision(Verdict.BLOCK, f"node {other}, which {operation.operation} would act on too, is not in the remediator's "
                                           "inventory: nothing is run on a node it cannot name")
    scoped = spec.scope(operation, gate.actions)
    if scoped is not None and not scoped[0].allowed_on(node, address and address.group, address and address.labels):
        rule, what, where = scoped
        return Decision(Verdict.BLOCK, f"{what} only on {', '.join(rule.nodes)} ({where}), not on node {node}")
    if ledger_view.executing_on_node:
        return Decision(
            Verdict.BLOCK,
            f"action {ledger_view.executing_on_node[0]} is already executing on node {node}; one at a time",
        )
    name = operation.operation
    if spec.fix and ledger_view.actions_on_node >= gate.max_actions_per_node:
        return Decision(
            Verdict.BLOCK,
            f"{ledger_view.actions_on_node} actions already ran on node {node} within {gate.node_window_s:g}s "
            f"(max {gate.max_actions_per_node}); a node that keeps needing fixes needs a person",
        )
    # Moving jobs away from a node or back harms no job: not counted (an open breaker still holds
    # them, and a signal on much of the fleet never gets this far: it is one fleet incident).
    nodes = ledger_view.nodes_in_window | ({node} if spec.fix else set())
    # Every node that acts is part of the fleet, whatever an out-of-date inventory says.
    fleet = max(ledger_view.fleet_size, len(nodes)) if ledger_view.fleet_size else 0
    limit, limit_why = breaker_limit(gate, fleet)
    if len(nodes) > limit:
        cause = f"{len(nodes)} distinct nodes needed action within {gate.breaker_window_s:g}s ({limit_why})"
        return Decision(
            Verdict.BLOCK,
            f"circuit breaker tripped at {_iso(now)}: {cause}; every action is blocked until a person "
            f"checks the fleet, {RESET_HINT}",
            trip_reason=cause,
        )
    if gate.mode_for(name) == "observe":
        switch = "the remediator runs in observe mode" if gate.mode == "observe" else f"the policy's actions.{name}.mode is observe"
        return Decision(Verdict.OBSERVE, f"observe mode for {name} ({switch}): decided and recorded, not run")
    return Decision(Verdict.ALLOW)


def breaker_limit(gate: Gate, fleet_size: int) -> tuple[int, str]:
    """How many distinct nodes may act within the breaker window, and why that many: the smaller of
    the count and the share of the fleet (a share of a small fleet still lets one node act)."""
    count = (gate.breaker_max_nodes, f"max {gate.breaker_max_nodes}")
    if fleet_size <= 0:
        return count
    by_share = max(1, math.floor(gate.breaker_max_share * fleet_size))
    if by_share >= gate.breaker_max_nodes:
        return count
    return by_share, f"max {gate.breaker_max_share:.0%} of the {fleet_size} nodes in the inventory: {by_share}"


def _where(incident: IncidentState) -> str:
    return f"node {incident.node_id}" + ("" if incident.gpu_index is None else f" GPU {incident.gpu_index}")


def _iso(moment: datetime) -> str:
    return moment.isoformat(timespec="seconds")


def maintenance(silence, node_id: str, now: datetime) -> bool:
    """Whether a stored silence holds `node_id` out of a fleet operation now: it is in force, and it
    silences everything of that node (no kind, no GPU; its matchers, if any, only about the node):
    a person's maintenance window there, as `gpumedic silence --node N --for 2h` sets it."""
    if silence.kind is not None or silence.gpu_index is not None or silence.node_id not in (None, node_id):
        return False
    try:
        matchers = [Matcher.parse(text) for text in silence.matchers or ()]
    except ValueError:
        return False
    if any(m.label != "node" for m in matchers) or not all(m.matches({"node": node_id}) for m in matchers):
        return False
    if silence.node_id is None and not matchers:
        return False  # a silence of everything mutes the fleet's alarms; a fleet operation is a person's own deliberate act
    starts, ends = _aware(silence.starts_at), _aware(silence.ends_at)
    if now < starts:
        return False
    if not silence.every_s:
        return now < ends
    start = starts + timedelta(seconds=silence.every_s * ((now - starts).total_seconds() // silence.every_s))
    last = _aware(silence.last_ends_at or silence.ends_at)
    return now < start + (ends - starts) and start + (ends - starts) <= last


def _aware(moment: datetime) -> datetime:
    return moment if moment.tzinfo else moment.replace(tzinfo=UTC)
