"""Where the demand for GPUs comes from: the user's own task queue, read once per round.

Two sources, chosen in the settings (`GPUMEDIC_AUTOSCALER_DEMAND`, JSON with a `kind`):

- `sql`: a query on the user's task table that returns `(status, count)` rows; the runbook's
  statuses `Queued` and `In Progress` are the defaults, others (Complete, Failed) are ignored.
  Optional queries read the worker records and the tasks in progress (the worker checks) and how
  each worker's finished tasks ended (`outcomes_query`: black holes, `autoscaler.outcomes`).
  The database URL holds a password, so it is read from a file and never shown (errors name the
  host only).
- `http`: a GET that answers JSON, and a dotted path to the queued count (and optionally one to
  the in-progress count).
- `jetstream`: a durable consumer on the user's own NATS JetStream work queue: its messages not
  yet delivered are queued, those delivered and not yet acknowledged are in progress.

A reading that cannot be trusted (the source down or slow, a row that is not `(status, count)`,
a count that is negative or not a number) raises `DemandUnavailable` saying which source and
what was wrong: no scale decision is made on it.
"""

from __future__ import annotations

import re
import asyncio
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol

import httpx
import nats
from nats.errors import Error as NatsError
from nats.js.errors import NotFoundError
from pydantic import BaseModel, ConfigDict, Field

from autoscaler.lifecycle import TaskRecord, WorkerRecord
from autoscaler.outcomes import Outcomes
from gpumedic_events import TASK_ID_PATTERN, WORKER_ID_PATTERN
from gpumedic_store import TaskDatabase, TaskDatabaseError
from gpumedic_webhook import read_token

DEFAULT_QUERY = "SELECT status, COUNT(*) FROM tasks GROUP BY status"
WORKER_ID, TASK_ID = re.compile(WORKER_ID_PATTERN), re.compile(TASK_ID_PATTERN)


class DemandUnavailable(Exception):
    """No trustworthy reading; the message says which source and why."""


class Demand(BaseModel):
    model_config = ConfigDict(frozen=True)

    queued: int = Field(ge=0)
    in_progress: int = Field(ge=0)
    complete: int | None = Field(default=None, ge=0, description="Tasks done so far (for $/task); None: not known.")


class DemandSource(Protocol):
    name: str

    async def read(self) -> Demand: ...

    async def records(self) -> tuple[list[WorkerRecord], list[TaskRecord]] | None: ...

    async def outcomes(self) -> list[Outcomes] | None: ...

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
    complete: tuple[str, ...] = ("Complete",)
    workers_query: str | None = Field(
        default=None, min_length=1, max_length=4000,
        description="Returns (worker_id, status, heartbeat_at) rows: the worker records, for the worker checks.",
    )
    in_progress_query: str | None = Field(
        default=None, min_length=1, max_length=4000, description="Returns (task_id, worker_id) rows of the tasks In Progress."
    )
    outcomes_query: str | None = Field(
        default=None, min_length=1, max_length=4000,
        description="Returns (worker_id, status, count) rows of the tasks finished lately (its window is the query's, e.g. the "
        "last hour): how each worker's tasks ended, for black holes.",
    )
    failed: tuple[str, ...] = ("Failed",)


class HttpDemandConfig(_Config):
    kind: Literal["http"]
    url: str = Field(pattern=r"^https?://", max_length=2000)
    queued_path: str = Field(min_length=1, max_length=200, description="Dotted path to the queued count, e.g. queue.depth")
    in_progress_path: str | None = Field(default=None, max_length=200)
    complete_path: str | None = Field(default=None, max_length=200, description="Dotted path to the count of tasks done.")


class JetStreamDemandConfig(_Config):
    kind: Literal["jetstream"]
    url: str = Field(pattern=r"^(nats|tls)://", max_length=2000, description="The user's NATS server (not gpumedic's bus).")
    stream: str = Field(pattern=r"^[A-Za-z0-9_-]{1,255}$")
    consumer: str = Field(pattern=r"^[A-Za-z0-9_-]{1,255}$", description="The durable consumer the workers pull tasks from.")
    user: str | None = Field(default=None, max_length=200)
    password_file: Path | None = Field(default=None, description="A file holding the user's password.")


DemandConfig = Annotated[SqlDemandConfig | HttpDemandConfig | JetStreamDemandConfig, Field(discriminator="kind")]


# --- sources -------------------------------------------------------------------------------------


class SqlDemand:
    def __init__(self, config: SqlDemandConfig) -> None:
        self.config = config
        where = f"demand url_file {config.url_file}"
        self.db = TaskDatabase(read_token(config.url_file, "demand url_file"), where, timeout_s=config.timeout_s)
        self.name = f"sql {self.db.name}"

    async def read(self) -> Demand:
        counts: dict[str, int] = {}
        for i, row in enumerate(await self._rows(self.config.query), 1):
            if len(row) != 2 or not isinstance(row[0], str) or not _count(row[1]):
                raise DemandUnavailable(f"{self.name}: row {i} is not (status, count): {tuple(row)!r:.100}")
            counts[row[0]] = counts.get(row[0], 0) + int(row[1])
        return Demand(
            queued=sum(counts.get(s, 0) for s in self.config.queued),
            in_progress=sum(counts.get(s, 0) for s in self.config.in_progress),
            complete=sum(counts.get(s, 0) for s in self.config.complete),
        )

    async def records(self) -> tuple[list[WorkerRecord], list[TaskRecord]] | None:
        """The worker records and the tasks in progress, for the worker checks; None when the
        configuration names no queries for them. DemandUnavailable when they cannot be trusted."""
        if self.config.workers_query is None or self.config.in_progress_query is None:
            return None
        workers = []
        for i, row in enumerate(await self._rows(self.config.workers_query), 1):
            if len(row) != 3 or not _id(row[0], WORKER_ID) or not isinstance(row[1], str) or not (row[2] is None or _when(row[2])):
                raise DemandUnavailable(f"{self.name}: workers row {i} is not (worker_id, status, heartbeat_at): {tuple(row)!r:.100}")
            workers.append(WorkerRecord(str(row[0]), row[1], _when(row[2]) if row[2] is not None else None))
        tasks = []
        for i, row in enumerate(await self._rows(self.config.in_progress_query), 1):
            if len(row) != 2 or not _id(row[0], TASK_ID) or not (row[1] is None or _id(row[1], WORKER_ID)):
                raise DemandUnavailable(f"{self.name}: in-progress row {i} is not (task_id, worker_id): {tuple(row)!r:.100}")
            tasks.append(TaskRecord(str(row[0]), None if row[1] is None else str(row[1])))
        return workers, tasks

    async def outcomes(self) -> list[Outcomes] | None:
        """How each worker's finished tasks ended (`complete` and `failed` statuses; others are not
        counted); None when no outcomes_query is set. DemandUnavailable when they cannot be trusted."""
        if self.config.outcomes_query is None:
            return None
        counts: dict[str, list[int]] = {}
        for i, row in enumerate(await self._rows(self.config.outcomes_query), 1):
            if len(row) != 3 or not _id(row[0], WORKER_ID) or not isinstance(row[1], str) or not _count(row[2]):
                raise DemandUnavailable(f"{self.name}: outcomes row {i} is not (worker_id, status, count): {tuple(row)!r:.100}")
            done_failed = counts.setdefault(str(row[0]), [0, 0])
            if row[1] in self.config.complete:
                done_failed[0] += int(row[2])
            elif row[1] in self.config.failed:
                done_failed[1] += int(row[2])
        return [Outcomes(worker, done, failed) for worker, (done, failed) in sorted(counts.items())]

    async def _rows(self, query: str) -> list[tuple[Any, ...]]:
        try:
            return await self.db.rows(query)
        except TaskDatabaseError as exc:
            raise DemandUnavailable(f"sql {exc}") from None

    async def close(self) -> None:
        await self.db.close()


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
        complete = self._at(document, self.config.complete_path) if self.config.complete_path else None
        return Demand(queued=queued, in_progress=in_progress, complete=complete)

    def _at(self, document: object, path: str) -> int:
        value = document
        for key in path.split("."):
            if not isinstance(value, dict) or key not in value:
                raise DemandUnavailable(f"{self.name}: no {path!r} in the answer")
            value = value[key]
        if not _count(value):
            raise DemandUnavailable(f"{self.name}: {path} is {value!r:.60}, not a count")
        return int(value)

    async def records(self) -> None:
        """An HTTP queue says nothing about worker records: the worker checks run on the provider only."""
        return None

    async def outcomes(self) -> None:
        """Nor about how each worker's tasks ended: no black holes are judged."""
        return None

    async def close(self) -> None:
        await self._client.aclose()


class JetStreamDemand:
    def __init__(self, config: JetStreamDemandConfig) -> None:
        self.config = config
        self.name = f"JetStream consumer {config.stream}/{config.consumer}"
        self._password = read_token(config.password_file, "demand password_file") if config.password_file else None
        self._nc: nats.NATS | None = None

    async def read(self) -> Demand:
        try:
            if self._nc is None or not self._nc.is_connected:
                self._nc = await asyncio.wait_for(nats.connect(
                    self.config.url, user=self.config.user, password=self._password, connect_timeout=self.config.timeout_s,
                    allow_reconnect=False, error_cb=_quiet,
                ), self.config.timeout_s)
            info = await self._nc.jetstream(timeout=self.config.timeout_s).consumer_info(self.config.stream, self.config.consumer)
        except NotFoundError:
            raise DemandUnavailable(f"{self.name}: no such stream or consumer") from None
        except (NatsError, OSError, TimeoutError) as exc:
            raise DemandUnavailable(f"{self.name}: unreachable ({type(exc).__name__})") from None
        return Demand(queued=info.num_pending or 0, in_progress=info.num_ack_pending or 0)

    async def records(self) -> None:
        """A work queue says nothing about worker records: the worker checks run on the provider only."""
        return None

    async def outcomes(self) -> None:
        """Nor about how each worker's tasks ended: no black holes are judged."""
        return None

    async def close(self) -> None:
        if self._nc is not None:
            await self._nc.close()


async def _quiet(_exc: Exception) -> None:
    """nats-py logs every failed connect; the reading's DemandUnavailable says it once."""


def _id(value: object, pattern: re.Pattern[str]) -> bool:
    """An id that can be named in an action (a worker's is also its incidents' node id)."""
    return isinstance(value, str | int) and not isinstance(value, bool) and bool(pattern.fullmatch(str(value)))


def _when(value: object) -> datetime | None:
    """A heartbeat time: a datetime or an ISO text (SQLite keeps text); naive means UTC."""
    if isinstance(value, str):
        try:
            value = datetime.fromisoformat(value)
        except ValueError:
            return None
    if not isinstance(value, datetime):
        return None
    return value if value.tzinfo else value.replace(tzinfo=UTC)


def _count(value: object) -> bool:
    """A non-negative whole number (a bool is not one)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def open_source(config: DemandConfig) -> DemandSource:
    """The source a configuration names; ValueError says what in it is unusable."""
    if isinstance(config, SqlDemandConfig):
        return SqlDemand(config)
    return HttpDemand(config) if isinstance(config, HttpDemandConfig) else JetStreamDemand(config)
