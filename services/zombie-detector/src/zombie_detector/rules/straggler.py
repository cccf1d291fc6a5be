"""gpu_straggler: one GPU far slower than its siblings on the same work (DCGM 4.5's clock and power
tolerance against the mean of the system's GPUs).

Siblings are a node's busy GPUs running the same program: their first process's command line with
its numbers left out (`python -m selfplay --gpu 3` and `--gpu 5` are one program). Among at least
`min_siblings` of them, a GPU whose SM clock or power stays below `below_share` of their median
for `for_s` is a straggler, provided its clock is also below the fleet's median for its model (one
busy clock per node sample feeds that): a node whose GPUs all run slow is not one GPU's fault.
A GPU whose enforced power limit is below its siblings' was capped by its operator on purpose:
it runs slower by design and is no straggler; one slowed for heat or by a hardware slowdown is
gpu_thermal's or gpu_throttled's. A person looks (a failing VRM, a
clock stuck low, a GPU that needs service); the job it holds back runs at its pace meanwhile.
"""

from __future__ import annotations

import re
import statistics
from collections import deque
from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import ClockEventReason, GpuSample, IncidentKind, NodeRetired
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import StragglerPolicy
from zombie_detector.rules.base import Incidents

STRAGGLER = IncidentKind.GPU_STRAGGLER
FLEET_SAMPLES = 512
"""Recent busy SM clocks kept per GPU model, for the fleet's median."""
FLEET_MIN = 16
"""Below this many, the fleet's median is not yet known and the siblings alone decide."""
JUDGE_EVERY_S = 10.0
"""A node is judged at most this often: a straggler is slow for `for_s`, so a sample every 10 s
tells as much as every sample, at a fraction of the cost on the detector's hot path."""
_DIGITS = re.compile(r"\d+")
EXPLAINED = int(
    ClockEventReason.HW_SLOWDOWN
    | ClockEventReason.HW_THERMAL_SLOWDOWN
    | ClockEventReason.SW_THERMAL_SLOWDOWN
    | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN
)
"""Slowdowns another rule names (gpu_thermal, gpu_throttled)."""


class StragglerRule:
    inputs = (Sample, NodeRetired)

    def __init__(self, policy: StragglerPolicy) -> None:
        self.policy = policy
        self.fleet: dict[str, deque[int]] = {}
        self.since: dict[tuple[str, int], datetime] = {}
        self.open: set[tuple[str, int]] = set()
        self.judged: dict[str, datetime] = {}
        """When each node was last judged."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, NodeRetired):
            self._forget(event.node_id)
            return ()
        last = self.judged.get(event.node_id)
        if last is not None and (now - last).total_seconds() < JUDGE_EVERY_S:
            return ()
        self.judged[event.node_id] = now
        floor = self.policy.busy_from_pct
        busy = [g for g in event.gpus if g.processes and g.sm_clock_mhz and (g.utilization_gpu_pct or 0) >= floor and not g.lost]
        if busy:
            first = busy[0]
            fleet = self.fleet.get(first.name)
            if fleet is None:
                fleet = self.fleet[first.name] = deque(maxlen=FLEET_SAMPLES)
            fleet.append(first.sm_clock_mhz or 0)
        share = self.policy.below_share
        if len(busy) < self.policy.min_siblings or _even(busy, share):
            return self._all_clear(event.node_id, event.gpus) if self.since else ()  # the common case: none far below the fastest
        findings: list[Finding] = []
        slow: set[int] = set()
        for siblings in _programs(busy).values():
            if len(siblings) < self.policy.min_siblings:
                continue
            clock = statistics.median(g.sm_clock_mhz or 0 for g in siblings)
            powers = [g.power_w for g in siblings if g.power_w is not None]
            power = statistics.median(powers) if powers else None
            limits = [g.power_limit_w for g in siblings if g.power_limit_w is not None]
            limit = statistics.median(limits) if limits else None
            for gpu in siblings:
                if limit is not None and gpu.power_limit_w is not None and gpu.power_limit_w < limit:
                    continue  # capped on purpose
                if (gpu.clock_event_reasons or 0) & EXPLAINED:
                    continue  # heat or a hardware slowdown: another rule's
                clock_low = (gpu.sm_clock_mhz or 0) < share * clock
                power_low = power is not None and gpu.power_w is not None and gpu.power_w < share * power
                if (clock_low or power_low) and self._below_fleet(gpu):
                    slow.add(gpu.index)
                    key = (event.node_id, gpu.index)
                    started = self.since.setdefault(key, now)
                    if (now - started).total_seconds() >= self.policy.for_s:
                        self.open.add(key)
                        findings.append(self._finding(event.node_id, gpu, clock, power, len(siblings)))
        # every other GPU, the busy ones that keep pace and those no longer busy or compared alike:
        # a timer left behind would open at once the next time the GPU is slow
        for gpu in event.gpus:
            if gpu.index not in slow:
                findings.extend(self._clear(event.node_id, gpu.index))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def _below_fleet(self, gpu: GpuSample) -> bool:
        clocks = self.fleet.get(gpu.name)
        if clocks is None or len(clocks) < FLEET_MIN:
            return True
        return (gpu.sm_clock_mhz or 0) < statistics.median(clocks)

    def _finding(self, node_id: str, gpu: GpuSample, clock: float, power: float | None, siblings: int) -> Finding:
        fleet = self.fleet.get(gpu.name)
        fleet_median = statistics.median(fleet) if fleet and len(fleet) >= FLEET_MIN else None
        watts = f", {gpu.power_w:.0f} W against {power:.0f} W" if power is not None and gpu.power_w is not None else ""
        return Finding(
            kind=STRAGGLER,
            node_id=node_id,
            gpu_index=gpu.index,
            summary=f"GPU {gpu.index} runs its SM clock at {gpu.sm_clock_mhz} MHz against its {siblings - 1} siblings' "
            f"median {clock:.0f} MHz{watts}, on the same program",
            evidence={
                "sm_clock_mhz": gpu.sm_clock_mhz,
                "siblings_median_sm_clock_mhz": round(clock),
                "power_w": gpu.power_w,
                "siblings_median_power_w": round(power, 1) if power is not None else None,
                "fleet_median_sm_clock_mhz": round(fleet_median) if fleet_median is not None else None,
                "model": gpu.name or None,
                "clock_event_reasons": gpu.clock_event_reasons,
                "utilization_gpu_pct": gpu.utilization_gpu_pct,
            },
            recommended_action="the whole job runs at this GPU's pace: check its power delivery and clocks "
            "(nvidia-smi -q -d PERFORMANCE,CLOCK), run dcgmi diag -r 2 on it, and have it serviced if it stays slow",
        )

    def _all_clear(self, node_id: str, gpus: Sequence[GpuSample]) -> list[Finding]:
        findings = []
        for gpu in gpus:
            findings.extend(self._clear(node_id, gpu.index))
        return findings

    def _clear(self, node_id: str, index: int) -> list[Finding]:
        key = (node_id, index)
        self.since.pop(key, None)
        if key not in self.open:
            return []
        self.open.discard(key)
        return [Finding(kind=STRAGGLER, node_id=node_id, gpu_index=index, present=False, summary=f"GPU {index} keeps pace again")]

    def _forget(self, node_id: str) -> None:
        self.judged.pop(node_id, None)
        for key in [k for k in self.since if k[0] == node_id]:
            del self.since[key]
        self.open = {k for k in self.open if k[0] != node_id}


def _even(busy: list[GpuSample], share: float) -> bool:
    """No GPU's clock or power is below `share` of the fastest's: nothing to compare further."""
    low_clock = high_clock = busy[0].sm_clock_mhz or 0
    low_power = high_power = busy[0].power_w
    for gpu in busy:
        clock, power = gpu.sm_clock_mhz or 0, gpu.power_w
        if clock < low_clock:
            low_clock = clock
        elif clock > high_clock:
            high_clock = clock
        if power is not None and low_power is not None:
            if power < low_power:
                low_power = power
            elif power > high_power:
                high_power = power
    return low_clock >= share * high_clock and (low_power is None or low_power >= share * high_power)


def _programs(busy: list[GpuSample]) -> dict[str, list[GpuSample]]:
    """The busy GPUs by program: the first process's command line without its numbers."""
    groups: dict[str, list[GpuSample]] = {}
    for gpu in busy:
        groups.setdefault(_DIGITS.sub("#", gpu.processes[0].command), []).append(gpu)
    return groups
