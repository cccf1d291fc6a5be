"""Escalations reach a person: the notification outbox on both backends, delivered by the real
notifier over HTTP to a real receiver on loopback."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
import pytest

from gpumedic_events import Event, IncidentEscalated, IncidentOpened, IncidentResolved
from gpumedic_events.base import json_examples
from gpumedic_store import Notification
from gpumedic_store.views import notifications_of
from report_builder.notify import Channel, Notifier
from report_builder.repository import queue_notifications, record_event

INCIDENT = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"
TOKEN = "tok-9f8e7d6c5b4a"
API_KEY = "sk-live-0123456789abcdef"
T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)


class Clock:
    def __init__(self) -> None:
        self.now = T0 + timedelta(seconds=20)

    def __call__(self) -> datetime:
        return self.now


def _event(cls: type[Event], **overrides: Any) -> Any:
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **overrides})


async def _escalate(sessions, *, channels=("webhook", "slack"), **opened: Any) -> None:
    events = [
        _event(
            IncidentOpened,
            **{
                "kind": "gpu_xid",
                "severity": "critical",
                "summary": "XID 48 (double-bit ECC) on GPU 0 <!channel>",
                "evidence": {"xid": 48, "command": f"python train.py --api-key={API_KEY} --epochs 3", "PASSWORD": "hunter2"},
                "diagnosis": {"cause": "ecc_dbe", "confidence": 0.9, "explanation": "uncorrectable ECC error", "remedies": ["drain"]},
                "recommended_action": "drain the node and reset the GPU",
                "fingerprint": "gpu-node-07/gpu_xid/0",
                **opened,
            },
        ),
        _event(IncidentEscalated, kind="gpu_xid", reason="gpu_xid has no automatic fix: a person must drain the node"),
    ]
    async with sessions() as session:
        for e in events:
            await record_event(session, event=e, subject=e.subject, trace_id=None)
        await queue_notifications(session, incident_id=INCIDENT, reason=events[1].reason, channels=channels, now=T0, due_at=T0 + timedelta(seconds=10))
        await session.commit()


def _notifier(sessions, webhook, clock, **kw: Any) -> Notifier:
    channels = [Channel("webhook", "json", webhook.url, TOKEN), Channel("slack", "slack", webhook.url + "/slack")]
    return Notifier(sessions, channels, console_url="https://gpumedic.example.org", clock=clock, retry_initial_s=0.01, timeout_s=2, **kw)


async def _rows(sessions) -> dict[str, Notification]:
    async with sessions() as session:
        return {n.channel: n for n in await notifications_of(session, incident_id=INCIDENT)}


async def test_an_escalation_is_told_once_per_channel_with_its_cause_and_no_secret(sessions, webhook):
    await _escalate(sessions)
    clock = Clock()
    notifier = _notifier(sessions, webhook, clock)
    async with httpx.AsyncClient(timeout=2) as client:
        clock.now = T0 + timedelta(seconds=5)
        assert await notifier.deliver_due(client) == 0  # still within the wait
        clock.now = T0 + timedelta(seconds=11)
        assert await notifier.deliver_due(client) == 2
        assert await notifier.deliver_due(client) == 0

    by_path = {r.path.rsplit("/", 1)[-1]: r for r in webhook.received}
    assert len(webhook.received) == 2
    generic, slack = by_path["s3cr3t-path"], by_path["slack"]
    assert generic.headers["Authorization"] == f"Bearer {TOKEN}" and "Authorization" not in slack.headers
    incident = generic.body["incident"]
    assert incident["id"] == INCIDENT and incident["kind"] == "gpu_xid" and incident["severity"] == "critical"
    assert incident["cause"]["cause"] == "ecc_dbe" and incident["recommended_action"].startswith("drain")
    assert incident["why_a_person"].startswith("gpu_xid has no automatic fix")
    assert incident["evidence"]["xid"] == 48
    assert generic.body["link"] == f"https://gpumedic.example.org/incidents/{INCIDENT}"
    text = slack.body["text"]
    assert "[critical] gpu_xid on gpu-node-07 GPU 0" in text and "&lt;!channel&gt;" in text and "<!channel>" not in text
    for request in webhook.received:
        raw = json.dumps(request.body)
        assert API_KEY not in raw and "hunter2" not in raw and TOKEN not in raw and "s3cr3t-path" not in raw
    rows = await _rows(sessions)
    assert {r.status for r in rows.values()} == {"delivered"} and all(r.attempts == 1 for r in rows.values())

    # A redelivered escalation queues nothing new.
    async with sessions() as session:
        assert await queue_notifications(session, incident_id=INCIDENT, reason="again", channels=("webhook", "slack"), now=T0, due_at=T0) == 0
        await session.commit()


async def test_transient_failures_are_retried_in_the_round(sessions, webhook):
    await _escalate(sessions, channels=("webhook",))
    webhook.answers = [500, 503]
    clock = Clock()
    async with httpx.AsyncClient(timeout=2) as client:
        await _notifier(sessions, webhook, clock).deliver_due(client)
    assert webhook.tries == 3 and len(webhook.received) == 1
    assert (await _rows(sessions))["webhook"].status == "delivered"


async def test_a_receiver_that_keeps_failing_is_tried_later_then_given_up(sessions, webhook):
    await _escalate(sessions, channels=("webhook",))
    webhook.answers = [500] * 6
    clock = Clock()
    notifier = _notifier(sessions, webhook, clock, give_up_s=3600)
    async with httpx.AsyncClient(timeout=2) as client:
        await notifier.deliver_due(client)
        row = (await _rows(sessions))["webhook"]
        assert (row.status, row.attempts) == ("pending", 1)
        assert "127.0.0.1 answered HTTP 500" in row.detail and "s3cr3t" not in row.detail
        assert row.due_at == clock.now + timedelta(seconds=30)
        assert await notifier.deliver_due(client) == 0  # not due again yet

        clock.now = T0 + timedelta(hours=2)  # past give-up
        await notifier.deliver_due(client)
    row = (await _rows(sessions))["webhook"]
    assert (row.status, row.attempts) == ("failed", 2) and "gave up after 2 round(s)" in row.detail
    assert webhook.tries == 6 and webhook.received == []


async def test_a_client_error_fails_at_once_and_names_the_host_not_the_url(sessions, webhook, caplog):
    await _escalate(sessions, channels=("webhook",))
    webhook.answers = [404]
    async with httpx.AsyncClient(timeout=2) as client:
        await _notifier(sessions, webhook, Clock()).deliver_due(client)
    row = (await _rows(sessions))["webhook"]
    assert row.status == "failed" and row.detail == "127.0.0.1 answered HTTP 404" and webhook.tries == 1
    assert "failed: 127.0.0.1 answered HTTP 404" in caplog.text and "s3cr3t" not in caplog.text


async def test_an_unreachable_receiver_stays_pending(sessions, unused_tcp_port):
    await _escalate(sessions, channels=("webhook",))
    channel = Channel("webhook", "json", f"http://127.0.0.1:{unused_tcp_port}/hook")
    notifier = Notifier(sessions, [channel], clock=Clock(), retry_initial_s=0.01, timeout_s=1)
    async with httpx.AsyncClient(timeout=1) as client:
        await notifier.deliver_due(client)
    row = (await _rows(sessions))["webhook"]
    assert row.status == "pending" and "127.0.0.1 unreachable (ConnectError)" in row.detail


@pytest.mark.parametrize(
    ("opened", "why"),
    [
        ({"related_incident_id": "9b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e99"}, "part of fleet incident 9b9a1d52"),
        ({"severity": "info"}, "severity info is below the notification threshold"),
    ],
)
async def test_what_is_told_elsewhere_or_not_worth_a_page_is_skipped(sessions, webhook, opened, why):
    await _escalate(sessions, channels=("webhook",), **opened)
    async with httpx.AsyncClient(timeout=2) as client:
        await _notifier(sessions, webhook, Clock()).deliver_due(client)
    row = (await _rows(sessions))["webhook"]
    assert row.status == "skipped" and why in row.detail and webhook.tries == 0 and row.attempts == 0


async def test_two_report_builders_tell_each_escalation_once(sessions, webhook):
    await _escalate(sessions)
    webhook.hang_s = 0.2
    clock = Clock()
    async with httpx.AsyncClient(timeout=2) as client:
        await asyncio.gather(*(_notifier(sessions, webhook, clock).deliver_due(client) for _ in range(3)))
    assert len(webhook.received) == 2 and webhook.tries == 2


async def test_an_incident_that_cleared_before_the_page_was_due_is_not_paged(sessions, webhook):
    await _escalate(sessions, channels=("webhook",))
    resolved = _event(IncidentResolved, kind="gpu_xid", resolution="cleared", occurred_at="2026-11-23T10:00:05Z")
    async with sessions() as session:
        await record_event(session, event=resolved, subject=resolved.subject, trace_id=None)
        await session.commit()
    async with httpx.AsyncClient(timeout=2) as client:
        await _notifier(sessions, webhook, Clock()).deliver_due(client)
    row = (await _rows(sessions))["webhook"]
    assert row.status == "skipped" and row.detail == "the incident was resolved before anyone was told" and webhook.tries == 0


def _handlers(sessions, channels=("webhook", "slack")):
    from opentelemetry.sdk.trace import TracerProvider

    from report_builder.handlers import ReportHandlers

    return ReportHandlers(sessions, TracerProvider().get_tracer("test"), notify=channels)


async def _resolve(sessions, channels=("webhook", "slack"), at: str = "2026-11-23T10:05:00Z") -> None:
    from gpumedic_bus import Delivery

    resolved = _event(IncidentResolved, kind="gpu_xid", resolution="cleared", summary="the node was drained and its GPU reset",
                      occurred_at=at)
    await _handlers(sessions, channels).on_incident_or_action(resolved, Delivery(resolved.subject, {}, 1))


async def test_whoever_was_told_of_an_escalation_is_told_when_it_is_resolved(sessions, webhook):
    await _escalate(sessions)
    clock = Clock()
    notifier = _notifier(sessions, webhook, clock)
    async with httpx.AsyncClient(timeout=2) as client:
        clock.now = T0 + timedelta(seconds=11)
        assert await notifier.deliver_due(client) == 2
        await _resolve(sessions)
        clock.now = datetime.now(UTC) + timedelta(seconds=1)  # the end is due at once
        assert await notifier.deliver_due(client) == 2
        assert await notifier.deliver_due(client) == 0
    ends = {r.path.rsplit("/", 1)[-1]: r.body for r in webhook.received[2:]}
    generic, slack = ends["s3cr3t-path"], ends["slack"]
    assert generic["event"] == "incident.resolved" and generic["incident"]["status"] == "resolved"
    assert generic["incident"]["resolution"] == "cleared" and generic["incident"]["how_it_ended"] == "the node was drained and its GPU reset"
    assert generic["incident"]["why_a_person"] is None and generic["link"].endswith(INCIDENT)
    assert slack["text"].startswith("*[resolved] gpu_xid on gpu-node-07 GPU 0*: the node was drained")
    async with sessions() as session:
        rows = await notifications_of(session, incident_id=INCIDENT)
    assert sorted((n.channel, n.event, n.status) for n in rows) == [
        ("slack", "escalated", "delivered"), ("slack", "resolved", "delivered"),
        ("webhook", "escalated", "delivered"), ("webhook", "resolved", "delivered"),
    ]
    await _resolve(sessions)  # a redelivered resolution tells nobody again
    async with sessions() as session:
        assert len(await notifications_of(session, incident_id=INCIDENT)) == 4


async def test_an_end_whose_escalation_was_never_told_is_not_told_either(sessions, webhook):
    await _escalate(sessions, channels=("webhook",))
    await _resolve(sessions, channels=("webhook",), at="2026-11-23T10:00:05Z")  # within the escalation's wait
    clock = Clock()
    clock.now = datetime.now(UTC) + timedelta(seconds=1)
    notifier = _notifier(sessions, webhook, clock)
    async with httpx.AsyncClient(timeout=2) as client:
        await notifier.deliver_due(client)  # the escalation: skipped (resolved before anyone was told); the end waits for it
        clock.now += timedelta(seconds=10)
        await notifier.deliver_due(client)
    async with sessions() as session:
        rows = {n.event: n for n in await notifications_of(session, incident_id=INCIDENT)}
    assert rows["escalated"].status == "skipped" and rows["resolved"].status == "skipped"
    assert rows["resolved"].detail == "its escalation was not told here (skipped)" and webhook.tries == 0
