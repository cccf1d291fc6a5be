"""autoscaler's composition root: `create_app` builds everything; `run` is the console script."""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from autoscaler.demand import open_source
from autoscaler.handlers import CapacityHandlers
from autoscaler.settings import Settings
from gpumedic_bus import ServiceRuntime
from gpumedic_bus.topology import REPLAYS

SERVICE = "autoscaler"


def create_app(settings: Settings | None = None) -> FastStream:
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    demand = open_source(settings.demand) if settings.demand else None
    handlers = CapacityHandlers(runtime, settings, demand)
    runtime.replay(REPLAYS[SERVICE], handlers.on_drain)
    runtime.consume_fast("autoscaler-samples", handlers.on_sample)
    runtime.background(handlers.evaluate_loop)
    return runtime.app()


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    asyncio.run(create_app().run())
