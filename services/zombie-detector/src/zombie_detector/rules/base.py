"""The one small interface every node rule has: events in, findings out.

A rule reads some kinds of event (`inputs`) and says, per fingerprint, whether a fault is there
(`Finding`) or gone (`cleared`). It may look at the open incidents (`Incidents`), never change
them: what a finding does (open, update, retry, resolve, escalate, join a fleet incident) is the
shared lifecycle's business (`gpumedic_incidents`). A rule may keep memory of its own (how long a
GPU has been idle); one whose memory spans minutes gives it to the detector to keep
(`zombie_detector.memory.Remembers`), so a takeover goes on from it; the others learn again after
a restart. Rules are pure in every other way: no bus, no clock (`now` comes in), no I/O, so tests
drive them directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Annotated, Protocol

import msgspec

from gpumedic_events import Event, GpuProcess, KillGpuProcesses, ProcessIdentity, ProcessTarget
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, IncidentState
from gpumedic_incidents.policy import KillPolicy


MAX_GAP_INTERVALS = 3
"""A GPU unseen for more than this many of its node's intervals was not watched: a count restarts."""


def late_s(sample: Sample) -> float:
    """How long after its tick was due the sample was taken (0 from a sampler that does not say)."""
    return max(0.0, (sample.occurred_at - sample.due_at).total_seconds()) if sample.due_at is not None else 0.0


def watched_across(last_seen: datetime, now: datetime, sample: Sample) -> bool:
    """Whether a count that last saw the node at `last_seen` goes on with this sample at `now` (its
    node's time): a gap the sample itself explains, the ticks its sampler says it missed and how late
    it was taken (a node whose job keeps every CPU busy), is a late node, not one unwatched."""
    explained = min(sample.missed_ticks * sample.interval_s + late_s(sample), MAX_LATE_INTERVALS * sample.interval_s)
    return (now - last_seen).total_seconds() <= MAX_GAP_INTERVALS * sample.interval_s + explained


BUSY_PRESSURE_PCT = 50.0
"""CPU pressure (PSI `some avg10`) at which a node's CPUs are pressed: its sampler will be late."""


def busy(sample: Sample) -> bool:
    """Whether the node said, in this sample, that its sampler runs late: it missed ticks, was taken
    more than half an interval late, or its CPUs (or the sampler's own cgroup's) are pressed."""
    late = late_s(sample) > sample.interval_s / 2
    pressed = any(p is not None and p.some_avg10_pct >= BUSY_PRESSURE_PCT for p in (sample.host.cpu_pressure, sample.sampler_cpu_pressure))
    return sample.missed_ticks > 0 or late or pressed


BUSY_GAP_INTERVALS = 12.0
"""How many intervals a node that says it runs late may go unseen before a rule that compares nodes
takes it for stopped (node_silent's own is its policy's `busy_after_intervals`, 12 by default)."""


def patience(sample: Sample) -> float:
    """How many of its intervals the node of this sample may go unseen before it stopped sampling."""
    return BUSY_GAP_INTERVALS if busy(sample) else MAX_GAP_INTERVALS


MAX_LATE_INTERVALS = 60
"""The longest gap a sample can explain by its lateness (five minutes at 5 s): past it, not watched."""


NodeId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")]
"""A node id as a rule's memory holds it (`zombie_detector.memory`): a subject token."""


class Streak(msgspec.Struct, frozen=True):
    """Since when one GPU has looked as a rule looks for, by the detector's clock (a rule's memory)."""

    node: NodeId
    gpu: Annotated[int, msgspec.Meta(ge=0, le=63)]
    since: datetime


class Incidents(Protocol):
    """What a rule may read of the open incidents, and of those closed lately."""

    def open_on(self, node_id: str) -> list[IncidentState]: ...

    def closed_on(self, node_id: str) -> list[tuple[IncidentState, datetime]]:
        """The node's incidents closed lately (`gpumedic_incidents.book.RECENTLY_CLOSED`), each as it was
        when it closed and with when, oldest first."""
        ...

    def acted_on(self, node_id: str) -> list[tuple[datetime, datetime]]:
        """The windows in which a work-ending action gpumedic asked for lately may have ended the
        node's processes (`gpumedic_incidents.book.RecentActions`), whatever its incident did since."""
        ...

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


def kill_operation(
    gpu_index: int, processes: Sequence[GpuProcess | ProcessIdentity], max_utilization_pct: int, kill: KillPolicy
) -> KillGpuProcesses | None:
    """SIGTERM the GPU's processes (each named by pid, start time and command line), SIGKILL after the
    policy's grace; None if there is none to name (pid 0 and 1 are never targets)."""
    targets = tuple(
        ProcessTarget(pid=p.pid, start_ticks=p.start_ticks, command=p.command) for p in processes if p.pid >= 2
    )[:64]
    if not targets:
        return None
    return KillGpuProcesses(
        gpu_index=gpu_index, targets=targets, signal="TERM", grace_s=kill.grace_s, max_gpu_utilization_pct=max_utilization_pct
    )
