"""zombie-detector's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from gpumedic_bus import ServiceRuntime, subscribe_events
from gpumedic_bus.streams import DETECTOR_STATE
from gpumedic_events import ActionCompleted, NodeSampled
from zombie_detector.handlers import DetectorHandlers
from zombie_detector.logic import ZombieDetector
from zombie_detector.settings import Settings

SERVICE = "zombie-detector"


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    handlers = DetectorHandlers(runtime, ZombieDetector(rules=settings.rules()))

    async def _restore() -> None:
        await runtime.broker.connect()
        # Declared with the streams (gpumedic_bus.streams); only opened here.
        await handlers.restore(await runtime.broker.key_value(DETECTOR_STATE.bucket, declare=False))

    runtime.on_startup(_restore)
    runtime.consume_fast(NodeSampled, handlers.on_sample, durable="zombie-detector-samples")
    subscribe_events(
        runtime.broker, ActionCompleted, handlers.on_action_completed,
        service=SERVICE, durable="zombie-detector-actions", settings=settings.nats, stats=runtime.rejections,
    )
    runtime.background(handlers.tick)
    return runtime.app()


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(create_app().run())
