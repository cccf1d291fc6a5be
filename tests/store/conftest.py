"""Every store test runs on both backends: a SQLite file and a real PostgreSQL database."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
from gpumedic_store import create_engine, session_factory, upgrade
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def store_url(request, tmp_path) -> str:
    """An empty database of each backend; PostgreSQL's is created for this test alone."""
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/store/gpumedic.db"
    return request.getfixturevalue("postgres_database")


@pytest.fixture
async def sessions(store_url) -> AsyncIterator[async_sessionmaker[AsyncSession]]:
    """Sessions on a database migrated to head (migrated from inside a running event loop)."""
    upgrade(store_url)
    engine = create_engine(store_url)
    yield session_factory(engine)
    await engine.dispose()
