"""A fleet busy the way a training node is: its job's data loaders keep every CPU at 100 %.

On such a node the sampler waits for a CPU: it wakes late, now and then so late that ticks pass
(it skips them and says so), and what it sends waits in its NATS client and goes out in bursts;
the kernel reports the CPU pressure (PSI) of the node and of the sampler's own cgroup. `Busy`
makes each simulated node so, with the real sampler code running on top: its `sleep` oversleeps,
its `own_pressure` and host readings carry the pressure, and its link to the bus holds samples and
immediate events and lets them go together. Seeded per node: the same run is busy the same way.
"""

from __future__ import annotations

import asyncio
import random
import zlib
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, replace

from gpumedic_events import CpuPressure, Event
from node_sampler.readings import HostReading

Publish = Callable[[Event], Awaitable[None]]


@dataclass(frozen=True)
class Busy:
    late_share: float = 0.3
    """The share of a sampler's wake-ups that come late."""
    late_max_intervals: float = 2.5
    """How late, at most, in intervals: past one, ticks pass and are skipped."""
    held_share: float = 0.15
    """The share of what a node sends that waits in its client, with all that follows it, until a burst."""
    held_max_intervals: float = 3.0
    """How long a burst waits, at most, in intervals."""
    pressure_pct: tuple[float, float] = (60.0, 98.0)
    """The node's CPU pressure (PSI some avg10), drawn in this range at each reading."""
    seed: int = 0

    def of(self, node_id: str, interval_s: float) -> BusyNode:
        return BusyNode(self, interval_s, random.Random(zlib.crc32(node_id.encode()) ^ self.seed))


class BusyNode:
    """One busy node: what its sampler is given instead of a quiet machine's."""

    def __init__(self, busy: Busy, interval_s: float, rng: random.Random) -> None:
        self.busy = busy
        self.interval_s = interval_s
        self.rng = rng
        self._held: list[Event] = []
        self._flushing: asyncio.Task | None = None
        self.late_wakeups = 0
        self.bursts = 0

    async def sleep(self, seconds: float) -> None:
        """The sampler's sleep until its next tick: the scheduler gives it a CPU late, sometimes."""
        extra = 0.0
        if self.rng.random() < self.busy.late_share:
            extra = self.rng.uniform(0.1, self.busy.late_max_intervals) * self.interval_s
            self.late_wakeups += 1
        await asyncio.sleep(seconds + extra)

    def pressure(self) -> CpuPressure:
        low, high = self.busy.pressure_pct
        return CpuPressure(some_avg10_pct=round(self.rng.uniform(low, high), 2), full_avg10_pct=round(self.rng.uniform(0.0, 20.0), 2))

    def host(self, machine) -> PressedHost:
        return PressedHost(machine, self.pressure)

    def link(self, publish: Publish) -> Publish:
        """What the node sends, through a client that holds some of it and lets it go in a burst, in order."""

        async def send(event: Event) -> None:
            if self._held or self.rng.random() < self.busy.held_share:
                self._held.append(event)
                if self._flushing is None or self._flushing.done():
                    wait = self.rng.uniform(0.5, self.busy.held_max_intervals) * self.interval_s
                    self._flushing = asyncio.create_task(self._flush(publish, wait))
                return
            await publish(event)

        return send

    async def _flush(self, publish: Publish, wait_s: float) -> None:
        await asyncio.sleep(wait_s)
        self.bursts += 1
        while self._held:
            event = self._held.pop(0)
            try:
                await publish(event)
            except Exception:  # the bus away: the rest go with the next burst
                self._held.insert(0, event)
                return


class PressedHost:
    """A node's host readings with its CPU pressure in them."""

    def __init__(self, machine, pressure: Callable[[], CpuPressure]) -> None:
        self.machine = machine
        self._pressure = pressure

    def read(self) -> HostReading:
        return replace(self.machine.read(), cpu_pressure=self._pressure())

    def __getattr__(self, name: str):  # everything else the sampler asks of the machine
        return getattr(self.machine, name)
