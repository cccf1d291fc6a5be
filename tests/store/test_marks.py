"""The false-positive ledger's write: marking one incident twice at once (the CLI's event and the
console, or a redelivery) is one row, never an integrity error, on both backends."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gpumedic_store.models import IncidentMark
from report_builder import repository

NOW = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)


async def test_two_marks_of_one_incident_at_once_are_one_row_and_a_later_mark_updates_it(sessions):
    incident = str(uuid.uuid4())

    async def mark(by: str, at: datetime) -> None:
        async with sessions() as session:
            await repository.mark(session, incident_id=incident, verdict="false_positive", reason=f"{by} says so", by=by, now=at)
            await session.commit()

    await asyncio.gather(mark("alice", NOW), mark("bob", NOW))
    async with sessions() as session:
        rows = (await session.scalars(select(IncidentMark))).all()
    assert len(rows) == 1 and rows[0].marked_by in ("alice", "bob")
    await mark("carol", NOW + timedelta(minutes=1))
    async with sessions() as session:
        (row,) = (await session.scalars(select(IncidentMark))).all()
    assert (row.marked_by, row.reason) == ("carol", "carol says so")
