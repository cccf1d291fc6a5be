"""Each node's samples on the detector's timeline: when they were taken, not when they came.

A busy node's sampler is late and its samples may wait in its NATS client, then come in a burst;
a detector that timed a GPU's idleness on arrival would count the burst's minute as idle time it
never saw, and one that took the node's word (`occurred_at`) as it stands would trust a clock that
is off by seconds, or a sender that chooses its own timestamps. `NodeClocks` does neither: it keeps,
per node, the least delay seen between a sample's taking and its arrival (transit plus the clocks'
offset: the best estimate of where the node's clock sits on the detector's), and places each sample
at its own time plus that delay. Only a change of that estimate changes a duration, so it falls at
once (a clock stepped forward) and rises by at most `RISE` of the node's time (clocks drift by parts
per million; a backlog is no new offset). A sample is never placed after its arrival, nor before
the node's previous one (a clock that stepped back starts afresh at the arrival): a node that lies
about its times can only make its own samples seem earlier than they came, never later than the
detector saw them.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpumedic_events import NodeRetired
from gpumedic_events.views import Sample

RISE = 0.001
"""How fast the least delay may grow, per second of the node's time: a thousand times any clock's drift."""


class _Clock:
    __slots__ = ("least", "taken", "placed")

    def __init__(self, delay: float, taken: datetime, placed: datetime) -> None:
        self.least = delay
        self.taken = taken
        self.placed = placed


class NodeClocks:
    def __init__(self) -> None:
        self._nodes: dict[str, _Clock] = {}

    def place(self, node_id: str, taken_at: datetime, arrived_at: datetime) -> datetime:
        """When this sample of the node was taken, on the detector's clock (`arrived_at`'s)."""
        delay = (arrived_at - taken_at).total_seconds()
        clock = self._nodes.get(node_id)
        if clock is None:
            self._nodes[node_id] = _Clock(delay, taken_at, arrived_at)
            return arrived_at
        clock.least = min(delay, clock.least + RISE * max(0.0, (taken_at - clock.taken).total_seconds()))
        placed = min(arrived_at, taken_at + timedelta(seconds=clock.least))
        if placed < clock.placed:  # its clock stepped back (NTP, a reboot): what was learnt of it no longer holds
            clock.least, placed = delay, arrived_at
        clock.taken, clock.placed = taken_at, placed
        return placed

    def forget(self, node_id: str) -> None:
        self._nodes.pop(node_id, None)

    def time_of(self, event: object, arrived_at: datetime) -> datetime:
        """The time the rules are given for an event: a sample's placed where its node took it (a
        retired node forgotten), any other's its arrival."""
        if isinstance(event, Sample):
            return self.place(event.node_id, event.occurred_at, arrived_at)
        if isinstance(event, NodeRetired):
            self.forget(event.node_id)
        return arrived_at


def by_arrival(rule: object, arrived_at: datetime, placed_at: datetime) -> datetime:
    """The time a rule is given for an event: its arrival for a rule that judges arrivals (a node's
    silence is nothing arriving), where the node's samples were taken for every other."""
    return arrived_at if getattr(rule, "judges_arrivals", False) else placed_at
