"""Job probes: does the node say it runs jobs, and is their output growing?

A zombie job is one the node claims to run while nothing comes out of it, so the sampler asks
the node's own view (its status endpoint, or a count of job processes) and watches outputs grow.
A probe never raises: a failed or malformed answer is `None` for what it measures plus a note,
because "could not tell" must never read as "no jobs".
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import sqlite3
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit

import jmespath
from jmespath.exceptions import JMESPathError

from node_sampler import http, pgrows
from node_sampler.readings import JobsReading
from node_sampler.procs import ProcessTable

MAX_STATUS_BYTES = 1024 * 1024
MAX_WALK_FILES = 100_000
"""A watched directory bigger than this is measured partly (and the sample says so)."""


class JobProbe(Protocol):
    async def observe(self) -> JobsReading: ...


class ProbeError(Exception):
    """A probe could not get an answer; the message is the note the sample carries."""


class StatusEndpointProbe:
    """The node's own status endpoint: GET `url`, take the count a JMESPath expression finds
    (`selfplay_jobs`, `p2p.jobs[0].count`; jmespath.org). A bad expression raises ValueError here."""

    def __init__(self, url: str, path: str = "selfplay_jobs", *, timeout_s: float = 2.0) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError(f"the status URL {url!r} is not an http(s) URL")
        self.url = url
        self.path = path
        self.expression = compile_jobs_path(path)
        self.timeout_s = timeout_s
        self._http: Any = None
        """Made at the first sample, then kept (its connection too, where the node's service keeps it)."""

    async def observe(self) -> JobsReading:
        try:
            if self._http is None:
                self._http = http.client(headers={"Accept": "application/json"})
            async with asyncio.timeout(self.timeout_s):
                status, _, body = await http.get(self._http, self.url, max_bytes=MAX_STATUS_BYTES, error=ProbeError)
            if status != 200:
                raise ProbeError(f"HTTP {status}")
            try:
                document = json.loads(body)
            except (ValueError, UnicodeDecodeError):
                raise ProbeError("answer is not JSON") from None
            running = count_at(document, self.expression, self.path)
        except TimeoutError:
            return JobsReading(errors=(f"status probe {self.url}: no answer within {self.timeout_s:g}s",))
        except ProbeError as exc:
            return JobsReading(errors=(f"status probe {self.url}: {exc}",))
        except OSError as exc:
            return JobsReading(errors=(f"status probe {self.url}: {type(exc).__name__}: {exc.strerror or exc}",))
        return JobsReading(running=running)


class ProcessPatternProbe:
    """Counts the node's processes whose command line matches a regular expression."""

    def __init__(self, pattern: str | re.Pattern[str], processes: ProcessTable) -> None:
        self.pattern = re.compile(pattern) if isinstance(pattern, str) else pattern
        self.processes = processes

    async def observe(self) -> JobsReading:
        return await asyncio.to_thread(self._count)

    def _count(self) -> JobsReading:
        own = os.getpid()
        ignored: list[str] = []
        errors: list[str] = []
        pids = self.processes.pids(errors)
        if errors:
            return JobsReading(errors=tuple(f"process probe: {e}" for e in errors))
        count = 0
        for pid in pids:
            # processes exit while the table is scanned; that is not worth a note
            info = self.processes.describe(pid, ignored)
            if info is not None and pid != own and self.pattern.search(info.command):
                count += 1
        return JobsReading(running=count)


Measure = Callable[[], tuple[int, list[str]]]
"""Returns the total size of the watched outputs in bytes, and notes on what could not be read."""


class OutputGrowthProbe:
    """Whether watched outputs grew since the previous sample. The first sample has no baseline,
    so it says None rather than guess."""

    def __init__(self, measure: Measure) -> None:
        self._measure = measure
        self._last: int | None = None

    @classmethod
    def for_paths(cls, paths: Sequence[Path]) -> OutputGrowthProbe:
        """Over files and directories on disk (a directory counts every file under it)."""
        return cls(lambda: paths_size(paths))

    async def observe(self) -> JobsReading:
        try:
            total, notes = await asyncio.to_thread(self._measure)
        except Exception as exc:
            return JobsReading(errors=(f"output probe: {type(exc).__name__}",))
        last, self._last = self._last, total
        growing = None if last is None else total > last
        return JobsReading(output_growing=growing, errors=tuple(f"output probe: {n}" for n in notes))


ROWS_TABLE = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
ROWS_TIMEOUT_S = 1.0
"""How long a read waits on a writer's lock before the sample says it could not tell."""


class RowGrowthProbe:
    """Whether a job's SQLite tables gained rows since the previous sample (runbook 000's
    `sqlite3 data/games/selfplay.db "SELECT COUNT(*) FROM games"`). A database reuses its free pages,
    so a job writing rows into them grows no file: bytes alone would call it a zombie. Read-only,
    by the table's highest rowid (new rows take higher ones; cheap at any size), its row count
    for a table without rowids. The first sample has no baseline."""

    def __init__(self, tables: Sequence[tuple[Path, str]]) -> None:
        for path, table in tables:
            if not path.is_absolute() or not ROWS_TABLE.fullmatch(table):
                raise ValueError(f"{path}:{table}: give an absolute database path and a table name (letters, digits, _)")
        self.tables = list(tables)
        self._last: dict[tuple[Path, str], int] = {}

    @classmethod
    def parse(cls, entries: Sequence[str]) -> list[JobProbe]:
        """From `PATH:TABLE` entries, e.g. /data/games/selfplay.db:games, and PostgreSQL ones
        (`node_sampler.pgrows`): one probe for each kind there is; ValueError names a bad entry."""
        tables, postgres = [], []
        for entry in entries:
            if pgrows.is_postgres(entry):
                url, table = pgrows.parse(entry)
                if not ROWS_TABLE.fullmatch(table):
                    raise ValueError(f"{table!r}: give a table name (letters, digits, _)")
                postgres.append((url, table))
                continue
            path, sep, table = entry.rpartition(":")
            if not sep:
                raise ValueError(f"{entry!r}: give PATH:TABLE, e.g. /data/games/selfplay.db:games")
            tables.append((Path(path), table))
        return [*([cls(tables)] if tables else []), *([pgrows.PostgresRowsProbe(postgres)] if postgres else [])]

    async def observe(self) -> JobsReading:
        counts, notes = await asyncio.to_thread(self._read)
        grew: bool | None = None
        for where, count in counts.items():
            last, self._last[where] = self._last.get(where), count
            if last is not None:
                grew = grew or count > last
        return JobsReading(output_growing=grew, errors=tuple(f"rows probe: {n}" for n in notes))

    def _read(self) -> tuple[dict[tuple[Path, str], int], list[str]]:
        counts: dict[tuple[Path, str], int] = {}
        notes: list[str] = []
        for path, table in self.tables:
            try:
                counts[(path, table)] = _rows(path, table)
            except sqlite3.Error as exc:
                notes.append(f"{path}:{table}: {str(exc)[:120] or type(exc).__name__}")
        return counts, notes


def _rows(path: Path, table: str) -> int:
    if not path.is_file():
        raise sqlite3.OperationalError("no such database")
    connection = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True, timeout=ROWS_TIMEOUT_S)
    try:
        try:
            (value,) = connection.execute(f'SELECT MAX(rowid) FROM "{table}"').fetchone()
        except sqlite3.OperationalError as exc:
            if "rowid" not in str(exc):
                raise
            (value,) = connection.execute(f'SELECT COUNT(*) FROM "{table}"').fetchone()  # a WITHOUT ROWID table
        return int(value or 0)
    finally:
        connection.close()


def paths_size(paths: Sequence[Path]) -> tuple[int, list[str]]:
    """Total bytes under `paths`; a missing or unreadable one counts 0 and is noted."""
    total = 0
    notes: list[str] = []
    for path in paths:
        try:
            if path.is_dir():
                total += _dir_size(path, notes)
            else:
                total += path.stat().st_size
        except FileNotFoundError:
            notes.append(f"{path}: missing")
        except OSError as exc:
            notes.append(f"{path}: unreadable ({type(exc).__name__})")
    return total, notes


def _dir_size(root: Path, notes: list[str]) -> int:
    total = 0
    seen = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            seen += 1
            if seen > MAX_WALK_FILES:
                notes.append(f"{root}: more than {MAX_WALK_FILES} files, measured partly")
                return total
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:
                continue  # a file rotated away mid-walk
    return total


def compile_jobs_path(path: str) -> Any:
    """The compiled expression; ValueError (naming it) if it is not JMESPath."""
    try:
        return jmespath.compile(path)
    except JMESPathError as exc:
        raise ValueError(f"{path!r} is not a JMESPath expression ({str(exc).splitlines()[0]})") from None


def count_at(document: Any, expression: Any, path: str) -> int:
    """The non-negative integer `expression` finds in the answer; ProbeError says what it found instead."""
    try:
        value = expression.search(document)
    except JMESPathError as exc:
        raise ProbeError(f"{path!r} cannot be read: {str(exc).splitlines()[0]}") from None
    if value is None:
        raise ProbeError(f"no {path!r} in the answer")
    # bool is an int in Python, but `true` is not a job count
    if isinstance(value, bool) or not isinstance(value, int):
        raise ProbeError(f"{path!r} is {type(value).__name__}, not an integer")
    if value < 0:
        raise ProbeError(f"{path!r} is negative ({value})")
    return value
