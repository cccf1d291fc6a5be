"""The e2e fixture that runs services in the test's event loop fails a test whose service crashed:
a teardown that swallowed it let a broken service pass every test that used it."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from tests.fixtures.apps import Apps


class _App:
    def __init__(self, service: str, crash: Exception | None = None) -> None:
        self.runtime = SimpleNamespace(service=service)
        self._crash = crash
        self._stop = asyncio.Event()

    async def run(self) -> None:
        if self._crash is not None:
            raise self._crash
        await self._stop.wait()

    def exit(self) -> None:
        self._stop.set()


async def test_a_service_that_crashed_fails_the_teardown_after_every_other_stopped():
    apps = Apps()
    healthy, broken = _App("remediator"), _App("zombie-detector", RuntimeError("lease lost"))
    for app in (healthy, broken):
        apps.adopt(app, asyncio.create_task(app.run()))
    await asyncio.sleep(0)
    with pytest.raises(AssertionError, match="zombie-detector: RuntimeError: lease lost"):
        await apps.stop_all()
    assert healthy._stop.is_set()


async def test_services_that_stop_cleanly_pass():
    apps = Apps()
    app = _App("report-builder")
    task = asyncio.create_task(app.run())
    apps.adopt(app, task)
    await apps.stop_all()
    assert app._stop.is_set() and task.done() and task.exception() is None
