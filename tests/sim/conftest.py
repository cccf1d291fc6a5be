"""A small simulated fleet, started on loopback for each test."""

from __future__ import annotations

import pytest

from gpumedic_sim import SimFleet


@pytest.fixture
async def fleet(tmp_path):
    fleet = SimFleet(2, 2, tmp_path / "fleet")
    await fleet.start()
    yield fleet
    await fleet.stop()
