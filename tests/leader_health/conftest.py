"""The leader-health tests' runbook cluster (tests/leader_health/runbook_daemon.py), started per test."""

from __future__ import annotations

import pytest

from tests.leader_health.runbook_daemon import RunbookCluster


@pytest.fixture
async def cluster():
    c = RunbookCluster()
    urls = await c.start()
    yield c, urls
    await c.stop()
