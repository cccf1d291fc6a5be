"""report-builder's repository on both backends: the incident lifecycle, idempotency, order, spans."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from gpumedic_events import ActionCompleted, ActionRequested, Event, IncidentEscalated, IncidentOpened, IncidentResolved, SpanRecord
from gpumedic_events.base import json_examples
from gpumedic_store.views import IncidentFilter, find_incident, incident_timeline, list_incidents, trace_spans
from report_builder.repository import record_event, record_spans

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
INCIDENT = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"


def _event(cls: type[Event], **overrides: Any) -> Any:
    """An event of `cls` from its documented example, with a fresh event id."""
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **overrides})


async def _record(sessions, *events: Event, trace_id: str | None = TRACE) -> list[bool]:
    async with sessions() as session:
        kept = [await record_event(session, event=e, subject=e.subject, trace_id=trace_id) for e in events]
        await session.commit()
    return kept


async def test_lifecycle_builds_the_incident_and_its_timeline(sessions):
    opened = _event(IncidentOpened)
    requested = _event(ActionRequested, occurred_at="2026-11-22T10:15:05.500Z")
    completed = _event(ActionCompleted)
    resolved = _event(IncidentResolved)
    assert await _record(sessions, opened, requested, completed, resolved) == [True] * 4

    async with sessions() as session:
        incident = await find_incident(session, id_prefix=INCIDENT)
        timeline = await incident_timeline(session, incident_id=INCIDENT)

    assert incident.status == "resolved"
    assert incident.resolution == "fixed"
    assert incident.node_id == "gpu-node-07" and incident.kind == "zombie_job" and incident.gpu_index == 0
    assert incident.fingerprint == "gpu-node-07/zombie_job/0"
    assert incident.summary == opened.summary
    assert incident.evidence == {"idle_seconds": 600.0, "jobs_running": 1, "holder_pids": "41230"}
    assert incident.trace_id == TRACE
    assert incident.opened_at == opened.occurred_at
    assert incident.closed_at == resolved.occurred_at
    assert incident.updated_at == resolved.occurred_at
    for stamp in (incident.opened_at, incident.closed_at, incident.updated_at):
        assert stamp.tzinfo is UTC

    assert [e.event_type for e in timeline] == ["IncidentOpened", "ActionRequested", "ActionCompleted", "IncidentResolved"]
    assert [e.summary for e in timeline] == [
        "opened: GPU 0 below 5% for 600s while the node reports 1 job and no output grows",
        "action requested: kill_gpu_processes: kill pid 41230 on GPU 0 (SIGTERM, SIGKILL after 10s) (attempt 1)",
        "action succeeded: sent KILL to 41230",
        "resolved (fixed): GPU 0 holds no process after the kill; verified by the next sample",
    ]
    assert [e.event_id for e in timeline] == [str(e.event_id) for e in (opened, requested, completed, resolved)]
    assert timeline[0].subject == "gpumedic.v1.incident.opened.gpu-node-07"
    assert timeline[1].source == "zombie-detector" and timeline[2].source == "remediator"
    assert timeline[1].payload["operation"]["targets"][0]["pid"] == 41230
    assert all(e.trace_id == TRACE and e.occurred_at.tzinfo is UTC for e in timeline)
    assert timeline[1].occurred_at == datetime(2026, 11, 22, 10, 15, 5, 500000, tzinfo=UTC)


async def test_an_event_recorded_twice_is_kept_once(sessions):
    opened = _event(IncidentOpened)
    assert await _record(sessions, opened, opened) == [True, False]
    assert await _record(sessions, opened) == [False]
    async with sessions() as session:
        assert len(await incident_timeline(session, incident_id=INCIDENT)) == 1
        assert len(await list_incidents(session)) == 1


async def test_timeline_is_ordered_by_occurrence_not_arrival(sessions):
    resolved = _event(IncidentResolved)
    completed = _event(ActionCompleted)
    opened = _event(IncidentOpened)
    requested = _event(ActionRequested, occurred_at="2026-11-22T10:15:05.500Z")
    await _record(sessions, resolved, completed, opened, requested)
    async with sessions() as session:
        timeline = await incident_timeline(session, incident_id=INCIDENT)
    assert [e.event_type for e in timeline] == ["IncidentOpened", "ActionRequested", "ActionCompleted", "IncidentResolved"]


async def test_resolved_before_opened_creates_the_incident_and_opened_does_not_reopen_it(sessions):
    resolved = _event(IncidentResolved, resolution="cleared")
    await _record(sessions, resolved, trace_id=None)
    async with sessions() as session:
        incident = await find_incident(session, id_prefix=INCIDENT[:8])
    assert incident.status == "resolved" and incident.resolution == "cleared"
    assert incident.fingerprint == "gpu-node-07/zombie_job/0"
    assert incident.closed_at == resolved.occurred_at and incident.trace_id is None

    opened = _event(IncidentOpened)
    await _record(sessions, opened)
    async with sessions() as session:
        incident = await find_incident(session, id_prefix=INCIDENT[:8])
        timeline = await incident_timeline(session, incident_id=INCIDENT)
    assert incident.status == "resolved"
    assert incident.closed_at == resolved.occurred_at
    assert incident.opened_at == opened.occurred_at
    assert incident.updated_at == resolved.occurred_at
    assert incident.summary == opened.summary and incident.evidence["jobs_running"] == 1
    assert incident.trace_id == TRACE
    assert [e.event_type for e in timeline] == ["IncidentOpened", "IncidentResolved"]


async def test_escalation_keeps_the_reason(sessions):
    await _record(sessions, _event(IncidentOpened), _event(IncidentEscalated))
    async with sessions() as session:
        [incident] = await list_incidents(session, where=IncidentFilter(status="escalated"))
        timeline = await incident_timeline(session, incident_id=incident.id)
    assert incident.resolution == "2 kill attempts did not free GPU 0"
    assert incident.closed_at == datetime(2026, 11, 22, 10, 16, tzinfo=UTC)
    assert timeline[-1].summary == "escalated: 2 kill attempts did not free GPU 0"


async def test_a_late_redelivered_ending_does_not_override_a_later_one(sessions):
    await _record(sessions, _event(IncidentOpened), _event(IncidentEscalated), _event(IncidentResolved))
    async with sessions() as session:
        incident = await find_incident(session, id_prefix=INCIDENT)
    # Escalated (10:16:00) happened after Resolved (10:15:20), though it arrived first.
    assert incident.status == "escalated"


async def test_actions_before_the_incident_are_kept_without_an_incident(sessions):
    requested = _event(ActionRequested)
    await _record(sessions, requested)
    async with sessions() as session:
        assert await list_incidents(session) == []
        assert [e.summary for e in await incident_timeline(session, incident_id=INCIDENT)] == [
            "action requested: kill_gpu_processes: kill pid 41230 on GPU 0 (SIGTERM, SIGKILL after 10s) (attempt 1)"
        ]


async def test_a_malformed_trace_id_only_loses_the_link(sessions):
    assert await _record(sessions, _event(IncidentOpened), trace_id="not-a-trace") == [True]
    async with sessions() as session:
        incident = await find_incident(session, id_prefix=INCIDENT)
    assert incident.trace_id is None


async def test_list_incidents_newest_first_with_status_filter_and_limit(sessions):
    base = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    ids = [str(uuid.uuid4()) for _ in range(3)]
    events = [
        _event(IncidentOpened, incident_id=i, occurred_at=(base + timedelta(minutes=n)).isoformat())
        for n, i in enumerate(ids)
    ]
    events.append(_event(IncidentResolved, incident_id=ids[1], occurred_at=(base + timedelta(hours=1)).isoformat()))
    await _record(sessions, *events)
    async with sessions() as session:
        assert [i.id for i in await list_incidents(session)] == ids[::-1]
        assert [i.id for i in await list_incidents(session, where=IncidentFilter(status="open"))] == [ids[2], ids[0]]
        assert [i.id for i in await list_incidents(session, where=IncidentFilter(status="resolved"))] == [ids[1]]
        assert [i.id for i in await list_incidents(session, limit=1)] == [ids[2]]
        with pytest.raises(ValueError, match="unknown incident status"):
            await list_incidents(session, where=IncidentFilter(status="closed"))
        assert [i.id for i in await list_incidents(session, limit=1, offset=1)] == [ids[1]]
        with pytest.raises(ValueError, match="offset must not be negative"):
            await list_incidents(session, offset=-1)


async def test_find_incident_by_unique_prefix(sessions):
    ids = ["aaaa1111-0000-4000-8000-000000000001", "aaaa2222-0000-4000-8000-000000000002"]
    await _record(sessions, *(_event(IncidentOpened, incident_id=i) for i in ids))
    async with sessions() as session:
        assert (await find_incident(session, id_prefix="AAAA2")).id == ids[1]
        assert (await find_incident(session, id_prefix=ids[0])).id == ids[0]
        assert await find_incident(session, id_prefix="b") is None
        assert await find_incident(session, id_prefix="aaaa_") is None  # a LIKE wildcard is a literal here
        with pytest.raises(ValueError, match="ambiguous.*aaaa1111"):
            await find_incident(session, id_prefix="aaaa")
        with pytest.raises(ValueError, match="empty"):
            await find_incident(session, id_prefix="  ")


def _span(span_id: str, start_s: float, parent: str | None = None, trace_id: str = TRACE) -> SpanRecord:
    start = datetime(2026, 11, 22, 10, 15, 5, tzinfo=UTC) + timedelta(seconds=start_s)
    return SpanRecord(
        trace_id=trace_id,
        span_id=span_id,
        parent_span_id=parent,
        name=f"step-{span_id[-1]}",
        service="remediator",
        started_at=start,
        ended_at=start + timedelta(milliseconds=250),
        status="OK",
        attributes={"gpumedic.incident_id": INCIDENT, "gpumedic.attempt": 1},
    )


async def test_record_spans_is_idempotent_and_trace_spans_are_ordered(sessions):
    root, act, verify = "a3ce929d0e0e4736", "00f067aa0ba902b7", "00f067aa0ba902b8"
    first = [_span(verify, 2.0, root), _span(root, 0.0), _span(verify, 2.0, root)]
    other_trace = _span("1111111111111111", 1.0, trace_id="0af7651916cd43dd8448eb211c80319c")
    async with sessions() as session:
        assert await record_spans(session, spans=first) == 2
        await session.commit()
    async with sessions() as session:
        assert await record_spans(session, spans=[_span(root, 0.0), _span(act, 1.0, root), other_trace]) == 2
        assert await record_spans(session, spans=[]) == 0
        await session.commit()
    async with sessions() as session:
        spans = await trace_spans(session, trace_id=TRACE)
    assert [s.span_id for s in spans] == [root, act, verify]
    assert spans[1].parent_span_id == root and spans[0].parent_span_id is None
    assert spans[1].attributes == {"gpumedic.incident_id": INCIDENT, "gpumedic.attempt": 1}
    assert spans[1].started_at == datetime(2026, 11, 22, 10, 15, 6, tzinfo=UTC)
    assert spans[1].ended_at.tzinfo is UTC


async def test_list_incidents_by_kind_node_and_time(sessions):
    base = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
    rows = [("zombie_job", "node-001"), ("zombie_job", "node-002"), ("gpu_lost", "node-001")]
    ids = [str(uuid.uuid4()) for _ in rows]
    await _record(sessions, *[
        _event(IncidentOpened, incident_id=i, kind=kind, node_id=node, occurred_at=(base + timedelta(minutes=n)).isoformat())
        for n, (i, (kind, node)) in enumerate(zip(ids, rows, strict=True))
    ])
    async with sessions() as session:
        assert [i.id for i in await list_incidents(session, where=IncidentFilter(kind="zombie_job"))] == [ids[1], ids[0]]
        assert [i.id for i in await list_incidents(session, where=IncidentFilter(node_id="node-001"))] == [ids[2], ids[0]]
        assert [i.id for i in await list_incidents(session, where=IncidentFilter(kind="zombie_job", node_id="node-001"))] == [ids[0]]
        window = IncidentFilter(since=base + timedelta(minutes=1), until=base + timedelta(minutes=2))
        assert [i.id for i in await list_incidents(session, where=window)] == [ids[1]]
