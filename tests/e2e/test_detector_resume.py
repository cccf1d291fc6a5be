"""A detector that stopped between saving an incident and announcing it: when it resumes, the
incident is announced once (the saved IncidentOpened, with its own event id), on a real
nats-server, and the saved state no longer waits to be announced."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

from gpumedic_bus.streams import INCIDENT_STATE
from gpumedic_events import IncidentOpened
from gpumedic_events.base import json_examples
from gpumedic_incidents.store import IncidentStates
from gpumedic_incidents.state import IncidentState
from tests.e2e.test_thin_path import detector


async def test_a_saved_but_unannounced_incident_is_announced_once_on_resume(nats_settings, js, apps):
    example = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])
    opened = example.model_copy(update={"event_id": uuid.uuid4(), "incident_id": uuid.uuid4()})
    now = datetime.now(UTC)
    states = IncidentStates(await js.key_value(INCIDENT_STATE.bucket))
    saved = IncidentState(
        incident_id=opened.incident_id, kind=opened.kind, detector="zombie-detector", node_id=opened.node_id,
        gpu_index=opened.gpu_index, opened_at=now, last_seen_at=now, phase="acting",
        announcement=opened.to_json().decode(),
    )
    await states.save(saved)
    announced = []

    async def on_opened(msg) -> None:
        announced.append(IncidentOpened.from_json(msg.data, subject=msg.subject))

    sub = await js.subscribe(IncidentOpened.subject_filter(), cb=on_opened, ordered_consumer=True)
    await apps.start(detector(nats_settings))
    for _ in range(40):
        if announced:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a second announcement would arrive by now
    await sub.unsubscribe()

    assert [(e.event_id, e.incident_id) for e in announced] == [(opened.event_id, opened.incident_id)]
    resumed = await states.get(saved.fingerprint)
    assert resumed is not None and resumed.incident_id == saved.incident_id and resumed.announcement is None
