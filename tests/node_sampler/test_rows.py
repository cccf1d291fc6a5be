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
