"""A burst cannot outrun the breaker: fifty nodes look idle at once (what a sampler or driver bug
looks like) and send over a thousand samples, the remediator runs in enforce mode with four
actions at a time, and kills reach at most the breaker's limit of nodes, never more; the breaker
trips once, and every later request is blocked."""

from __future__ import annotations

import asyncio

import nats
from sqlalchemy import select

from gpumedic.sim.fleet import SimFleet
from gpumedic_events import Event, IncidentOpened, NodeSampled
from gpumedic_store import BreakerTrip, create_engine, session_factory
from remediator.main import create_app as remediator_app
from tests.e2e.conftest import samplers_running
from tests.e2e.test_thin_path import detector_settings, remediator_settings
from zombie_detector.main import create_app as detector_app

NODES = 50
BREAKER = 5


async def test_fifty_idle_nodes_at_once_get_at_most_the_breakers_limit_of_kills(nats_settings, store_url, apps, tmp_path):
    fleet = SimFleet(NODES, 1, tmp_path / "fleet")
    await fleet.start()
    nc = await nats.connect(nats_settings.url)
    js = nc.jetstream()
    counts = {"samples": 0, "opened": 0}

    async def publish(event: Event) -> None:
        await js.publish(event.subject, event.to_json())
        counts["samples"] += isinstance(event, NodeSampled)

    async def on_opened(msg) -> None:
        counts["opened"] += 1

    try:
        await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet).model_copy(
            update={"breaker_max_nodes": BREAKER, "max_concurrent_actions": 4}
        )))
        await apps.start(detector_app(detector_settings(nats_settings)))
        await nc.subscribe(IncidentOpened.subject_filter(), cb=on_opened)
        for node in fleet.nodes.values():
            node.inject_zombie(0)
        async with samplers_running(fleet, publish, 0.1):
            for _ in range(600):
                if counts["opened"] >= NODES and counts["samples"] >= 1000:
                    break
                await asyncio.sleep(0.1)
            assert counts["opened"] >= NODES and counts["samples"] >= 1000, counts
            await asyncio.sleep(3.0)  # every request answered by now (the gate blocks in milliseconds)
    finally:
        await apps.stop_all()
        await nc.close()
        await fleet.stop()

    killed = [n.node_id for n in fleet.nodes.values() if any(c.startswith("kill ") for c in n.ssh_commands)]
    assert 1 <= len(killed) <= BREAKER, killed
    alive = [n for n in fleet.nodes.values() if n.node_id not in killed and any(p.is_job for p in n.live_processes(0))]
    assert len(alive) == NODES - len(killed)
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            trips = (await session.scalars(select(BreakerTrip))).all()
    finally:
        await engine.dispose()
    assert len(trips) == 1 and trips[0].reset_at is None
