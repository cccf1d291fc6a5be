"""Whether a job's PostgreSQL tables gained rows since the previous sample: runbook 000's game count
where the games go to PostgreSQL rather than SQLite (`WATCH_ROWS` entries `postgresql://...:TABLE`).

It reads the server's own insert counter of the table (`pg_stat_user_tables.n_tup_ins`), never
counts rows: cheap on a table of any size, and it grows with every row written, whether or not
the table grows on disk. The server publishes its statistics within about a second of a commit,
well inside a sample's interval. The URL carries no password (the entry is configuration a
process list may show): libpq's own ways give it, `~/.pgpass` or `PGPASSFILE`. The driver,
asyncpg, is an extra of node-sampler (`gpumedic-node-sampler[postgres]`): a GPU node needs no
database driver unless it watches such a table.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence
from urllib.parse import parse_qsl, urlsplit

from gpumedic_events.redact import redact

from node_sampler.readings import JobsReading

PG_SCHEMES = ("postgresql://", "postgres://")
TIMEOUT_S = 2.0
COUNTER = "SELECT COALESCE(SUM(n_tup_ins), 0) FROM pg_stat_user_tables WHERE relname = $1"


def is_postgres(entry: str) -> bool:
    return entry.startswith(PG_SCHEMES)


def parse(entry: str) -> tuple[str, str]:
    """(database URL, table) of a `postgresql://USER@HOST[:PORT]/DB:TABLE` entry; ValueError says what is wrong."""
    if importlib.util.find_spec("asyncpg") is None:
        raise ValueError(f"{_shown(entry)}: a PostgreSQL table needs the driver: install gpumedic-node-sampler[postgres]")
    url, sep, table = entry.rpartition(":")
    parts = urlsplit(url)
    if not sep or not parts.hostname or not parts.path.strip("/"):
        raise ValueError(f"{_shown(entry)}: give postgresql://USER@HOST[:PORT]/DATABASE:TABLE")
    if parts.password is not None or _password_in_query(parts.query):
        raise ValueError(f"{_shown(entry)}: put no password in the URL; give it in ~/.pgpass or PGPASSFILE")
    return url, table


def _password_in_query(query: str) -> bool:
    """libpq takes its parameters from the query too (`?password=...`, `&sslpassword=...`)."""
    return any("password" in key.lower() for key, _ in parse_qsl(query, keep_blank_values=True))


class PostgresRowsProbe:
    def __init__(self, tables: Sequence[tuple[str, str]]) -> None:
        self.tables = list(tables)
        self._last: dict[tuple[str, str], int] = {}

    async def observe(self) -> JobsReading:
        import asyncpg  # here, not at the top: see the module's docstring

        grew: bool | None = None
        notes: list[str] = []
        for url, table in self.tables:
            try:
                connection = await asyncpg.connect(url, timeout=TIMEOUT_S, command_timeout=TIMEOUT_S)
                try:
                    count = int(await connection.fetchval(COUNTER, table))
                finally:
                    await connection.close(timeout=TIMEOUT_S)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                notes.append(f"{_where(url)}:{table}: {type(exc).__name__}: {str(exc)[:120]}")
                continue
            last, self._last[(url, table)] = self._last.get((url, table)), count
            if last is not None:
                grew = grew or count > last
        return JobsReading(output_growing=grew, errors=tuple(f"rows probe: {n}" for n in notes))


def _where(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.hostname}{f':{parts.port}' if parts.port else ''}{parts.path}"


def _shown(entry: str) -> str:
    """An entry as an error may show it: its user info masked, its query left out (either may hold a password)."""
    url, _, table = entry.rpartition(":")
    base, query, _ = url.partition("?")
    return repr(redact(f"{base}{'?...' if query else ''}:{table}"))
