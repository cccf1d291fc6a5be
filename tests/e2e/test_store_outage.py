"""A store outage costs time, never data: with PostgreSQL stopped, report-builder takes no new
events and dead-letters none (they wait in JetStream); once it is back, every one lands once."""

from __future__ import annotations

import asyncio
import uuid

import nats

from gpumedic_bus.streams import DEAD_LETTERS
from gpumedic_events import IncidentOpened, MessageRejected
from gpumedic_events.base import json_examples
from gpumedic_store import create_engine, session_factory, upgrade, views
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings

EXAMPLE = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])


async def _stored(url: str) -> int:
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            return len(await views.list_incidents(session, limit=500))
    finally:
        await engine.dispose()


async def test_events_wait_out_a_stopped_store_and_all_land_once_it_is_back(nats_settings, postgres_of_its_own, apps):
    pg = postgres_of_its_own
    upgrade(pg.url)
    app = reports_app(ReportSettings(nats=nats_settings, store={"url": pg.url}))
    await apps.start(app)
    nc = await nats.connect(nats_settings.url)
    js = nc.jetstream()
    try:
        await asyncio.to_thread(pg.pause)
        events = [
            EXAMPLE.model_copy(update={"event_id": uuid.uuid4(), "incident_id": uuid.uuid4(), "node_id": f"gpu-node-{n:02d}",
                                       "fingerprint": f"gpu-node-{n:02d}/zombie_job/0"})
            for n in range(30)
        ]
        for event in events:
            await js.publish(event.subject, event.to_json())
        # Longer than the consumer's AckWait (2 s) times its deliveries (3) with back-off: what
        # used to end in dead letters about a minute into an outage with the shipped timings.
        await asyncio.sleep(12)
        assert app.runtime.metrics.waiting._value.get() >= 1
        await asyncio.to_thread(pg.resume)
        for _ in range(120):
            if await _stored(pg.url) == len(events):
                break
            await asyncio.sleep(0.25)
        assert await _stored(pg.url) == len(events)
        info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=MessageRejected.subject_for("report-builder"))
        assert not info.state.messages, "nothing is dead-lettered because the store was down"
        assert app.runtime.metrics.rejected() == 0 and app.runtime.metrics.waiting._value.get() == 0
    finally:
        await apps.stop_all()
        await nc.close()
