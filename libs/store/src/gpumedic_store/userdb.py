"""The user's own task database (not gpumedic's store): the autoscaler reads the queue and the
worker records there, the remediator requeues tasks and marks workers ended with the policy's
statements. Its URL carries a password, so callers read it from a file and it is never shown: the
name and every error say the host (or the SQLite file), never the URL. Statements take bound parameters
only; a list parameter is expanded by the driver (`IN :task_ids`)."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import Any

from sqlalchemy import bindparam, text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import ArgumentError, SQLAlchemyError
from sqlalchemy.ext.asyncio import create_async_engine

from gpumedic_store.settings import ASYNC_DRIVERS


class TaskDatabaseError(Exception):
    """The task database did not answer, or not as expected; the message names it and what failed."""


class TaskDatabase:
    def __init__(self, url: str, where: str, *, timeout_s: float = 5.0) -> None:
        """`where` names what the URL came from (a setting's file), for a ValueError about the URL."""
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise ValueError(f"{where} does not hold a database URL") from None
        parsed = parsed.set(drivername=ASYNC_DRIVERS.get(parsed.drivername, parsed.drivername))
        if parsed.drivername not in set(ASYNC_DRIVERS.values()):
            raise ValueError(f"{where}: {parsed.drivername} is not supported (postgresql or sqlite)")
        self.name = f"task database on {parsed.host or parsed.database or parsed.drivername}"
        self.timeout_s = timeout_s
        self._engine = create_async_engine(parsed, pool_pre_ping=True, connect_args={"timeout": timeout_s})

    async def rows(self, query: str, params: Mapping[str, Any] | None = None) -> list[tuple[Any, ...]]:
        async def run() -> list[tuple[Any, ...]]:
            async with self._engine.connect() as conn:
                return [tuple(r) for r in (await conn.execute(_statement(query, params), dict(params or {}))).all()]

        return await self._timed(run())

    async def execute(self, statement: str, params: Mapping[str, Any]) -> int:
        """Run one write in its own transaction; the rows it changed."""

        async def run() -> int:
            async with self._engine.begin() as conn:
                return (await conn.execute(_statement(statement, params), dict(params))).rowcount

        return await self._timed(run())

    async def _timed(self, work):
        try:
            async with asyncio.timeout(self.timeout_s):  # not wait_for: on 3.11 it can swallow a cancellation
                return await work
        except TimeoutError:
            raise TaskDatabaseError(f"{self.name}: no answer within {self.timeout_s:g}s") from None
        except (SQLAlchemyError, OSError) as exc:
            # The driver's message names what failed (no such table, refused), never the password.
            first = (str(getattr(exc, "orig", None) or exc).strip().splitlines() or [""])[0][:200]
            raise TaskDatabaseError(f"{self.name}: {type(exc).__name__}: {first}") from None

    async def close(self) -> None:
        await self._engine.dispose()


def _statement(sql: str, params: Mapping[str, Any] | None):
    statement = text(sql)
    expanding = [bindparam(k, expanding=True) for k, v in (params or {}).items() if isinstance(v, list | tuple)]
    return statement.bindparams(*expanding) if expanding else statement
