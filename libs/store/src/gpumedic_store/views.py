"""The read side of the incident store: what the CLI, the console and the services' own pages read.

Each service keeps its own writes (report-builder its timeline and notifications, the remediator
its ledger); the queries that people read through live here, once, so no operator command reaches
into a service's private repository. Every function takes an open session and never writes; a
command that only reads opens one with `store_session`.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_store.engine import create_engine, session_factory
from gpumedic_store.models import (
    INCIDENT_STATUSES,
    ActionRecord,
    CapacityCheck,
    ClusterCheck,
    Incident,
    IncidentMark,
    NodeDrain,
    NodeHour,
    NodeMinute,
    Notification,
    Silence,
    SpanRow,
    TimelineEntry,
)


@asynccontextmanager
async def store_session(url: str) -> AsyncIterator[AsyncSession]:
    """One session on the store at `url`, its engine disposed of afterwards (a command's whole visit)."""
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            yield session
    finally:
        await engine.dispose()


def span_status(status: str | None) -> str:
    """A kept span's OpenTelemetry status in an operator's words: UNSET (nothing went wrong) and OK are ok."""
    return {"UNSET": "ok", "OK": "ok", "ERROR": "failed"}.get((status or "UNSET").upper(), (status or "").lower())

# --- incidents ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IncidentFilter:
    """What the incident list shows: each field narrows it (None: any)."""

    status: str | None = None
    kind: str | None = None
    node_id: str | None = None
    since: datetime | None = None
    """Opened at or after."""
    until: datetime | None = None
    """Opened before."""

    def __post_init__(self) -> None:
        if self.status is not None and self.status not in INCIDENT_STATUSES:
            raise ValueError(f"unknown incident status {self.status!r}; expected one of {', '.join(INCIDENT_STATUSES)}")


async def list_incidents(
    session: AsyncSession, *, where: IncidentFilter = IncidentFilter(), limit: int = 50, offset: int = 0
) -> list[Incident]:
    """Incidents, newest first, narrowed by `where`."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    if offset < 0:
        raise ValueError(f"offset must not be negative, not {offset}")
    stmt = select(Incident).order_by(Incident.opened_at.desc(), Incident.id.desc()).limit(limit).offset(offset)
    for column, value in ((Incident.status, where.status), (Incident.kind, where.kind), (Incident.node_id, where.node_id)):
        if value is not None:
            stmt = stmt.where(column == value)
    if where.since is not None:
        stmt = stmt.where(Incident.opened_at >= where.since)
    if where.until is not None:
        stmt = stmt.where(Incident.opened_at < where.until)
    return list((await session.scalars(stmt)).all())


async def incident_kinds(session: AsyncSession) -> list[str]:
    """The kinds of incident recorded, for the list's filter."""
    return list((await session.scalars(select(Incident.kind).distinct().order_by(Incident.kind))).all())


async def unresolved_by_node(session: AsyncSession) -> dict[str, list[Incident]]:
    """Open and escalated incidents, by node (the fleet page's colours)."""
    stmt = select(Incident).where(Incident.status.in_(("open", "escalated"))).order_by(Incident.opened_at)
    by_node: dict[str, list[Incident]] = {}
    for incident in (await session.scalars(stmt)).all():
        by_node.setdefault(incident.node_id, []).append(incident)
    return by_node


async def actions_of(session: AsyncSession, *, incident_id: str) -> list[ActionRecord]:
    """The remediator's ledger rows of one incident, oldest first: its audit."""
    stmt = select(ActionRecord).where(ActionRecord.incident_id == incident_id).order_by(ActionRecord.started_at)
    return list((await session.scalars(stmt)).all())


async def find_incident(session: AsyncSession, *, id_prefix: str) -> Incident | None:
    """The one incident whose id starts with `id_prefix` (as a person types it in the CLI).

    None when nothing matches; ValueError when the prefix is empty or matches several.
    """
    return await _one_by_prefix(session, Incident, "an incident", id_prefix)


async def _one_by_prefix(session: AsyncSession, model, noun: str, id_prefix: str):
    """The one row of `model` whose id starts with `id_prefix`; None, or ValueError (empty, ambiguous)."""
    prefix = id_prefix.strip().lower()
    if not prefix:
        raise ValueError(f"{noun} id prefix must not be empty")
    stmt = select(model).where(model.id.startswith(prefix, autoescape=True)).order_by(model.id).limit(3)
    found = list((await session.scalars(stmt)).all())
    if len(found) > 1:
        shown = ", ".join(row.id for row in found[:2]) + (", ..." if len(found) > 2 else "")
        raise ValueError(f"{noun.split(' ', 1)[1]} id prefix {prefix!r} is ambiguous: it matches {shown}; type more of the id")
    return found[0] if found else None


async def incident_timeline(session: AsyncSession, *, incident_id: str) -> list[TimelineEntry]:
    """The incident's events, oldest first (ties in the order they were received)."""
    stmt = (
        select(TimelineEntry)
        .where(TimelineEntry.incident_id == incident_id)
        .order_by(TimelineEntry.occurred_at, TimelineEntry.id)
    )
    return list((await session.scalars(stmt)).all())


async def trace_spans(session: AsyncSession, *, trace_id: str) -> list[SpanRow]:
    """The trace's spans by start time."""
    stmt = select(SpanRow).where(SpanRow.trace_id == trace_id).order_by(SpanRow.started_at, SpanRow.span_id)
    return list((await session.scalars(stmt)).all())



# --- silences and the false-positive ledger -------------------------------------------------------


async def find_silence(session: AsyncSession, *, id_prefix: str) -> Silence | None:
    """The one silence whose id starts with `id_prefix`, as `find_incident` finds an incident."""
    return await _one_by_prefix(session, Silence, "a silence", id_prefix)


async def known_nodes(session: AsyncSession) -> set[str]:
    """Every node the store has heard of: one with history (sampled within its retention) or an incident."""
    sampled = await session.scalars(select(NodeHour.node_id).distinct())
    recent = await session.scalars(select(NodeMinute.node_id).distinct())
    named = await session.scalars(select(Incident.node_id).distinct())
    return set(sampled) | set(recent) | set(named)


async def list_silences(session: AsyncSession, *, now: datetime, include_past: bool = False) -> list[Silence]:
    """Silences in force (or every one), soonest to end first."""
    stmt = select(Silence).order_by(Silence.ends_at, Silence.id)
    if not include_past:
        stmt = stmt.where(func.coalesce(Silence.last_ends_at, Silence.ends_at) > now, Silence.removed_at.is_(None))
    return list((await session.scalars(stmt)).all())


@dataclass(frozen=True)
class RuleRecord:
    """How often one detector's rule (an incident kind) was right, by the operators' verdicts."""

    detector: str
    kind: str
    incidents: int
    false_positives: int

    @property
    def share(self) -> float:
        return self.false_positives / self.incidents if self.incidents else 0.0


async def false_positive_counts(session: AsyncSession) -> list[RuleRecord]:
    """Per detector and kind: incidents opened and those marked false positive."""
    marked = func.count(IncidentMark.incident_id)
    stmt = (
        select(Incident.detector, Incident.kind, func.count(Incident.id), marked)
        .outerjoin(IncidentMark, (IncidentMark.incident_id == Incident.id) & (IncidentMark.verdict == "false_positive"))
        .group_by(Incident.detector, Incident.kind)
        .order_by(marked.desc(), Incident.detector, Incident.kind)
    )
    return [RuleRecord(d or "?", k, int(n), int(fp)) for d, k, n, fp in (await session.execute(stmt)).all()]


async def marks_of(session: AsyncSession, *, incident_id: str) -> list[IncidentMark]:
    return list((await session.scalars(select(IncidentMark).where(IncidentMark.incident_id == incident_id))).all())


async def acknowledgements(session: AsyncSession, *, incident_ids: Sequence[str]) -> dict[str, IncidentMark]:
    """Who acknowledged each of these incidents (those nobody did are left out)."""
    found: dict[str, IncidentMark] = {}
    for at in range(0, len(incident_ids), 500):  # a bound on the statement's parameters
        batch = incident_ids[at : at + 500]
        found |= {m.incident_id: m for m in (await session.scalars(select(IncidentMark).where(
            IncidentMark.verdict == "acknowledged", IncidentMark.incident_id.in_(batch)))).all()}
    return found


# --- notifications, the cluster log, capacity, drains ---------------------------------------------


async def notifications_of(session: AsyncSession, *, incident_id: str) -> list[Notification]:
    stmt = select(Notification).where(Notification.incident_id == incident_id).order_by(Notification.channel, Notification.created_at)
    return list((await session.scalars(stmt)).all())


async def cluster_checks(session: AsyncSession, *, cluster: str | None, since: datetime) -> list[ClusterCheck]:
    """The checks since `since`, oldest first (one cluster's, or every cluster's)."""
    stmt = select(ClusterCheck).where(ClusterCheck.checked_at >= since).order_by(ClusterCheck.checked_at)
    if cluster is not None:
        stmt = stmt.where(ClusterCheck.cluster == cluster)
    return list((await session.scalars(stmt)).all())


async def clusters(session: AsyncSession) -> list[str]:
    return list((await session.scalars(select(ClusterCheck.cluster).distinct().order_by(ClusterCheck.cluster))).all())


async def capacity_checks(session: AsyncSession, *, since: datetime) -> list[CapacityCheck]:
    """The autoscaler's rounds since `since`, oldest first."""
    stmt = select(CapacityCheck).where(CapacityCheck.checked_at >= since).order_by(CapacityCheck.checked_at)
    return list((await session.scalars(stmt)).all())


async def latest_capacity_check(session: AsyncSession) -> CapacityCheck | None:
    """The autoscaler's latest round (its workers' table: `gpumedic workers`)."""
    return (await session.scalars(select(CapacityCheck).order_by(CapacityCheck.checked_at.desc()).limit(1))).first()


async def drained_nodes(session: AsyncSession) -> set[str]:
    """Nodes the remediator holds out of service (a drain_node not yet undone)."""
    return set((await session.scalars(select(NodeDrain.node_id).distinct())).all())



# --- the action ledger ----------------------------------------------------------------------------


async def list_actions(session: AsyncSession, *, node_id: str | None = None, incident_id: str | None = None, limit: int = 50) -> list[ActionRecord]:
    """The ledger, newest first: every decision (refusals and observed ones included)."""
    if limit < 1:
        raise ValueError(f"limit must be at least 1, not {limit}")
    stmt = select(ActionRecord).order_by(ActionRecord.started_at.desc(), ActionRecord.action_id).limit(limit)
    if node_id is not None:
        stmt = stmt.where(ActionRecord.node_id == node_id)
    if incident_id is not None:
        stmt = stmt.where(ActionRecord.incident_id.startswith(incident_id.lower(), autoescape=True))
    return list((await session.scalars(stmt)).all())


async def find_action(session: AsyncSession, *, id_prefix: str) -> ActionRecord | None:
    """The one action whose id starts with `id_prefix`; ValueError when empty or ambiguous."""
    prefix = id_prefix.strip().lower()
    if not prefix:
        raise ValueError("an action id prefix must not be empty")
    stmt = select(ActionRecord).where(ActionRecord.action_id.startswith(prefix, autoescape=True)).limit(2)
    found = list((await session.scalars(stmt)).all())
    if len(found) > 1:
        raise ValueError(f"action id prefix {prefix!r} is ambiguous; type more of the id")
    return found[0] if found else None


async def drains(session: AsyncSession, *, node_id: str | None = None) -> list[NodeDrain]:
    """The incidents holding nodes drained (one node's, or every node's), oldest first."""
    query = select(NodeDrain).order_by(NodeDrain.drained_at, NodeDrain.node_id)
    if node_id is not None:
        query = query.where(NodeDrain.node_id == node_id)
    return list((await session.scalars(query)).all())
