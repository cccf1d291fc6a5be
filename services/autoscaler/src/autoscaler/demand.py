"""Where the demand for GPUs comes from: the user's own task queue, read once per round.

Two sources, chosen in the settings (`GPUMEDIC_AUTOSCALER_DEMAND`, JSON with a `kind`):

- `sql`: a query on the user's task table that returns `(status, count)` rows; the runbook's
  statuses `Queued` and `In Progress` are the defaults, others (Complete, Failed) are ignored.
  The database URL holds a password, so it is read from a file and never shown (errors name the
  host only).
- `http`: a GET that answers JSON, and a dotted path to the queued count (and optionally one to
  the in-progress count).

A reading that cannot be trusted (the source down or slow, a row that is not `(status, count)`,
a count that is negative or not a number) raises `DemandUnavailable` saying which source and
what was wrong: no scale decision is made on it.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import httpx
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from gpumedic_webhook import read_token

DEFAULT_QUERY = "SELECT status, COUNT(*) FROM tasks GROUP BY status"
ASYNC_DRIVERS = {"postgresql": "postgresql+asyncpg", "sqlite": "sqlite+aiosqlite"}
"""A plain URL's driver, and the asyncio driver used for it (installed with the store)."""


class DemandUnavailable(Exception):
    """No trustworthy reading; the message says which source and why."""


class Demand(BaseModel):
    model_config = ConfigDict(frozen=True)

    queued: int = Field(ge=0)
    in_progress: int = Field(ge=0)


class DemandSource(Protocol):
    name: str

    async def read(self) -> Demand: ...

    async def close(self) -> None: ...


# --- configuration -------------------------------------------------------------------------------


class _Config(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    timeout_s: float = Field(default=5.0, gt=0, le=60)


class SqlDemandConfig(_Config):
    kind: Literal["sql"]
    url_file: Path = Field(description="A file holding the SQLAlchemy URL of the task database (it carries a password).")
    query: str = Field(default=DEFAULT_QUERY, min_length=1, max_length=4000, description="Returns (status, count) rows.")
    queued: tuple[str, ...] = ("Queued",)
    in_progress: tuple[str, ...] = ("In Progress",)


class HttpDemandConfig(_Config):
    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://", max_length=2000)
    queued_path: str = Field(min_length=1, max_length=200, description="Dotted path to the queued count, e.g. queue.depth")
    in_progress_path: str | None = Field(default=None, max_length=200)


DemandConfig = Annotated[SqlDemandConfig | HttpDemandConfig, Field(discriminator="kind")]


# --- sources -------------------------------------------------------------------------------------


class SqlDemand:
    def __init__(self, config: SqlDemandConfig) -> None:
        self.config = config
        try:
            url = make_url(read_token(config.url_file, "demand url_file"))
        except ArgumentError:
            raise ValueError(f"demand url_file {config.url_file} does not hold a database URL") from None
        url = url.set(drivername=ASYNC_DRIVERS.get(url.drivername, url.drivername))
        if url.drivername not in ASYNC_DRIVERS.values():
            raise ValueError(f"demand url_file {config.url_file}: {url.drivername} is not supported (postgresql or sqlite)")
        self.name = f"sql task table on {url.host or url.database or url.drivername}"
        self._engine = create_async_engine(url, pool_pre_ping=True, connect_args={"timeout": config.timeout_s})

    async def read(self) -> Demand:
        try:
            rows = await asyncio.wait_for(self._rows(), self.config.timeout_s)
        except TimeoutError:
            raise DemandUnavailable(f"{self.name}: no answer within {self.config.timeout_s:g}s") from None
        counts: dict[str, int] = {}
        for i, row in enumerate(rows, 1):
            if len(row) != 2 or not isinstance(row[0], str) or not _count(row[1]):
                raise DemandUnavailable(f"{self.name}: row {i} is not (status, count): {tuple(row)!r:.100}")
            counts[row[0]] = counts.get(row[0], 0) + int(row[1])
        return Demand(
            queued=sum(counts.get(s, 0) for s in self.config.queued),
            in_progress=sum(counts.get(s, 0) for s in self.config.in_progress),
        )

    async def _rows(self) -> list[tuple[Any, ...]]:
        try:
            async with self._engine.connect() as conn:
                return [tuple(r) for r in (await conn.execute(text(self.config.query))).all()]
        except (SQLAlchemyError, OSError) as exc:
            # The driver's message names what failed (no such table, refused), never the password.
            first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0][:200]
            raise DemandUnavailable(f"{self.name}: {type(exc).__name__}: {first}") from None

    async def close(self) -> None:
        await self._engine.dispose()


class HttpDemand:
    def __init__(self, config: HttpDemandConfig, client: httpx.AsyncClient | None = None) -> None:
        self.config = config
        self.name = f"HTTP demand at {httpx.URL(config.url).host}"
        self._client = client or httpx.AsyncClient(timeout=config.timeout_s, follow_redirects=False)

    async def read(self) -> Demand:
        try:
            response = await self._client.get(self.config.url)
        except httpx.TimeoutException:
            raise DemandUnavailable(f"{self.name}: no answer within {self.config.timeout_s:g}s") from None
        except httpx.HTTPError as exc:
            raise DemandUnavailable(f"{self.name}: unreachable ({type(exc).__name__})") from None
        if response.status_code != 200:
            raise DemandUnavailable(f"{self.name}: answered HTTP {response.status_code}")
        try:
            document = response.json()
        except ValueError:
            raise DemandUnavailable(f"{self.name}: the answer is not JSON") from None
        queued = self._at(document, self.config.queued_path)
        in_progress = self._at(document, self.config.in_progress_path) if self.config.in_progress_path else 0
        return Demand(queued=queued, in_progress=in_progress)

    def _at(self, document: object, path: str) -> int:
        value = document
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise DemandUnavailable(f"{self.name}: no {path!r} in the answer")
            value = value[key]
        if not _count(value):
            raise DemandUnavailable(f"{self.name}: {path} is {value!r:.60}, not a count")
        return int(value)

    async def close(self) -> None:
        await self._client.aclose()


def _count(value: object) -> bool:
    """A non-negative whole number (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def open_source(config: DemandConfig) -> DemandSource:
    """The source a configuration names; ValueError says what in it is unusable."""
    return SqlDemand(config) if isinstance(config, SqlDemandConfig) else HttpDemand(config)
