"""The sampling loop: read everything once per interval, assemble one `NodeSampled`, publish it.

The loop keeps to a fixed grid on the monotonic clock (tick k at start + k*interval) so samples
do not drift later with every interval's own run time, and it skips ticks it missed instead of
bursting to catch up. NVML and /proc are read in a worker thread; the job probes run meanwhile
on the event loop. A failed publish is logged and the next tick comes anyway: a sampler that
stops on a NATS hiccup would look exactly like a dead node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any

from gpumedic_events import NodeSampled

from node_sampler.jobs import JobProbe
from node_sampler.logic import JobsReading, NvmlReading, assemble_sample, next_tick
from node_sampler.nvml import NvmlReader
from node_sampler.procs import ProcessInfo, ProcessTable

log = logging.getLogger(__name__)

Publish = Callable[[NodeSampled], Awaitable[None]]


class Sampler:
    """Samples one node. `nvml` is a pynvml-like module (or an `NvmlReader` over one)."""

    def __init__(
        self,
        node_id: str,
        nvml: Any,
        processes: ProcessTable,
        probes: Sequence[JobProbe] = (),
        interval_s: float = 5.0,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.node_id = node_id
        self.nvml = nvml if isinstance(nvml, NvmlReader) else NvmlReader(nvml)
        self.processes = processes
        self.probes = list(probes)
        self.interval_s = interval_s
        self._clock = clock
        self._sleep = sleep
        self.skipped_ticks = 0

    async def sample(self) -> NodeSampled:
        """One sample of the node now."""
        occurred_at = datetime.now(UTC)
        (reading, processes, notes), jobs = await asyncio.gather(
            asyncio.to_thread(self._read_host), self._observe_jobs()
        )
        return assemble_sample(
            node_id=self.node_id,
            interval_s=self.interval_s,
            occurred_at=occurred_at,
            nvml=reading,
            processes=processes,
            jobs=jobs,
            errors=notes,
        )

    async def run(self, publish: Publish) -> None:
        """Sample and publish every `interval_s` until cancelled."""
        start = self._clock()
        tick = 0
        while True:
            try:
                event = await self.sample()
            except Exception:
                # sample() guards every source; reaching here is a bug, but the node stays visible
                log.exception("%s: sample failed", self.node_id)
            else:
                try:
                    await publish(event)
                except Exception as exc:
                    log.warning("%s: sample not published (%r); next try in %.1fs", self.node_id, exc, self.interval_s)
            following = next_tick(start, self._clock(), self.interval_s, tick)
            if following > tick + 1:
                self.skipped_ticks += following - tick - 1
                log.warning("%s: sampling fell behind, skipped %d tick(s)", self.node_id, following - tick - 1)
            tick = following
            await self._sleep(max(0.0, start + tick * self.interval_s - self._clock()))

    def close(self) -> None:
        self.nvml.shutdown()

    def _read_host(self) -> tuple[NvmlReading, dict[int, ProcessInfo], list[str]]:
        """NVML, then /proc for the pids NVML named. Blocking: runs in a worker thread."""
        reading = self.nvml.read()
        notes: list[str] = []
        processes: dict[int, ProcessInfo] = {}
        for gpu in reading.gpus:
            for p in gpu.processes or ():
                if p.pid in processes:
                    continue
                info = self.processes.describe(p.pid, notes)
                if info is not None:
                    processes[p.pid] = info
        return reading, processes, notes

    async def _observe_jobs(self) -> list[JobsReading]:
        results = await asyncio.gather(*(p.observe() for p in self.probes), return_exceptions=True)
        readings = []
        for probe, result in zip(self.probes, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                readings.append(JobsReading(errors=(f"{type(probe).__name__}: {type(result).__name__}",)))
            else:
                readings.append(result)
        return readings
