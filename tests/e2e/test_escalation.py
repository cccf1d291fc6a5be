"""An escalation reaches a person end to end: a simulated node reports an XID gpumedic does not
know, the real zombie-detector opens a `gpu_xid` incident that no action may touch and escalates it, the real
report-builder records it and pages a real webhook receiver on loopback once, and
`gpumedic incidents ID` says who was told."""

from __future__ import annotations

import asyncio

from gpumedic.incidents import incident_text
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import fleet_publishing, samplers_running
from tests.e2e.test_thin_path import detector


async def test_an_incident_no_action_can_fix_pages_the_on_call_webhook_once(nats_settings, store_url, apps, tmp_path, webhook):
    settings = ReportSettings(
        nats=nats_settings,
        store={"url": store_url},
        webhook_url=webhook.url,
        console_url="https://gpumedic.example.org",
        notify_wait_s=0.5,
    )
    async with fleet_publishing(tmp_path, 1, 2, nats_settings.url) as (fleet, publish):
        await apps.start(reports_app(settings))
        await apps.start(detector(nats_settings))
        node = fleet.node("sim-node-01")
        async with samplers_running(fleet, publish, 0.2):
            await asyncio.sleep(0.5)
            node.inject_xid(1, 555)
            node.inject_xid(1, 555)  # a storm on one GPU is one incident, paged once
            pages = await asyncio.to_thread(webhook.wait_for, 1, 15.0)
            await asyncio.sleep(1.5)  # time for a second page, which must not come
        await apps.stop_all()

    assert len(pages) == 1, [p.body["incident"]["kind"] for p in pages]
    incident = pages[0].body["incident"]
    assert (incident["kind"], incident["node_id"], incident["gpu_index"], incident["status"]) == ("gpu_xid", "sim-node-01", 1, "escalated")
    assert "XID 555" in incident["summary"] and incident["recommended_action"] and incident["why_a_person"]
    assert pages[0].body["link"] == f"https://gpumedic.example.org/incidents/{incident['id']}"

    _, text = await incident_text(store_url, incident["id"][:8])
    assert "notified webhook (escalated): delivered" in text and "delivered to 127.0.0.1" in text
