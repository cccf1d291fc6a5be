"""The embedded stack on a JetStream cluster of three nats-servers (`gpumedic up --cluster 3`): every
stream and the incident-state bucket are replicated on all three, and with one server stopped for
the whole story (the services that were connected to it move to the others) the demo's zombie
still goes from detection to verified fix."""

from __future__ import annotations

import pytest

from gpumedic_sim.runs.demo import run_demo
from gpumedic_bus.streams import INCIDENT_STATE, STREAMS
from gpumedic_bus.topology import ADMIN


# Slow: a whole-stack run of half a minute; `make test-slow` runs it with the machine to itself.
@pytest.mark.slow
async def test_the_demo_runs_on_a_three_server_cluster_with_one_server_down(tmp_path):
    lines: list[str] = []
    seen: dict[str, object] = {}

    async def check_and_stop_one(stack) -> None:
        nc = await stack.connect(ADMIN)
        try:
            js = nc.jetstream()
            replicas = {}
            for name in (*(s.name for s in STREAMS), f"KV_{INCIDENT_STATE.bucket}"):
                info = await js.stream_info(name)
                replicas[name] = (info.config.num_replicas, len(info.cluster.replicas or []) + 1)
            seen["replicas"] = replicas
        finally:
            await nc.close()
        stopped = stack.servers[1]
        seen["stopped"] = stopped.url
        stopped.stop()  # stopped, not died: the supervisor leaves it down

    code = await run_demo(tmp_path / "var", nodes=2, gpus=1, duration_s=150, say=lines.append, cluster=3,
                          on_ready=check_and_stop_one)
    text = "\n".join(lines)
    assert code == 0, text
    assert "a cluster of 3 nats-servers, streams on 3" in text
    assert seen["replicas"] and all(r == (3, 3) for r in seen["replicas"].values()), seen["replicas"]
    assert "RESOLVED" in text and "(fixed)" in text
    assert not any("restarted it" in line for line in lines), text
