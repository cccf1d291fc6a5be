"""A day (or any span) of one simulated node's history, made by the real node-sampler: the node's
jobs start and finish on a schedule, its host memory follows them, and each minute's sample is
folded as report-builder folds the live ones. For the console's tests and benchmarks, where
waiting a day for history is not an option.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpumedic_sim.machine.host import GIB_KIB
from gpumedic_sim.machine.node import SimNode
from gpumedic_store.history import Minute, MinuteFolder, minute_of
from node_sampler.sampler import Sampler

CYCLE_MIN = 240
"""Each GPU runs a job for two hours of every four, the GPUs staggered by 20 minutes."""


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def backfill(node: SimNode, *, end: datetime, minutes: int) -> list[Minute]:
    """`minutes` minutes of `node` up to `end`, one sample a minute, oldest first."""
    clock = _Clock()
    sampler = Sampler(node.node_id, node.nvml(), node.process_table(), [], 60.0, host=node.machine, holder_scan_interval_s=60.0,
                      top_interval_s=60.0, clock=clock)
    total_kib = node.machine.memory_total_kib
    first = minute_of(end) - timedelta(minutes=minutes - 1)
    out = []
    for i in range(minutes):
        for gpu in range(len(node.gpus)):
            phase = (i + 20 * gpu) % CYCLE_MIN
            running = bool(node.live_processes(gpu))
            if phase < CYCLE_MIN // 2 and not running:
                node.start_job(gpu)
            elif phase >= CYCLE_MIN // 2 and running:
                node.finish_job(gpu)
        busy = sum(1 for gpu in range(len(node.gpus)) if node.live_processes(gpu))
        node.machine.memory_available_kib = max(GIB_KIB, total_kib - (64 + 96 * busy + 7 * (i % 13)) * GIB_KIB)
        clock.now += 60.0
        at = first + timedelta(minutes=i)
        sample = (await sampler.sample()).model_copy(update={"occurred_at": at})
        folder = MinuteFolder(at)
        folder.add(sample)
        out.append(folder.minute_figures())
    return out
