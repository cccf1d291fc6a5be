"""report-builder as deployed (`create_app`), its handlers on the in-memory bus
(tests/fixtures/memory.py) over a real SQLite store: an incident's events in through its pull
consumers, its record and timeline in the store as the CLI and console read them."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from gpumedic_bus import NatsSettings
from gpumedic_events import IncidentKind, IncidentOpened, IncidentResolved
from gpumedic_store import StoreSettings, create_engine, session_factory, upgrade, views
from report_builder.main import create_app
from report_builder.settings import Settings
from tests.fixtures.memory import MemoryBus


async def test_an_incident_opened_and_resolved_is_one_record_with_its_timeline_and_a_repeat_is_stored_once(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    app = create_app(Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), store=StoreSettings(url=url), history_retention_h=0))
    incident, at = uuid.uuid4(), datetime.now(UTC) - timedelta(minutes=3)
    opened = IncidentOpened(source="zombie-detector", occurred_at=at, incident_id=incident, node_id="gpu-node-07",
                            kind=IncidentKind.ZOMBIE_JOB, gpu_index=0, fingerprint="gpu-node-07/zombie_job/0",
                            summary="GPU 0 idle for 300s, held by pid 4242", severity="warning")
    resolved = IncidentResolved(source="zombie-detector", occurred_at=at + timedelta(minutes=2), incident_id=incident,
                                node_id="gpu-node-07", kind=IncidentKind.ZOMBIE_JOB, gpu_index=0, resolution="fixed",
                                summary="GPU 0 free after the kill")
    async with MemoryBus(app) as bus:
        await bus.publish(opened)
        await bus.publish(opened)  # a redelivery
        await bus.publish(resolved)
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            (row,) = await views.list_incidents(session)
            timeline = await views.incident_timeline(session, incident_id=str(incident))
    finally:
        await engine.dispose()
    assert (row.node_id, row.kind, row.status, row.gpu_index) == ("gpu-node-07", "zombie_job", "resolved", 0)
    assert [e.event_type for e in timeline] == ["IncidentOpened", "IncidentResolved"]
