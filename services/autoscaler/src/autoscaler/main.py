"""autoscaler's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from autoscaler.handlers import CapacityHandlers
from autoscaler.settings import Settings
from gpumedic_bus import ServiceRuntime, subscribe_event_batches
from gpumedic_events import NodeSampled

SERVICE = "autoscaler"


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    handlers = CapacityHandlers(runtime, settings)
    subscribe_event_batches(
        runtime.broker, NodeSampled, handlers.on_samples,
        service=SERVICE, durable="autoscaler-samples", settings=settings.nats, stats=runtime.rejections,
    )
    runtime.background(handlers.evaluate_loop)
    return runtime.app()


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(create_app().run())
