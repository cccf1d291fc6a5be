"""Runbook 000's game count as a probe: new rows in a job's SQLite table are output, though a
database that reuses its free pages grows no file. On real SQLite databases."""

from __future__ import annotations

import sqlite3
import threading
from pathlib import Path

import pytest
from pydantic import ValidationError

from node_sampler.jobs import OutputGrowthProbe, RowGrowthProbe
from node_sampler.readings import merge_jobs
from node_sampler.settings import Settings


def games_db(path: Path, *, without_rowid: bool = False) -> Path:
    with sqlite3.connect(path) as db:
        db.execute(f"CREATE TABLE games (id INTEGER PRIMARY KEY, moves BLOB NOT NULL){' WITHOUT ROWID' if without_rowid else ''}")
    return path


def play(path: Path, games: int) -> None:
    with sqlite3.connect(path) as db:
        db.executemany("INSERT INTO games (moves) VALUES (?)", [(b"x" * 2000,) for _ in range(games)])


async def test_rows_written_into_free_pages_are_output_though_no_file_grows(tmp_path):
    db = games_db(tmp_path / "selfplay.db")
    play(db, 2000)
    with sqlite3.connect(db) as conn:
        conn.execute("DELETE FROM games")  # an export moved them out: their pages are free, the file keeps its size
    size = db.stat().st_size
    rows, bytes_ = RowGrowthProbe([(db, "games")]), OutputGrowthProbe.for_paths([db])
    assert (await rows.observe()).output_growing is None and (await bytes_.observe()).output_growing is None  # baselines
    play(db, 500)
    assert db.stat().st_size == size  # the premise: the new games went into free pages
    by_rows, by_bytes = await rows.observe(), await bytes_.observe()
    assert by_bytes.output_growing is False and by_rows.output_growing is True
    assert merge_jobs([by_bytes, by_rows]).output_growing is True  # either measure growing is output
    still_rows, still_bytes = await rows.observe(), await bytes_.observe()
    assert still_rows.output_growing is False and merge_jobs([still_bytes, still_rows]).output_growing is False


async def test_a_table_without_rowids_is_counted(tmp_path):
    db = games_db(tmp_path / "g.db", without_rowid=True)
    probe = RowGrowthProbe([(db, "games")])
    await probe.observe()
    with sqlite3.connect(db) as conn:
        conn.execute("INSERT INTO games VALUES (7, x'00')")
    assert (await probe.observe()).output_growing is True


async def test_what_cannot_be_read_is_a_note_never_a_standstill(tmp_path):
    db = games_db(tmp_path / "g.db")
    probe = RowGrowthProbe([(tmp_path / "missing.db", "games"), (db, "nosuch")])
    reading = await probe.observe()
    assert reading.output_growing is None
    assert reading.errors == (f"rows probe: {tmp_path / 'missing.db'}:games: no such database",
                              f"rows probe: {db}:nosuch: no such table: nosuch")
    assert not (tmp_path / "missing.db").exists()  # read-only: nothing is created


async def test_a_writer_holding_the_database_costs_a_second_not_the_sample(tmp_path):
    db = games_db(tmp_path / "g.db")
    probe = RowGrowthProbe([(db, "games")])
    writer = sqlite3.connect(db, check_same_thread=False)
    writer.execute("BEGIN EXCLUSIVE")
    try:
        reading = await probe.observe()
    finally:
        threading.Thread(target=writer.rollback).start()
    assert reading.output_growing is None and "locked" in reading.errors[0]


@pytest.mark.parametrize("entry", ["games.db:games", "/data/g.db", '/data/g.db:games"; DROP TABLE games; --', "/data/g.db:1games"])
def test_a_bad_entry_is_refused_at_start_with_what_to_give(entry):
    with pytest.raises(ValidationError, match="PATH:TABLE|absolute database path"):
        Settings(watch_rows=[entry])
    assert Settings(watch_rows=["/data/games/selfplay.db:games"]).watch_rows == ["/data/games/selfplay.db:games"]


async def test_a_postgresql_tables_inserts_are_output_read_from_the_servers_own_counter(postgres_database, tmp_path, monkeypatch):
    """The same game count where the games go to PostgreSQL: the table's insert counter grows with
    every row, whatever the table's size on disk; the URL carries no password (libpq's ~/.pgpass)."""
    import asyncio

    import asyncpg
    from sqlalchemy.engine import make_url

    from node_sampler.pgrows import PostgresRowsProbe

    server = make_url(postgres_database)
    url = f"postgresql://{server.username}@{server.host}:{server.port}/{server.database}"
    admin = await asyncpg.connect(url)
    try:
        await admin.execute("CREATE TABLE games (id bigserial PRIMARY KEY, moves bytea NOT NULL)")
        (probe,) = RowGrowthProbe.parse([f"{url}:games"])
        assert isinstance(probe, PostgresRowsProbe)

        async def look() -> bool | None:
            await asyncio.sleep(1.2)  # the server publishes its table statistics about a second after a commit
            return (await probe.observe()).output_growing

        assert await look() is None  # no baseline yet
        await admin.executemany("INSERT INTO games (moves) VALUES ($1)", [(b"x" * 100,)] * 10)
        assert await look() is True
        await admin.execute("DELETE FROM games")  # rows gone, none added: nothing was played
        assert await look() is False
        await admin.execute("INSERT INTO games (moves) VALUES ($1)", b"y")
        assert await look() is True
    finally:
        await admin.close()
    unreachable = (await PostgresRowsProbe([("postgresql://nobody@127.0.0.1:1/nope", "games")]).observe())
    assert unreachable.output_growing is None and "rows probe: 127.0.0.1:1/nope:games: " in unreachable.errors[0]
    with pytest.raises(ValueError, match="put no password in the URL"):
        RowGrowthProbe.parse(["postgresql://selfplay:hunter2@db:5432/games:games"])
    with pytest.raises(ValidationError) as refused:
        Settings(watch_rows=["postgresql://selfplay:hunter2@db:5432/games:games"])
    assert "hunter2" not in str(refused.value)
    with pytest.raises(ValueError, match="postgresql://USER@HOST"):
        RowGrowthProbe.parse(["postgresql:///games:games"])
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "asyncpg" else real(name, *a))
    with pytest.raises(ValueError, match=r"install gpumedic-node-sampler\[postgres\]"):  # a node without the extra: said at start
        RowGrowthProbe.parse([f"{url}:games"])
