"""Engines: SQLite's settings, UTC timestamps on both backends, and a clear error when the store is down."""

from __future__ import annotations

import asyncio
import socket
from datetime import UTC, datetime, timedelta, timezone

import pytest
from gpumedic_store import (
    ActionRecord,
    BreakerTrip,
    StoreSettings,
    StoreUnavailable,
    create_engine,
    mask_url,
    ping,
    session_factory,
    upgrade,
)
from gpumedic_store.engine import SQLITE_BUSY_TIMEOUT_MS
from sqlalchemy import select, text
from sqlalchemy.exc import IntegrityError, StatementError

PASSWORD = "s3cret-Pa55"


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_settings_read_the_environment_and_mask_the_password(monkeypatch):
    monkeypatch.setenv("GPUMEDIC_STORE_URL", f"postgresql+asyncpg://gpumedic:{PASSWORD}@db.internal:5432/gpumedic")
    settings = StoreSettings()
    assert settings.url.endswith("@db.internal:5432/gpumedic")
    assert settings.safe_url == "postgresql+asyncpg://gpumedic:***@db.internal:5432/gpumedic"
    assert PASSWORD not in mask_url(f"postgresql+asyncpg://db.internal/gpumedic?user=u&password={PASSWORD}")
    assert StoreSettings(url="sqlite+aiosqlite:///var/gpumedic.db").safe_url == "sqlite+aiosqlite:///var/gpumedic.db"


def test_default_url_is_a_sqlite_file(monkeypatch):
    monkeypatch.delenv("GPUMEDIC_STORE_URL", raising=False)
    assert StoreSettings().url == "sqlite+aiosqlite:///var/gpumedic.db"


async def test_sqlite_connections_use_wal_a_busy_timeout_and_foreign_keys(tmp_path):
    engine = create_engine(f"sqlite+aiosqlite:///{tmp_path}/missing/dir/store.db")
    try:
        async with engine.connect() as conn:
            assert (await conn.exec_driver_sql("PRAGMA journal_mode")).scalar() == "wal"
            assert (await conn.exec_driver_sql("PRAGMA busy_timeout")).scalar() == SQLITE_BUSY_TIMEOUT_MS == 30_000
            assert (await conn.exec_driver_sql("PRAGMA foreign_keys")).scalar() == 1
    finally:
        await engine.dispose()
    assert (tmp_path / "missing" / "dir" / "store.db").exists()


async def test_postgres_that_is_down_raises_store_unavailable_without_the_password():
    url = f"postgresql+asyncpg://gpumedic:{PASSWORD}@127.0.0.1:{_closed_port()}/gpumedic"
    engine = create_engine(url)
    try:
        with pytest.raises(StoreUnavailable) as caught:
            await ping(engine)
        with pytest.raises(StoreUnavailable):
            async with session_factory(engine)() as session:
                await session.scalar(select(BreakerTrip))
    finally:
        await engine.dispose()
    message = str(caught.value)
    assert mask_url(url) in message and "***" in message
    assert PASSWORD not in message and PASSWORD not in repr(caught.value)
    assert "refused" in message.lower() or "connect" in message.lower()


def test_migrating_a_database_that_is_down_raises_store_unavailable():
    url = f"postgresql+asyncpg://gpumedic:{PASSWORD}@127.0.0.1:{_closed_port()}/gpumedic"
    with pytest.raises(StoreUnavailable) as caught:
        upgrade(url)
    assert PASSWORD not in str(caught.value)


def test_sqlite_in_a_place_that_cannot_hold_a_directory_raises_store_unavailable(tmp_path):
    # Files cannot have children, whoever runs the test (root ignores permission bits).
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("")
    url = f"sqlite+aiosqlite:///{blocker}/store.db"
    with pytest.raises(StoreUnavailable, match="cannot create directory") as caught:
        create_engine(url)
    assert url in str(caught.value)


async def test_sqlite_file_that_cannot_be_opened_raises_store_unavailable(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}"  # a directory, not a database file
    engine = create_engine(url)
    try:
        with pytest.raises(StoreUnavailable, match="unable to open database file") as caught:
            await ping(engine)
    finally:
        await engine.dispose()
        # aiosqlite's worker thread answers its stop after the failed connect; let it, while this
        # test's event loop is still open (else it raises into whichever test runs next).
        await asyncio.sleep(0.1)
    assert str(tmp_path) in str(caught.value)


async def test_timestamps_come_back_aware_in_utc(sessions):
    tripped = datetime(2026, 11, 22, 12, 15, 5, 123456, tzinfo=timezone(timedelta(hours=2)))
    async with sessions() as session:
        session.add(BreakerTrip(tripped_at=tripped, reason="12 of 20 nodes needed action in 300 s"))
        await session.commit()
    async with sessions() as session:
        trip = await session.scalar(select(BreakerTrip))
        assert trip.tripped_at == tripped
        assert trip.tripped_at.tzinfo is UTC
        assert trip.tripped_at.hour == 10
        assert trip.reset_at is None
        # Comparisons in SQL use the same UTC form.
        assert await session.scalar(select(BreakerTrip.id).where(BreakerTrip.tripped_at > tripped - timedelta(seconds=1)))
        assert await session.scalar(select(BreakerTrip.id).where(BreakerTrip.tripped_at > tripped)) is None


async def test_naive_timestamps_are_refused(sessions):
    async with sessions() as session:
        session.add(BreakerTrip(tripped_at=datetime(2026, 11, 22, 10, 0), reason="naive"))
        with pytest.raises(StatementError, match="naive datetime"):
            await session.commit()


async def test_action_ledger_round_trip_and_status_check(sessions):
    now = datetime(2026, 11, 22, 10, 15, 5, tzinfo=UTC)
    record = {
        "incident_id": "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11",
        "node_id": "gpu-node-07",
        "attempt": 1,
        "operation": {"operation": "kill_gpu_processes", "gpu_index": 0, "targets": [{"pid": 41230}], "signal": "KILL"},
        "requested_at": now,
        "started_at": now,
    }
    async with sessions() as session:
        session.add(ActionRecord(action_id="1f7e3b2a-6c5d-5e4f-9a8b-7c6d5e4f3a21", status="executing", **record))
        await session.commit()
    async with sessions() as session:
        action = await session.get(ActionRecord, "1f7e3b2a-6c5d-5e4f-9a8b-7c6d5e4f3a21")
        assert action.steps == [] and action.detail == "" and action.finished_at is None
        action.status, action.steps = "succeeded", ["cat /proc/41230/stat", "kill -s KILL 41230"]
        action.finished_at = now + timedelta(seconds=1)
        await session.commit()
    async with sessions() as session:
        action = await session.get(ActionRecord, "1f7e3b2a-6c5d-5e4f-9a8b-7c6d5e4f3a21")
        assert action.steps == ["cat /proc/41230/stat", "kill -s KILL 41230"]
        assert action.operation["targets"] == [{"pid": 41230}]
        assert action.finished_at.tzinfo is UTC
        session.add(ActionRecord(action_id="00000000-0000-0000-0000-000000000000", status="maybe", **record))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_raw_connection_sees_utc_text_on_sqlite(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(url)
    engine = create_engine(url)
    try:
        async with session_factory(engine)() as session:
            session.add(BreakerTrip(tripped_at=datetime(2026, 1, 1, 1, 0, tzinfo=timezone(timedelta(hours=1))), reason="r"))
            await session.commit()
            stored = await session.scalar(text("SELECT tripped_at FROM breaker_trips"))
    finally:
        await engine.dispose()
    assert stored.startswith("2026-01-01 00:00:00")
