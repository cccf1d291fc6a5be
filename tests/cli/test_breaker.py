"""`gpumedic breaker`: the only way to close the remediator's fleet circuit breaker, by a person;
`gpumedic pause` opens it on purpose (a driver upgrade) and `gpumedic resume` closes it."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from sqlalchemy import select

from gpumedic.cli import main
from gpumedic_store import BreakerTrip, create_engine, session_factory
from gpumedic_store.migrate import upgrade
from gpumedic_store import breaker


async def _trip(url: str) -> None:
    engine = create_engine(url)
    async with session_factory(engine)() as session:
        await breaker.trip(session=session, reason="6 nodes needed action within 600s", now=datetime.now(UTC))
        await session.commit()
    await engine.dispose()


async def _trips(url: str) -> list[BreakerTrip]:
    engine = create_engine(url)
    async with session_factory(engine)() as session:
        rows = list((await session.scalars(select(BreakerTrip))).all())
    await engine.dispose()
    return rows


def test_status_shows_an_open_breaker_and_reset_closes_it_with_who_did_it(tmp_path, capsys):
    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    assert main(["breaker", "--store", url]) == 0
    assert "breaker closed" in capsys.readouterr().out

    asyncio.run(_trip(url))
    main(["breaker", "status", "--store", url])
    assert "breaker OPEN since" in (out := capsys.readouterr().out) and "6 nodes needed action" in out

    main(["breaker", "reset", "--by", "alice", "--store", url])
    assert "breaker reset by alice" in capsys.readouterr().out
    main(["breaker", "--store", url])
    assert "breaker closed" in capsys.readouterr().out
    (trip,) = asyncio.run(_trips(url))
    assert trip.reset_by == "alice" and trip.reset_at is not None


def test_pause_stops_every_action_with_its_reason_until_resume(tmp_path, capsys):
    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    assert main(["pause", "--reason", "driver upgrade to 570", "--by", "alice", "--store", url]) == 0
    assert "remediation paused by alice (driver upgrade to 570)" in capsys.readouterr().out
    main(["breaker", "--store", url])
    assert "breaker OPEN since" in (out := capsys.readouterr().out) and "paused by alice: driver upgrade to 570" in out
    # a second pause keeps the first (its reason and time), and says so
    assert main(["pause", "--reason", "another", "--by", "bob", "--store", url]) == 1
    assert "already open" in (out := capsys.readouterr().out) and "paused by alice: driver upgrade to 570" in out
    assert main(["resume", "--by", "carol", "--store", url]) == 0
    assert "resumed by carol" in (out := capsys.readouterr().out) and "paused by alice" in out
    main(["breaker", "--store", url])
    assert "breaker closed" in capsys.readouterr().out
    (trip,) = asyncio.run(_trips(url))
    assert (trip.reason, trip.reset_by) == ("paused by alice: driver upgrade to 570", "carol")
    assert main(["resume", "--by", "carol", "--store", url]) == 0
    assert "nothing was paused" in capsys.readouterr().out
