"""Engines and sessions for the incident store, on SQLite (embedded) or PostgreSQL.

SQLite needs per-connection settings to behave under several writers (WAL, a busy timeout)
and to honour constraints (foreign keys are off by default). Both backends report an
unreachable database in their own words and sometimes with the URL in them; here every
connection failure becomes one `StoreUnavailable` that names the masked URL and the cause.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from sqlalchemy import event
from sqlalchemy.engine import URL, ExceptionContext, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError
from sqlalchemy.ext.asyncio import (
    AsyncEngine,
    AsyncSession,
    async_sessionmaker,
    create_async_engine,
)

from gpumedic_store.settings import async_url, mask_url, url_secrets

log = logging.getLogger(__name__)

SQLITE_BUSY_TIMEOUT_MS = 30_000
"""How long a write waits for another writer: SQLite has one writer at a time, and on a loaded
machine a burst of decisions under the gate lock queues for seconds; failing it would only
redeliver the request later."""
POSTGRES_CONNECT_TIMEOUT_S = 10.0
"""asyncpg waits 60 s by default; a blackholed host should fail a service's start sooner."""


class StoreUnavailable(RuntimeError):
    """The store cannot be reached or opened. The message names the masked URL, never a password."""

    def __init__(self, safe_url: str, cause: str) -> None:
        super().__init__(f"incident store at {safe_url} is unavailable: {cause}")
        self.safe_url = safe_url
        self.cause = cause


def unreadable(exc: DBAPIError) -> str:
    """What the driver said of a store it reached but could not read, with the fix when the
    schema is missing (a store never migrated). Its first line only: no SQL, no parameters."""
    cause = str(exc.orig).splitlines()[0] if exc.orig is not None else type(exc).__name__
    hint = "; run `gpumedic migrate`" if "no such table" in cause or "does not exist" in cause else ""
    return f"{cause}{hint}"


def create_engine(url: str, **engine_options: Any) -> AsyncEngine:
    """An async engine for `url`; SQLite gets WAL, a busy timeout and foreign keys.

    Nothing connects yet. The first connection that fails raises `StoreUnavailable`.
    `engine_options` go to SQLAlchemy's `create_async_engine` (e.g. `poolclass`).
    """
    url = async_url(url)
    safe = mask_url(url)
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise StoreUnavailable(safe, f"not a database URL ({exc})") from None
    backend = parsed.get_backend_name()
    if backend not in ("sqlite", "postgresql"):
        raise StoreUnavailable(safe, f"{backend} is not supported; use sqlite:///FILE or postgresql://USER:PASSWORD@HOST/DB")
    if backend == "sqlite":
        _ensure_sqlite_directory(parsed, safe)
    elif backend == "postgresql":
        # A server restart leaves dead connections in the pool; test each one before use.
        engine_options.setdefault("pool_pre_ping", True)
        if parsed.get_driver_name() == "asyncpg":
            connect_args = engine_options.setdefault("connect_args", {})
            connect_args.setdefault("timeout", POSTGRES_CONNECT_TIMEOUT_S)
    try:
        engine = create_async_engine(parsed, **engine_options)
    except (ImportError, ArgumentError, TypeError, ValueError) as exc:  # a missing driver, a bad option
        raise StoreUnavailable(safe, _scrub(f"{type(exc).__name__}: {exc}", url)) from None
    if backend == "sqlite":
        event.listen(engine.sync_engine, "connect", _configure_sqlite)
    event.listen(engine.sync_engine, "do_connect", _connect_or_unavailable(url, safe))
    event.listen(engine.sync_engine, "handle_error", _unavailable_translator(url, safe))
    log.debug("store engine for %s", safe)
    return engine


def session_factory(engine: AsyncEngine) -> async_sessionmaker[AsyncSession]:
    """Sessions whose objects stay readable after commit (handlers use them after committing)."""
    return async_sessionmaker(engine, expire_on_commit=False)


async def ping(engine: AsyncEngine) -> None:
    """Open one connection now, so a service fails at start rather than at its first event."""
    async with engine.connect() as conn:
        await conn.exec_driver_sql("SELECT 1")


def _ensure_sqlite_directory(url: URL, safe: str) -> None:
    database = url.database or ""
    if database in ("", ":memory:") or database.startswith("file:"):
        return
    parent = Path(database).expanduser().parent
    try:
        parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise StoreUnavailable(safe, f"cannot create directory {parent}: {exc.strerror or exc}") from None


def _configure_sqlite(dbapi_connection: Any, _record: Any) -> None:
    cursor = dbapi_connection.cursor()
    try:
        # WAL lets readers (the UI, the CLI) run while a service writes.
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
        cursor.execute("PRAGMA foreign_keys=ON")
    finally:
        cursor.close()


def _connect_or_unavailable(url: str, safe: str):
    def _connect(dialect: Any, _record: Any, cargs: tuple, cparams: dict) -> Any:
        # SQLAlchemy wraps only DBAPI errors; a refused TCP connection reaches the caller as a
        # bare OSError, an unknown host as socket.gaierror. Every way of failing to connect
        # becomes one error here.
        try:
            return dialect.connect(*cargs, **cparams)
        except Exception as exc:
            raise _unavailable(exc, url, safe) from exc

    return _connect


def _unavailable_translator(url: str, safe: str):
    def _translate(context: ExceptionContext) -> BaseException | None:
        # No connection yet means the failure happened while setting one up (SQLite's pragmas
        # on a file it cannot open); a disconnect means the server went away.
        if context.connection is not None and not context.is_disconnect:
            return None
        return _unavailable(context.original_exception, url, safe)

    return _translate


def _unavailable(exc: BaseException, url: str, safe: str) -> StoreUnavailable:
    if isinstance(exc, StoreUnavailable):
        return exc
    cause = _scrub(f"{type(exc).__name__}: {exc}", url)
    log.debug("store at %s is unavailable: %s", safe, cause)
    return StoreUnavailable(safe, cause)


def _scrub(text: str, url: str) -> str:
    """Drivers may echo connection parameters; keep the password out of what we re-raise."""
    text = " ".join(text.split())
    for secret in url_secrets(url):
        text = text.replace(secret, "***")
    return text
