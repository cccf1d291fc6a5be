"""Alembic environment for the incident store, in the style of Alembic's async template.

There is no alembic.ini: `gpumedic_store.migrate` builds the Config in code and hands the
database URL over as `config.attributes["url"]`. Both backends run through the store's own
engine factory, so SQLite gets its pragmas and an unreachable database raises
StoreUnavailable here too.
"""

from __future__ import annotations

import asyncio
from typing import Any

from alembic import context
from gpumedic_store.engine import create_engine
from gpumedic_store.models import Base, UTCDateTime
from gpumedic_store.settings import StoreSettings
from sqlalchemy.engine import Connection
from sqlalchemy.pool import NullPool

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url")
    return url or StoreSettings().url


def _render_item(type_: str, obj: Any, autogen_context: Any) -> str | bool:
    # Migrations are frozen snapshots: they name the stored type, not the Python decorator.
    if type_ == "type" and isinstance(obj, UTCDateTime):
        return "sa.DateTime(timezone=True)"
    return False


def _configure(**kwargs: Any) -> None:
    url = _url()
    context.configure(
        target_metadata=target_metadata,
        compare_type=True,
        render_item=_render_item,
        # SQLite alters most things by copying the table; batch mode writes that for us.
        render_as_batch=url.startswith("sqlite"),
        **kwargs,
    )


def run_migrations_offline() -> None:
    """Write the SQL to stdout instead of running it (alembic's --sql)."""
    _configure(url=_url(), literal_binds=True, dialect_opts={"paramstyle": "named"})
    with context.begin_transaction():
        context.run_migrations()


def _run_sync(connection: Connection) -> None:
    _configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()


async def _run_async() -> None:
    engine = create_engine(_url(), poolclass=NullPool)
    try:
        async with engine.connect() as connection:
            await connection.run_sync(_run_sync)
            await connection.commit()
    finally:
        await engine.dispose()


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        _run_sync(connection)
        return
    # migrate.py guarantees no event loop runs in this thread.
    asyncio.run(_run_async())


if context.is_offline_mode():
    run_migrations_offline()
else:
    run_migrations_online()
