"""container_died on a node as a whole: its containers die far more often than the rest of the
fleet's (`kinds.container_died.node_rate`). Where no task database says how work ends, the
containers are the tries: a host that kills every job it gets (a bad driver, a flaky machine)
shows here while each death alone reads like the job's own.

Each container, by name, that ended on a node within `window_s` is one try, and one that died
abnormally is a failure, however often it restarted: a job's own crash loop is one container,
so only many containers dying make a node stand out. Exits the engine was asked for (a stop, a
kill) and those of gpumedic's own kills are neither. A node stands out by the black hole's
judgement (`gpumedic_incidents.rates`) against every other node's containers together, its alpha
shared among the nodes judged. The incident is a person's (the container_died ladder): a node is
never drained for what could still be its jobs' doing.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import ContainerExited, Diagnosis, IncidentKind
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import ContainerPolicy
from gpumedic_incidents.rates import stands_out
from zombie_detector.rules.base import Incidents, NodeId
from zombie_detector.rules.container import Stopping, ended_normally, part_of_an_action

KEY = "node_rate"
JUDGE_EVERY = timedelta(seconds=10)
REMEDIES = (
    "look at the host: many different containers die here and seldom elsewhere (the driver, the kernel's log, the disks)",
    "drain it (gpumedic drain) while you look, if the deaths go on",
)


class Exit(msgspec.Struct, frozen=True):
    """One container's end counted on a node (the rule's memory: `zombie_detector.memory`)."""

    node: NodeId
    at: datetime
    name: Annotated[str, msgspec.Meta(max_length=256)]
    died: bool


class ContainerRateRule:
    inputs = (ContainerExited,)
    entry = Exit
    of_events = True  # the window's exits: the node-events stream keeps them

    def __init__(self, policy: ContainerPolicy, stopping: Stopping | None = None) -> None:
        self.policy = policy.node_rate
        self.stopping = stopping
        self.ended: dict[str, deque[tuple[datetime, str, bool]]] = {}
        """Per node: (when, container name, died) of each exit counted."""
        self.judged_at: datetime | None = None

    def observe(self, event: ContainerExited, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if self.policy is None or (event.engine_signal and not ended_normally(event)) or part_of_an_action(event, incidents, self.stopping):
            return ()  # asked for, or gpumedic's own doing: no try of the node's
        name = event.name or event.container_id[:12]
        self.ended.setdefault(event.node_id, deque()).append((now, name, not ended_normally(event)))
        return ()

    def remember(self) -> list[Exit]:
        return [Exit(node, at, name, died) for node, ended in self.ended.items() for at, name, died in ended]

    def recall(self, entries: Sequence[Exit], now: datetime) -> None:
        for entry in sorted(entries, key=lambda e: e.at):
            self.ended.setdefault(entry.node, deque()).append((min(entry.at, now), entry.name, entry.died))  # the window's end drops the old

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        policy = self.policy
        if policy is None or (self.judged_at is not None and now - self.judged_at < JUDGE_EVERY):
            return ()
        self.judged_at = now
        since = now - timedelta(seconds=policy.window_s)
        counts: dict[str, tuple[int, int]] = {}
        for node_id, ended in list(self.ended.items()):
            while ended and ended[0][0] < since:
                ended.popleft()
            if not ended:
                del self.ended[node_id]
                continue
            names = {name for _, name, _ in ended}
            died = {name for _, name, dead in ended if dead}
            counts[node_id] = (len(names), len(died))
        tested = [n for n, (tries, _) in counts.items() if tries >= policy.min_containers]
        if len(counts) < 2 or not tested:
            return ()
        all_tries, all_died = sum(t for t, _ in counts.values()), sum(d for _, d in counts.values())
        found = []
        for node_id in sorted(tested):
            tries, died = counts[node_id]
            out = stands_out(died, tries, all_died - died, all_tries - tries, min_failed=policy.min_died,
                             min_ratio=policy.min_ratio, alpha=policy.alpha / len(tested))
            if out is None:
                continue
            why = (f"{died} of the {tries} containers that ran on {node_id} in the last {policy.window_s / 60:g} min died "
                   f"({out.rate:.0%}) against {out.rest:.1%} on the rest of the fleet: that many by chance has probability {out.chance:.1e}")
            found.append(Finding(
                kind=IncidentKind.CONTAINER_DIED, node_id=node_id, key=KEY, summary=why,
                evidence={"containers": tries, "containers_died": died, "death_rate": round(out.rate, 4),
                          "rest_of_fleet_rate": round(out.rest, 4), "rest_of_fleet_containers": all_tries - tries,
                          "chance": float(f"{out.chance:.3g}"), "nodes_judged": len(tested)},
                diagnosis=Diagnosis(cause="node_kills_containers", confidence=0.7, explanation=why[:1000], remedies=REMEDIES),
                recommended_action=REMEDIES[0],
            ))
        return found
