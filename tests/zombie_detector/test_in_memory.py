"""zombie-detector as deployed (`create_app`), its handlers on the in-memory bus (tests/fixtures/memory.py):
samples in through its push consumer, a remediator's answer through its pull consumer, the
incident and the request out on their streams, the incident's state in its bucket."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from gpumedic_bus import NatsSettings
from gpumedic_bus.streams import INCIDENT_STATE, SAMPLES
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    GpuProcess,
    GpuSample,
    IncidentOpened,
    IncidentResolved,
    JobsObservation,
    MessageRejected,
    NodeSampled,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, Kinds, Step, ZombiePolicy
from tests.fixtures.memory import MemoryBus
from zombie_detector.main import create_app
from zombie_detector.settings import Settings

POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    kinds=Kinds(zombie_job=ZombiePolicy(idle_for_s=0.6, action_timeout_s=30.0,
                                        ladder=(Step(action="kill_gpu_processes", attempts=1, verify_within_s=5.0),))),
)
HOLDER = GpuProcess(pid=4242, start_ticks=777, command="python train.py", used_memory_mib=20000)


def sample(*, util: int, holder: bool = True) -> NodeSampled:
    gpu = GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=20000 if holder else 0, processes=(HOLDER,) if holder else ())
    return NodeSampled(source="node-sampler", node_id="gpu-node-07", interval_s=0.2, occurred_at=datetime.now(UTC), gpus=(gpu,),
                       jobs=JobsObservation(running=1 if holder else 0, output_growing=False))


async def until(check, timeout_s: float = 10.0):
    for _ in range(int(timeout_s / 0.05)):
        if found := check():
            return found
        await asyncio.sleep(0.05)
    raise AssertionError("not within the time")


async def test_a_zombie_in_the_samples_opens_one_incident_asks_one_kill_and_resolves_once_the_gpu_is_free():
    app = create_app(Settings(nats=NatsSettings(url="nats://127.0.0.1:1")), policy=POLICY)
    async with MemoryBus(app) as bus:
        for _ in range(8):  # 1.6 s of an idle GPU held by a job said to run
            await bus.publish(sample(util=0))
            await asyncio.sleep(0.2)
        [request] = await until(lambda: bus.of(ActionRequested))
        [opened] = bus.of(IncidentOpened)
        assert (opened.kind, opened.node_id, opened.gpu_index) == ("zombie_job", "gpu-node-07", 0)
        assert [t.pid for t in request.operation.targets] == [4242] and request.incident_id == opened.incident_id
        states = bus.js.buckets[INCIDENT_STATE.bucket].entries
        assert list(states) == ["gpu-node-07.zombie_job.0"]

        await bus.publish(ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id,
                                          node_id="gpu-node-07", attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="killed 4242"))
        for _ in range(3):
            await bus.publish(sample(util=0, holder=False))
            await asyncio.sleep(0.2)
        [resolved] = await until(lambda: bus.of(IncidentResolved))
        assert resolved.incident_id == opened.incident_id
        await until(lambda: not states)  # the closed incident leaves the bucket
        assert len(bus.of(IncidentOpened)) == len(bus.of(ActionRequested)) == 1


async def test_a_sample_that_does_not_validate_is_dead_lettered_with_its_reason_and_the_next_one_is_handled():
    app = create_app(Settings(nats=NatsSettings(url="nats://127.0.0.1:1")), policy=POLICY)
    async with MemoryBus(app) as bus:
        await bus.publish_raw("gpumedic.v1.node.sampled.gpu-node-07", b'{"node_id": 7}', stream=SAMPLES.name)
        await bus.publish(sample(util=90))
        [rejected] = bus.of(MessageRejected)
        assert rejected.service == "zombie-detector" and rejected.original_subject == "gpumedic.v1.node.sampled.gpu-node-07"
        assert "node_id: Input should be a valid string" in rejected.reason
        handled = {s.labels["outcome"]: s.value for s in app.runtime.metrics.handled.collect()[0].samples
                   if s.name.endswith("_total") and s.labels["event"] == "NodeSampled"}
        assert handled["invalid"] == 1 and handled["ok"] == 1
        assert bus.of(IncidentOpened) == []
