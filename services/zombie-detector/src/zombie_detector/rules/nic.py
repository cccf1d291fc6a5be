"""nic_degraded and nic_flapping: the InfiniBand and RoCE ports a multi-node job's collectives run
over (`NodeSampled.host.ib_ports`, as node-sampler reads them from /sys/class/infiniband).

- nic_degraded: a port that was up (ACTIVE, LinkUp) since the sampler first saw it is down, or
  runs below the highest rate it ran at (a cable or transceiver that trained down: 200 Gb/s
  where it ran 400) or below the policy's `min_rate_gbps`, for `for_s`. A port never seen up is
  a port nobody cabled: nothing. Ports are not compared with each other: a node's front-end NIC
  at 100 Gb/s beside its 400 Gb/s fabric is how it was built.
- nic_flapping: within `window_s`, the port's link went down `link_downs` times or more
  (`link_downed`, the Port Training state machine giving up), or its error counters (symbol,
  receive, link recovery, local link integrity, buffer overrun) rose faster than
  `errors_per_hour`. A counter that went back (a reset, a reboot) starts the count again.

One incident per port (key: device and port). Both are a person's by default: a port does not
fix itself from the node, and a node's other jobs may not use it.
"""

from __future__ import annotations

import re
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import IbPort, IncidentKind, NodeRetired
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import NicDegradedPolicy, NicFlappingPolicy
from zombie_detector.rules.base import Incidents, NodeId

DEGRADED = IncidentKind.NIC_DEGRADED
FLAPPING = IncidentKind.NIC_FLAPPING
ERRORS = ("symbol_error", "port_rcv_errors", "link_error_recovery", "local_link_integrity_errors", "excessive_buffer_overrun_errors")
"""The error counters summed for the flapping rate."""
KEPT = 12
"""Counts kept per port over the window (one every window/12): what came since the oldest is the
window's, without a count per sample for every port of a big fleet."""


def port_key(port: IbPort) -> str:
    """A port as a fingerprint part: mlx5_0 port 1 -> mlx5_0-p1."""
    return (re.sub(r"[^A-Za-z0-9_-]+", "-", port.device).strip("-_")[:56] or "nic") + f"-p{port.port}"


def is_up(port: IbPort) -> bool:
    return port.state in ("ACTIVE", "ACTIVE_DEFER") and port.phys_state == "LinkUp"


@dataclass
class _Port:
    seen_up: bool = False
    top_rate: float = 0.0
    """The highest rate it ran at while up."""
    bad_since: datetime | None = None
    counts: deque[tuple[datetime, int, int]] = field(default_factory=deque)
    """(when, link_downed, errors summed), a few over the window."""
    latest: tuple[int, int] | None = None
    """(link_downed, errors summed) in the last sample."""

    @property
    def moved(self) -> bool:
        """Whether its downs or errors rose within the window (what its next sample cannot tell)."""
        return bool(self.counts) and self.latest != self.counts[0][1:]


PortKey = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9_-]{1,72}$")]


class PortMemory(msgspec.Struct, frozen=True, omit_defaults=True):
    """A port that looks degraded, or whose downs or errors rose within the window, or that was
    never up: what its next sample cannot tell."""

    port: PortKey
    top_rate: Annotated[float, msgspec.Meta(ge=0)] = 0.0
    seen_up: bool = True
    bad_since: datetime | None = None
    counts: list[tuple[datetime, int, int]] = []


class NodePorts(msgspec.Struct, frozen=True, omit_defaults=True):
    """What the rule knew of one node's ports (its memory: `zombie_detector.memory`): the rate each
    steady port ran at (one that trains down while the detector changes hands is still judged
    against it) and the others in full."""

    node: NodeId
    rates: dict[PortKey, Annotated[float, msgspec.Meta(ge=0)]] = {}
    ports: list[PortMemory] = []


class NicRule:
    inputs = (Sample, NodeRetired)
    entry = NodePorts
    of_events = False

    def __init__(self, degraded: NicDegradedPolicy, flapping: NicFlappingPolicy) -> None:
        self.degraded = degraded
        self.flapping = flapping
        self.ports: dict[str, dict[str, _Port]] = {}
        """node -> port key -> what it knows of the port."""
        self._remembered: dict[str, NodePorts] = {}
        """Each node's memory as last given, until one of its ports changes (most never do)."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, NodeRetired):  # a worker the pool ended: forget its ports (the book closes its incidents)
            self.ports.pop(event.node_id, None)
            self._remembered.pop(event.node_id, None)
            return ()
        ports = event.host.ib_ports
        if not ports:
            return ()
        open_here = {(i.kind, i.key) for i in incidents.open_on(event.node_id) if i.kind in (DEGRADED, FLAPPING)}
        findings: list[Finding] = []
        known = self.ports.setdefault(event.node_id, {})
        changed = False
        for p in ports:
            key = port_key(p)
            state = known.get(key) or known.setdefault(key, _Port())
            if is_up(p) and (not state.seen_up or (p.rate_gbps or 0.0) > state.top_rate):
                state.seen_up, state.top_rate, changed = True, max(state.top_rate, p.rate_gbps or 0.0), True
            why = self._why_degraded(p, state)
            if why:
                if state.bad_since is None:
                    state.bad_since, changed = now, True
                if now - state.bad_since >= timedelta(seconds=self.degraded.for_s):
                    findings.append(self._finding(DEGRADED, event, p, key, why))
            else:
                if state.bad_since is not None:
                    state.bad_since, changed = None, True
                if (DEGRADED, key) in open_here:
                    findings.append(Finding(DEGRADED, event.node_id, key=key, present=False, summary=f"{_name(p)} is up at full rate again"))
            latest, first, kept = state.latest, state.counts[0] if state.counts else None, len(state.counts)
            flaps = self._why_flapping(p, state, now)
            if state.latest != latest or len(state.counts) != kept or (state.counts[0] if state.counts else None) is not first:
                changed = True
            if flaps:
                findings.append(self._finding(FLAPPING, event, p, key, flaps))
            elif (FLAPPING, key) in open_here and len(state.counts) >= 2:
                findings.append(Finding(FLAPPING, event.node_id, key=key, present=False, summary=f"{_name(p)} is steady again"))
        if changed:
            self._remembered.pop(event.node_id, None)
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[NodePorts]:
        return [self._remembered.get(node) or self._remember(node, known) for node, known in self.ports.items()]

    def _remember(self, node: str, known: dict[str, _Port]) -> NodePorts:
        rates, others = {}, []
        for key, p in known.items():
            moved = p.moved
            if p.seen_up and p.bad_since is None and not moved:
                rates[key] = p.top_rate
            elif p.seen_up or moved:  # a port never up and counting nothing: its next sample says as much
                others.append(PortMemory(key, p.top_rate, p.seen_up, p.bad_since, list(p.counts) if moved else []))
        entry = self._remembered[node] = NodePorts(node, rates, others)
        return entry

    def recall(self, entries: Sequence[NodePorts], now: datetime) -> None:
        for entry in entries:
            known = self.ports.setdefault(entry.node, {})
            for key, rate in entry.rates.items():
                known[key] = _Port(seen_up=True, top_rate=rate)
            for port in entry.ports:
                known[port.port] = _Port(
                    port.seen_up, port.top_rate, port.bad_since and min(port.bad_since, now),
                    deque((min(at, now), downs, errors) for at, downs, errors in port.counts[-KEPT - 1:]),
                )

    def _why_degraded(self, p: IbPort, state: _Port) -> str:
        if not state.seen_up:
            return ""  # never up since the sampler first saw it: not cabled, not in use
        if not is_up(p):
            return f"{_name(p)} is {p.state or 'in an unknown state'} ({p.phys_state or 'physical state unknown'}); it was up"
        if p.rate_gbps is not None and p.rate_gbps < state.top_rate:
            return f"{_name(p)} runs at {p.rate_gbps:g} Gb/s where it ran at {state.top_rate:g}"
        floor = self.degraded.min_rate_gbps
        if p.rate_gbps is not None and floor is not None and p.rate_gbps < floor:
            return f"{_name(p)} runs at {p.rate_gbps:g} Gb/s, below the policy's {floor:g}"
        return ""

    def _why_flapping(self, p: IbPort, state: _Port, now: datetime) -> str:
        if p.link_downed is None:
            return ""
        errors = sum(getattr(p, name) or 0 for name in ERRORS)
        state.latest = (p.link_downed, errors)
        if state.counts and (p.link_downed < state.counts[-1][1] or errors < state.counts[-1][2]):
            state.counts.clear()  # the counters went back: a reset or a reboot
        window = timedelta(seconds=self.flapping.window_s)
        if not state.counts or now - state.counts[-1][0] >= window / KEPT:
            state.counts.append((now, p.link_downed, errors))
        while len(state.counts) > 1 and now - state.counts[0][0] > window:
            state.counts.popleft()
        first_at, first_downs, first_errors = state.counts[0]
        downs, more_errors = p.link_downed - first_downs, errors - first_errors
        if downs >= self.flapping.link_downs:
            return f"{_name(p)} went down {downs} time(s) in {_span(now - first_at)} (link_downed {first_downs} -> {p.link_downed})"
        hours = max((now - first_at).total_seconds(), 60.0) / 3600
        if more_errors and more_errors / hours > self.flapping.errors_per_hour:
            return (f"{_name(p)} counted {more_errors} link errors in {_span(now - first_at)} ({more_errors / hours:.0f}/h, "
                    f"more than {self.flapping.errors_per_hour:g}/h)")
        return ""

    @staticmethod
    def _finding(kind: IncidentKind, event: Sample, p: IbPort, key: str, why: str) -> Finding:
        evidence = {"device": p.device, "port": p.port, "state": p.state, "phys_state": p.phys_state, "rate_gbps": p.rate_gbps,
                    "link_layer": p.link_layer, "link_downed": p.link_downed,
                    **{name: getattr(p, name) for name in ERRORS}}
        return Finding(
            kind=kind, node_id=event.node_id, key=key, summary=why, evidence=evidence, severity="warning",
            recommended_action=("check the cable and transceiver of this port and the switch port it meets (ibstat, "
                                "the switch's port counters); a multi-node job over it stalls in its collectives"),
        )


def _name(p: IbPort) -> str:
    return f"{p.device} port {p.port}"


def _span(delta: timedelta) -> str:
    seconds = int(delta.total_seconds())
    return f"{seconds // 60}m{seconds % 60:02d}s" if seconds >= 60 else f"{seconds}s"
