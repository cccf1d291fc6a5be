"""End-to-end fixtures: a simulated fleet, a migrated SQLite store, and services started from
their real factories (in this process, or as child processes exactly as `gpumedic up` starts them)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import subprocess
from pathlib import Path

import nats
import pytest

from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic.stack import service_command
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import Event
from gpumedic_store.migrate import upgrade
from tests.fixtures.apps import Apps


@pytest.fixture
async def store_url(tmp_path) -> str:
    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    return url


@pytest.fixture
async def fleet(tmp_path):
    """The shared fleet's two nodes with one GPU each (the end-to-end tests' shape)."""
    fleet = SimFleet(2, 1, tmp_path / "fleet")
    await fleet.start()
    yield fleet
    await fleet.stop()


@contextlib.asynccontextmanager
async def fleet_publishing(tmp_path: Path, nodes: int, gpus: int, nats_url: str):
    """A started simulated fleet and a `publish` into JetStream for its samplers; both closed at the end."""
    fleet = SimFleet(nodes, gpus, tmp_path / "fleet")
    await fleet.start()
    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def publish(event: Event) -> None:
        await js.publish(event.subject, event.to_json())

    try:
        yield fleet, publish
    finally:
        await nc.close()
        await fleet.stop()


@contextlib.asynccontextmanager
async def samplers_running(fleet: SimFleet, publish, interval_s: float = 0.2):
    """The fleet's samplers publishing through `publish` while the block runs."""
    task = asyncio.create_task(fleet.run_samplers(publish, interval_s))
    try:
        yield task
    finally:
        await stop_tasks([task])


@pytest.fixture
async def sampling(fleet, nats_url):
    """The fleet's samplers publishing every 0.2 s into JetStream."""
    nc = await nats.connect(nats_url)
    js = nc.jetstream()

    async def publish(event: Event) -> None:
        await js.publish(event.subject, event.to_json())

    async with samplers_running(fleet, publish):
        yield
    await nc.close()


@pytest.fixture
async def apps():
    apps = Apps()
    yield apps
    await apps.stop_all()


def start_service_process(service: str, env: dict[str, str], log: Path) -> subprocess.Popen:
    """Start a service as `gpumedic up` does: its own process, settings from the environment."""
    with open(log, "ab") as out:
        return subprocess.Popen(
            service_command(service), env={**os.environ, **env}, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
