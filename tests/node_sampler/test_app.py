"""The service as composed by `create_app`, publishing through a real nats-server."""

from __future__ import annotations

import asyncio

from gpumedic_events import NodeSampled

from node_sampler.main import build_probes, create_app
from node_sampler.settings import Settings
from tests.node_sampler.fakes import table_for_two_gpus, two_gpus


async def test_samples_land_in_the_samples_stream(nats_settings, js):
    nvml = two_gpus()
    settings = Settings(nats=nats_settings, node_id="gpu-node-07", interval_s=0.2)
    app = create_app(settings, nvml=nvml, processes=table_for_two_gpus())
    sub = await js.pull_subscribe(NodeSampled.subject_for("gpu-node-07"), stream="GPUMEDIC_SAMPLES")

    await app.start()
    try:
        messages = []
        async with asyncio.timeout(10):
            while len(messages) < 2:
                messages += await sub.fetch(2 - len(messages), timeout=5)
    finally:
        await app.stop()

    assert messages[0].subject == "gpumedic.v1.node.sampled.gpu-node-07"
    events = [NodeSampled.from_json(m.data, subject=m.subject) for m in messages]
    assert events[0].source == "node-sampler" and events[0].interval_s == 0.2
    assert [p.pid for p in events[0].gpus[0].processes] == [41230]
    assert events[0].gpus[0].processes[0].start_ticks == 8812345
    assert messages[0].headers["Nats-Msg-Id"] == str(events[0].event_id)
    assert events[1].occurred_at > events[0].occurred_at
    # the app gave the NVML sessions (sampling, XID watching) back when it stopped
    assert nvml.init_calls >= 2 and nvml.shutdown_calls == nvml.init_calls


def test_probes_follow_the_settings(tmp_path):
    settings = Settings(
        node_id="n1", status_url="http://127.0.0.1:1/status", job_process_pattern="selfplay", watch_paths=[tmp_path]
    )
    kinds = [type(p).__name__ for p in build_probes(settings, table_for_two_gpus())]
    assert kinds == ["StatusEndpointProbe", "ProcessPatternProbe", "OutputGrowthProbe"]
    assert build_probes(Settings(node_id="n1"), table_for_two_gpus()) == []
