"""report-builder's reads and writes of the incident store.

Incident and action events arrive on different streams, in any order, and any of them may be
delivered twice. Every event is kept once (by its event id) in the incident's timeline, and
the incident row is brought up to date from whatever arrived, so the store converges to the
same state whatever the order. Functions take the session keyword-only; the caller commits.
"""

from __future__ import annotations

import logging
import re
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import Insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    CapacityEvaluated,
    ClusterChecked,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    SilenceAdded,
    SilenceRemoved,
    SpanRecord,
)
from gpumedic_events.redact import redact, redact_tree
from gpumedic_store import ActionRecord, CapacityCheck, ClusterCheck, Incident, IncidentMark, Notification, Silence, SpanRow, TimelineEntry
from gpumedic_store.cost import Price, cost_of

log = logging.getLogger(__name__)

IncidentEvent = IncidentOpened | IncidentUpdated | IncidentResolved | IncidentEscalated
RecordedEvent = IncidentEvent | ActionRequested | ActionCompleted

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_BATCH = 500
"""Rows per INSERT: well under SQLite's bound-parameter limit."""


async def record_event(session: AsyncSession, *, event: RecordedEvent, subject: str, trace_id: str | None) -> bool:
    """Keep `event` in its incident's timeline and update the incident; False if already kept."""
    if not isinstance(event, RecordedEvent):
        raise TypeError(f"record_event does not keep {type(event).__name__}")
    trace_id = _valid_trace_id(trace_id)
    incident_id = str(event.incident_id)
    entry = {
        "event_id": str(event.event_id),
        "incident_id": incident_id,
        "occurred_at": event.occurred_at,
        "event_type": type(event).__name__,
        "subject": subject,
        "source": event.source,
        "summary": redact(_summary(event)),
        "payload": redact_tree(event.model_dump(mode="json")),  # job text as the sampler masked it, masked again
        "trace_id": trace_id,
    }
    # ON CONFLICT DO NOTHING rather than look-then-insert: two replicas handling a redelivered
    # message at once must not both keep it (nor fail on the unique event id).
    stmt = _insert(session, TimelineEntry).values(entry).on_conflict_do_nothing(index_elements=["event_id"])
    inserted = await session.scalar(stmt.returning(TimelineEntry.id))
    if inserted is None:
        log.debug("event %s of incident %s already recorded", event.event_id, incident_id)
        return False

    incident = await session.get(Incident, incident_id)
    if isinstance(event, IncidentOpened):
        incident = _opened(incident, event, trace_id)
        session.add(incident)
    elif isinstance(event, IncidentUpdated):
        if incident is not None:
            incident.occurrences = max(incident.occurrences, event.occurrences)
            incident.evidence = {**incident.evidence, **redact_tree(event.evidence)}
            incident.related_incident_id = str(event.related_incident_id) if event.related_incident_id else incident.related_incident_id
    elif isinstance(event, IncidentResolved | IncidentEscalated):
        incident = _closed(incident, event, trace_id)
        session.add(incident)
    elif incident is not None and incident.trace_id is None and trace_id is not None:
        incident.trace_id = trace_id
    if incident is not None and event.occurred_at > incident.updated_at:
        incident.updated_at = event.occurred_at
    await session.flush()
    return True


async def record_spans(session: AsyncSession, *, spans: Sequence[SpanRecord]) -> int:
    """Keep finished spans; a span already kept (same span id) is left as it is. Returns how many were new."""
    rows: dict[str, dict[str, Any]] = {}
    for span in spans:
        rows.setdefault(span.span_id, span.model_dump(mode="python"))
    new = 0
    values = list(rows.values())
    for start in range(0, len(values), _SPAN_BATCH):
        batch = values[start : start + _SPAN_BATCH]
        stmt = _insert(session, SpanRow).values(batch).on_conflict_do_nothing(index_elements=["span_id"])
        new += len((await session.scalars(stmt.returning(SpanRow.span_id))).all())
    return new


def _insert(session: AsyncSession, model: type) -> Insert:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(model)
    if dialect == "sqlite":
        return sqlite.insert(model)
    raise NotImplementedError(f"the incident store supports SQLite and PostgreSQL, not {dialect}")


def _valid_trace_id(trace_id: str | None) -> str | None:
    if trace_id is None:
        return None
    if not _TRACE_ID.fullmatch(trace_id) or trace_id == "0" * 32:
        # A malformed header must not keep the event out of the store; it only loses the link.
        log.warning("ignoring invalid trace id %r", trace_id[:64])
        return None
    return trace_id


def _summary(event: RecordedEvent) -> str:
    match event:
        case IncidentOpened() if event.silence_id is not None:
            text = f"opened, silenced (no action; silence {event.silence_id}): {event.summary}"
        case IncidentOpened():
            text = f"opened: {event.summary}"
        case IncidentUpdated():
            related = f"; part of {event.related_incident_id}" if event.related_incident_id else ""
            text = f"updated ({event.occurrences} occurrences{related}): {event.summary}"
        case ActionRequested():
            text = f"action requested: {event.operation.operation}: {event.operation.describe()} (attempt {event.attempt})"
        case ActionCompleted():
            text = f"action {event.outcome.value}: {event.detail}"
        case IncidentResolved():
            text = f"resolved ({event.resolution}): {event.summary}"
        case IncidentEscalated():
            text = f"escalated: {event.reason}"
        case _:
            raise TypeError(f"no summary for {type(event).__name__}")
    # One line: the timeline is read in a terminal and in a table cell.
    return " ".join(text.split())


def _fingerprint(event: IncidentEvent) -> str:
    """The detectors' (node, kind, gpu) fingerprint, for an incident known only from its end."""
    gpu = "-" if event.gpu_index is None else str(event.gpu_index)
    return f"{event.node_id}/{event.kind.value}/{gpu}"


def _new_incident(event: IncidentEvent, trace_id: str | None, **fields: Any) -> Incident:
    return Incident(
        id=str(event.incident_id),
        node_id=event.node_id,
        kind=event.kind.value,
        gpu_index=event.gpu_index,
        opened_at=event.occurred_at,
        updated_at=event.occurred_at,
        closed_at=None,
        resolution=None,
        trace_id=trace_id,
        **fields,
    )


def _opened(incident: Incident | None, event: IncidentOpened, trace_id: str | None) -> Incident:
    if incident is None:
        incident = _new_incident(event, trace_id, fingerprint=event.fingerprint, status="open", summary="", evidence={})
    # When the incident's end arrived first, this fills in what only the opening knows and leaves it closed.
    incident.fingerprint = event.fingerprint
    incident.summary = redact(event.summary)
    incident.evidence = redact_tree(event.evidence)
    incident.opened_at = min(incident.opened_at, event.occurred_at)
    incident.trace_id = incident.trace_id or trace_id
    incident.detector = event.source
    incident.severity = event.severity
    incident.diagnosis = redact_tree(event.diagnosis.model_dump(mode="json")) if event.diagnosis else None
    incident.recommended_action = redact(event.recommended_action)
    incident.related_incident_id = str(event.related_incident_id) if event.related_incident_id else None
    incident.silence_id = str(event.silence_id) if event.silence_id else None
    return incident


def _closed(incident: Incident | None, event: IncidentResolved | IncidentEscalated, trace_id: str | None) -> Incident:
    if isinstance(event, IncidentResolved):
        status, resolution, summary = "resolved", event.resolution, event.summary
    else:
        status, resolution, summary = "escalated", event.reason, event.reason
    if incident is None:
        incident = _new_incident(
            event, trace_id, fingerprint=_fingerprint(event), status=status, summary=summary, evidence={}
        )
    elif incident.closed_at is not None and event.occurred_at < incident.closed_at:
        # Redeliveries come out of order: an earlier ending never overrides a later one.
        return incident
    incident.status = status
    incident.resolution = resolution
    incident.closed_at = event.occurred_at
    incident.trace_id = incident.trace_id or trace_id
    return incident


# --- cost ----------------------------------------------------------------------------------------


DRAIN, TERMINATE = "drain_node", "terminate_worker"


async def update_cost(session: AsyncSession, *, incident_id: str, price: Price, now: datetime) -> Incident | None:
    """Work out what the incident cost as of `now` (final once it is closed) and keep it on its row;
    the incident, or None if the store has no row for it yet."""
    incident = await session.get(Incident, incident_id)
    if incident is None:
        return None
    actions = await session.scalars(
        select(ActionRecord).where(ActionRecord.incident_id == incident_id, ActionRecord.status == "succeeded")
    )
    done: dict[str, list[datetime]] = {}
    for action in actions:
        if action.finished_at is not None:
            done.setdefault((action.operation or {}).get("operation"), []).append(action.finished_at)
    cost = cost_of(
        kind=incident.kind, gpu_index=incident.gpu_index, evidence=incident.evidence or {}, opened_at=incident.opened_at,
        closed_at=incident.closed_at, drained_at=min(done.get(DRAIN, ()), default=None),
        terminated_at=min(done.get(TERMINATE, ()), default=None), price=price,
    )
    incident.cost = cost.as_json(now)
    incident.gpu_hours = incident.cost["gpu_hours"]
    incident.cost_usd = incident.cost["usd"]
    await session.flush()
    return incident


# --- silences ---------------------------------------------------------------------------------


async def record_silence(session: AsyncSession, *, event: SilenceAdded | SilenceRemoved) -> None:
    """Keep a silence as it was set, and when it was lifted (either may arrive twice, or lifted first)."""
    silence = await session.get(Silence, str(event.silence_id))
    if isinstance(event, SilenceAdded):
        if silence is None:
            silence = Silence(id=str(event.silence_id), removed_at=None, removed_by=None)
            session.add(silence)
        silence.node_id = event.node_id
        silence.kind = event.kind.value if event.kind else None
        silence.gpu_index = event.gpu_index
        silence.matchers = [str(m) for m in event.matchers] or None
        silence.starts_at = event.starts_at
        silence.ends_at = event.ends_at
        silence.every_s = event.every_s
        silence.last_ends_at = event.last_end if event.every_s else None
        silence.reason = event.reason
        silence.created_by = event.created_by
    elif silence is not None:
        silence.removed_at = silence.removed_at or event.occurred_at
        silence.removed_by = silence.removed_by or event.removed_by
    else:
        log.warning("silence %s was lifted before it was recorded; nothing to lift", event.silence_id)
    await session.flush()


# --- operators' marks: the false-positive ledger, acknowledgements ---------------------------------


async def mark(session: AsyncSession, *, incident_id: str, verdict: str, reason: str, by: str, now: datetime) -> IncidentMark:
    """An operator's mark on an incident (a false positive, an acknowledgement); marking again
    updates it. One statement, so two marks of one incident handled at once cannot both insert."""
    uuid.UUID(incident_id)
    values = {"reason": reason, "marked_by": by, "marked_at": now}
    stmt = _insert(session, IncidentMark).values(incident_id=incident_id, verdict=verdict, **values)
    await session.execute(stmt.on_conflict_do_update(index_elements=["incident_id", "verdict"], set_=values))
    found = await session.get(IncidentMark, (incident_id, verdict), populate_existing=True)
    assert found is not None
    return found


# --- notifications (the outbox the notifier delivers) --------------------------------------------


async def queue_notifications(
    session: AsyncSession, *, incident_id: str, reason: str, channels: Sequence[str], now: datetime, due_at: datetime,
    event: str = "escalated",
) -> int:
    """One pending notification per channel for an escalated (or resolved) incident; one already
    queued stays as it is (a redelivered escalation is told once). Returns how many were new."""
    if not channels:
        return 0
    rows = [
        {"incident_id": incident_id, "channel": c, "event": event, "reason": reason, "status": "pending", "attempts": 0,
         "due_at": due_at, "created_at": now, "finished_at": None, "detail": ""}
        for c in channels
    ]
    stmt = _insert(session, Notification).values(rows).on_conflict_do_nothing(index_elements=["incident_id", "channel", "event"])
    return len((await session.scalars(stmt.returning(Notification.channel))).all())


async def escalation_channels(session: AsyncSession, *, incident_id: str) -> list[str]:
    """The channels an incident's escalation was queued for (its end goes to the same)."""
    stmt = select(Notification.channel).where(Notification.incident_id == incident_id, Notification.event == "escalated")
    return list((await session.scalars(stmt)).all())


async def due_notifications(session: AsyncSession, *, now: datetime, limit: int = 50) -> list[Notification]:
    stmt = (
        select(Notification)
        .where(Notification.status == "pending", Notification.due_at <= now)
        .order_by(Notification.due_at, Notification.incident_id)
        .limit(limit)
    )
    return list((await session.scalars(stmt)).all())


async def claim_notification(session: AsyncSession, *, row: Notification, until: datetime) -> bool:
    """Take a due row for one delivery round by moving its due time (compare-and-set on the one
    we read): of several report-builders that read it, exactly one wins."""
    stmt = (
        update(Notification)
        .where(
            Notification.incident_id == row.incident_id,
            Notification.channel == row.channel,
            Notification.event == row.event,
            Notification.status == "pending",
            Notification.due_at == row.due_at,
        )
        .values(due_at=until)
    )
    return (await session.execute(stmt)).rowcount == 1


async def reschedule_notification(session: AsyncSession, *, row: Notification, due_at: datetime, attempts: int, detail: str) -> None:
    await session.execute(
        update(Notification)
        .where(Notification.incident_id == row.incident_id, Notification.channel == row.channel, Notification.event == row.event,
               Notification.status == "pending")
        .values(due_at=due_at, attempts=attempts, detail=detail)
    )


async def settle_notification(session: AsyncSession, *, row: Notification, status: str, detail: str, now: datetime, attempts: int) -> None:
    await session.execute(
        update(Notification)
        .where(Notification.incident_id == row.incident_id, Notification.channel == row.channel, Notification.event == row.event,
               Notification.status == "pending")
        .values(status=status, detail=detail, finished_at=now, attempts=attempts)
    )


# --- the cluster monitoring log ---------------------------------------------------------------


async def record_cluster_check(session: AsyncSession, *, event: ClusterChecked) -> bool:
    """Keep one check (once, by its event id); False if it was already kept."""
    stmt = _insert(session, ClusterCheck).values(
        event_id=str(event.event_id),
        cluster=event.cluster,
        checked_at=event.occurred_at,
        peers_total=event.peers_total,
        peers_answering=event.peers_answering,
        voters_alive=event.voters_alive,
        voters_total=event.voters_total,
        leader=event.leader,
        healthy=event.healthy,
        summary=event.summary,
        problems=[p.model_dump(mode="json") for p in event.problems],
        peers=[p.model_dump(mode="json") for p in event.peers],
    ).on_conflict_do_nothing(index_elements=["event_id"])
    return (await session.execute(stmt)).rowcount == 1


# --- the worker pool's capacity over time --------------------------------------------------------


async def record_capacity_check(session: AsyncSession, *, event: CapacityEvaluated) -> bool:
    """Keep one autoscaler round (once, by its event id); False if it was already kept."""
    stmt = _insert(session, CapacityCheck).values(
        event_id=str(event.event_id),
        checked_at=event.occurred_at,
        decision=event.decision,
        reason=event.reason,
        gpus_total=event.gpus_total,
        gpus_busy=event.gpus_busy,
        gpus_wanted=event.gpus_wanted,
        queued=event.queued,
        in_progress=event.in_progress,
        workers=event.workers,
        workers_in_service=event.workers_in_service,
        cost_per_h=event.cost_per_h,
        cost_total=event.cost_total,
        error=event.demand_error or event.provider_error,
        provider_error=event.provider_error,
        demand_error=event.demand_error,
        worker_rows=[w.model_dump(mode="json") for w in event.worker_rows],
    ).on_conflict_do_nothing(index_elements=["event_id"])
    return (await session.execute(stmt)).rowcount == 1


