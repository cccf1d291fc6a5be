"""The fourth attack's weak spot in acknowledgements: `gpumedic incidents ack --reason` was stored as
typed and copied into the Alertmanager alert's annotation, a pasted password and escape codes
included. A person's words are masked like a job's now, in the event itself, so the store, the
console and Alertmanager all get the masked note, whoever published it. Real nats-server, real
report-builder, real store."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import nats

from gpumedic_events import IncidentMarked
from gpumedic_store import create_engine, session_factory, views
from gpumedic_store.models import Incident
from report_builder.alertmanager import alert_of
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.test_operator import _cli

NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


async def _incident(store_url: str) -> str:
    incident_id = str(uuid.uuid4())
    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        session.add(Incident(id=incident_id, node_id="gpu-node-07", kind="zombie_job", gpu_index=0, fingerprint="f", status="open",
                             summary="GPU 0 idle", opened_at=NOW, updated_at=NOW, evidence={}, detector="zombie-detector",
                             severity="warning", occurrences=1))
        await session.commit()
    await engine.dispose()
    return incident_id


async def _acknowledged(store_url: str, incident_id: str, by: str):
    engine = create_engine(store_url)
    try:
        for _ in range(100):
            async with session_factory(engine)() as session:
                incident = await session.get(Incident, incident_id)
                mark = (await views.acknowledgements(session, incident_ids=[incident_id])).get(incident_id)
            if mark is not None and mark.marked_by.startswith(by):
                return incident, mark
            await asyncio.sleep(0.1)
    finally:
        await engine.dispose()
    raise AssertionError(f"no acknowledgement by {by} stored within 10s")


async def test_a_password_in_an_acknowledgement_is_masked_in_the_store_and_the_alert(nats_settings, store_url, apps, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url})))
    incident_id = await _incident(store_url)

    code, out, err = await _cli(capsys, "incidents", "ack", incident_id[:8], "--by", "car\x1b]0;x\x07ol",
                                "--reason", "rotating creds: DB_PASSWORD=hunter2 \x1b[2J \u202eok", "--store", store_url)
    assert code == 0, err
    incident, mark = await _acknowledged(store_url, incident_id, "car")
    for stored in (mark.reason, mark.marked_by):
        assert "hunter2" not in stored and "\x1b" not in stored and "\x07" not in stored and "\u202e" not in stored
    assert mark.reason.startswith("rotating creds: DB_PASSWORD=***")
    annotations = alert_of(incident, NOW, console_url=None, every_s=30, acknowledged=mark)["annotations"]
    assert annotations["acknowledged_note"] == mark.reason and "\x1b" not in annotations["acknowledged_by"]

    # Published by hand, bypassing the CLI: masked all the same.
    nc = await nats.connect(nats_settings.url)
    try:
        body = ('{"event_id": "%s", "schema_version": 1, "occurred_at": "2026-12-07T09:05:00Z", "source": "gpumedic-cli", '
                '"incident_id": "%s", "verdict": "acknowledged", "reason": "token=abcdef123456 here", "marked_by": "dave"}'
                % (uuid.uuid4(), incident_id))
        await nc.jetstream().publish(IncidentMarked.subject_prefix, body.encode())
    finally:
        await nc.close()
    _, mark = await _acknowledged(store_url, incident_id, "dave")
    assert mark.reason == "token=*** here"
