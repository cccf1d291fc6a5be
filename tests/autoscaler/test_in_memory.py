"""autoscaler as deployed (`create_app`, no provider), its handlers on the in-memory bus
(tests/fixtures/memory.py): samples through its push consumer, drains as it follows them, its
round's decision out on the status stream."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from gpumedic_bus import NatsSettings
from gpumedic_events import CapacityEvaluated, GpuSample, NodeDrained, NodeSampled
from gpumedic_incidents import Policy
from autoscaler.main import create_app
from autoscaler.settings import Settings
from tests.fixtures.memory import MemoryBus


def busy(node: str, util: int = 95) -> NodeSampled:
    gpus = tuple(GpuSample(index=i, utilization_gpu_pct=util, memory_used_mib=20000) for i in range(2))
    return NodeSampled(source="node-sampler", node_id=node, interval_s=1, occurred_at=datetime.now(UTC), gpus=gpus)


async def next_round(bus: MemoryBus, after: int) -> CapacityEvaluated:
    for _ in range(100):
        if len(rounds := bus.of(CapacityEvaluated)) > after:
            return rounds[-1]
        await asyncio.sleep(0.05)
    raise AssertionError("no round")


async def test_busy_nodes_ask_for_more_and_a_drained_one_is_not_counted_as_capacity():
    app = create_app(Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), interval_s=0.2), policy=Policy())
    async with MemoryBus(app, loops=True) as bus:
        for node in ("gpu-node-01", "gpu-node-02", "gpu-node-03"):
            await bus.publish(busy(node))
        first = await next_round(bus, len(bus.of(CapacityEvaluated)))
        assert (first.nodes_seen, first.gpus_total, first.gpus_busy, first.decision) == (3, 6, 6, "scale_up"), first.reason

        await bus.publish(NodeDrained(source="remediator", node_id="gpu-node-03", reason="XID 79", incident_id=uuid.uuid4(), action_id=uuid.uuid4()))
        drained = await next_round(bus, len(bus.of(CapacityEvaluated)))
        assert (drained.nodes_drained, drained.gpus_total) == (1, 4), drained.reason
