"""node-sampler as deployed (`create_app`) over the fake NVML library's stand-in (tests/node_sampler/fakes.py),
its samples out on the in-memory bus (tests/fixtures/memory.py): what a consumer of the samples
stream receives, with the processes on each GPU."""

from __future__ import annotations

import asyncio

from gpumedic_bus import NatsSettings
from gpumedic_events import NodeSampled
from node_sampler.main import create_app
from node_sampler.settings import Settings
from tests.fixtures.memory import MemoryBus
from tests.node_sampler.fakes import table_for_two_gpus, two_gpus


async def test_its_samples_go_out_on_the_samples_stream_one_per_interval_with_each_gpus_processes():
    settings = Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), node_id="gpu-node-07", interval_s=0.2)
    async with MemoryBus(create_app(settings, nvml=two_gpus(), processes=table_for_two_gpus()), loops=True) as bus:
        for _ in range(100):
            if len(bus.of(NodeSampled)) >= 3:
                break
            await asyncio.sleep(0.05)
    first, second, *_ = bus.of(NodeSampled)
    assert (first.node_id, first.interval_s, len(first.gpus)) == ("gpu-node-07", 0.2, 2)
    assert [p.pid for p in first.gpus[0].processes] == [41230]
    assert second.occurred_at > first.occurred_at and second.event_id != first.event_id
