"""The remediator's gate lock and its fleet circuit breaker's trips.

The remediator trips the breaker and decides under the lock; a person resets the breaker from the
CLI (`gpumedic breaker reset`, `gpumedic resume`) or the web console (report-builder), and may open
it on purpose (`gpumedic pause`: a driver upgrade, maintenance), which stops every action
fleet-wide while detection goes on. The few functions all of them
need live here, beside the tables, so that no service imports another. They take the session
keyword-only and never commit.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_store.models import BreakerTrip, GateLock


async def lock_gate(*, session: AsyncSession) -> None:
    """Take the gate's lock until this transaction ends; must be its first statement.

    An UPDATE of the one `gate_lock` row: PostgreSQL holds the row lock, SQLite the database's
    write lock (waiting out the busy timeout), so a second decision waits for the first to commit
    and then sees what it wrote.
    """
    result = await session.execute(update(GateLock).where(GateLock.id == 1).values(decisions=GateLock.decisions + 1))
    if result.rowcount != 1:
        raise RuntimeError("the store has no gate lock row; run `gpumedic migrate`")


async def open_trip(*, session: AsyncSession) -> BreakerTrip | None:
    """The earliest breaker trip not yet reset, if any."""
    return await session.scalar(
        select(BreakerTrip).where(BreakerTrip.reset_at.is_(None)).order_by(BreakerTrip.tripped_at).limit(1)
    )


async def trip(*, session: AsyncSession, reason: str, now: datetime) -> BreakerTrip:
    """Open the breaker; an already open trip is kept (and returned) rather than doubled."""
    current = await open_trip(session=session)
    if current is not None:
        return current
    record = BreakerTrip(tripped_at=now, reason=reason, reset_at=None, reset_by=None)
    session.add(record)
    await session.flush()
    return record


PAUSED_BY = "paused by "
"""How a person's pause reads in a trip's reason (the remediator's own trips name their cause)."""


async def pause(*, session: AsyncSession, reason: str, by: str, now: datetime) -> tuple[BreakerTrip, bool]:
    """Open the breaker on purpose, after any decision under way; (the open trip, whether it is
    this one: an open breaker is kept as it is)."""
    await lock_gate(session=session)
    current = await open_trip(session=session)
    if current is not None:
        return current, False
    return await trip(session=session, reason=f"{PAUSED_BY}{by}: {reason}", now=now), True


async def reset(*, session: AsyncSession, by: str, now: datetime) -> list[BreakerTrip]:
    """Close every open trip (a person checked the fleet); the trips reset, none if it was closed."""
    await lock_gate(session=session)
    trips = list(
        (await session.scalars(select(BreakerTrip).where(BreakerTrip.reset_at.is_(None)).order_by(BreakerTrip.tripped_at))).all()
    )
    for item in trips:
        item.reset_at = now
        item.reset_by = by
    await session.flush()
    return trips
