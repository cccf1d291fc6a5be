"""Detection survives the bus: nats-server restarts (same port, same data) under a running
detector, remediator and report-builder, and the next zombie is still detected, killed over SSH
and recorded, with nobody restarting a service. The streams on file storage come back with the
server; the samples stream, kept in memory, is made again by the bus's keeper (as the embedded
stack and compose's bus-keeper run it), and each client reconnects."""

from __future__ import annotations

import asyncio

from gpumedic.natsd import NatsServer
from gpumedic_bus import NatsSettings, connect, provision
from gpumedic_bus.provision import keep
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import Event, NodeSampled
from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import samplers_running
from tests.e2e.test_thin_path import detector, remediator_settings, wait_for_incident


async def test_a_zombie_after_a_nats_restart_is_still_detected_and_fixed(tmp_path, store_url, fleet, apps):
    server = NatsServer(tmp_path / "nats")
    server.start()
    settings = NatsSettings(url=server.url, ack_wait_s=2.0, max_deliver=3, graceful_timeout_s=2.0)
    admin = await connect(settings, "test-admin")
    await provision(admin.jetstream(), settings)
    await admin.close()
    admin = await connect(settings, "test-keeper")
    keeper = asyncio.create_task(keep(admin.jetstream(), settings, every_s=0.5))

    published = {"ok": 0, "failed": 0}
    sampler_nc = await connect(settings, "test-fleet")
    js = sampler_nc.jetstream()

    async def publish(event: Event) -> None:
        try:
            await js.publish(event.subject, event.to_json(), timeout=1)
        except BaseException:  # the publish failed, or the sampler gave up waiting on it (cancelled)
            published["failed"] += 1  # the bus is down: the node's next sample comes anyway
            raise
        if isinstance(event, NodeSampled):
            published["ok"] += 1

    try:
        await apps.start(reports_app(ReportSettings(nats=settings, store={"url": store_url}, trace_to_bus=True)))
        await apps.start(remediator_app(remediator_settings(settings, store_url, fleet)))
        await apps.start(detector(settings))
        async with samplers_running(fleet, publish):
            await asyncio.sleep(1.0)
            server.stop()
            await asyncio.sleep(1.5)  # samples fail meanwhile
            server.start()
            assert server.url == settings.url  # same port, same data directory
            before = published["ok"]
            for _ in range(100):  # samples flow again once the clients have reconnected
                if published["ok"] > before + 10:
                    break
                await asyncio.sleep(0.1)
            assert published["failed"] > 0 and published["ok"] > before + 10, published

            node = fleet.node("sim-node-02")
            hung = node.inject_zombie(0)
            incident, timeline, _ = await wait_for_incident(store_url, "resolved")
        assert (incident.node_id, incident.resolution) == ("sim-node-02", "fixed")
        assert node.ssh_commands.count(f"kill -s TERM {hung.pid}") == 1
        assert [e.event_type for e in timeline] == ["IncidentOpened", "ActionRequested", "ActionCompleted", "IncidentResolved"]
    finally:
        await stop_tasks([keeper])
        await admin.close()
        await apps.stop_all()
        await sampler_nc.close()
        server.stop()
