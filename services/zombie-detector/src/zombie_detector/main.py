"""zombie-detector's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from gpumedic_bus import ServiceRuntime
from gpumedic_bus.streams import INCIDENT_STATE
from gpumedic_incidents import IncidentStates
from zombie_detector.handlers import DetectorHandlers
from zombie_detector.logic import SOURCE as SERVICE
from zombie_detector.logic import ZombieDetector
from zombie_detector.settings import Settings


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    handlers = DetectorHandlers(runtime, ZombieDetector(rules=settings.rules()))

    async def _restore() -> None:
        await runtime.broker.connect()
        # Provisioned with the streams (gpumedic provision); only opened here.
        kv = await runtime.broker.key_value(INCIDENT_STATE.bucket, declare=False)
        await handlers.restore(IncidentStates(kv))

    runtime.on_startup(_restore)
    runtime.consume_fast("zombie-detector-samples", handlers.on_sample)
    runtime.consume("zombie-detector-actions", handlers.on_action_completed)
    runtime.background(handlers.tick)
    return runtime.app()


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(create_app().run())
