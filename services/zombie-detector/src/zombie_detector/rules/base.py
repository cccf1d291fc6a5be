"""The one small interface every node rule has: events in, findings out.

A rule reads some kinds of event (`inputs`) and says, per fingerprint, whether a fault is there
(`Finding`) or gone (`cleared`). It may look at the open incidents (`Incidents`), never change
them: what a finding does (open, update, retry, resolve, escalate, join a fleet incident) is the
shared lifecycle's business (`gpumedic_incidents`). A rule may keep memory of its own (how long a
GPU has been idle); it is not persisted, and after a restart a rule learns again. Rules are pure
in every other way: no bus, no clock (`now` comes in), no I/O, so tests drive them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Protocol

from gpumedic_events import Event
from gpumedic_incidents import Finding, IncidentState


class Incidents(Protocol):
    """What a rule may read of the open incidents."""

    def open_on(self, node_id: str) -> list[IncidentState]: ...

    def get(self, fingerprint: str) -> IncidentState | None: ...


class Rule(Protocol):
    inputs: tuple[type[Event], ...]
    """The events the rule reads."""

    def observe(self, event: Event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        """Findings from one event (one of `inputs`)."""
        ...

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        """Findings that time alone brings (a node gone quiet); most rules have none."""
        ...
