"""zombie-detector's composition root: `create_app` builds everything; `run` is the console script.

The service is the node-incident detector: every rule over node samples and node events (the
zombie job was its first), fed through one incident book.
"""

from __future__ import annotations

import asyncio
import logging
import sys

from faststream import FastStream

from gpumedic_bus import ServiceRuntime
from gpumedic_bus.streams import INCIDENT_STATE
from gpumedic_bus.topology import NODE_INCIDENT_INPUTS, REPLAYS
from gpumedic_incidents import IncidentStates, Policy, PolicyError
from zombie_detector.handlers import DetectorHandlers
from zombie_detector.logic import SOURCE as SERVICE
from zombie_detector.logic import NodeIncidents
from zombie_detector.settings import Settings


def create_app(settings: Settings | None = None, *, policy: Policy | None = None) -> FastStream:
    """`policy` overrides the policy file (tests)."""
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    handlers = DetectorHandlers(runtime, NodeIncidents(policy or settings.policy.load()))

    async def _restore() -> None:
        await runtime.broker.connect()
        # Provisioned with the streams (gpumedic provision); only opened here.
        kv = await runtime.broker.key_value(INCIDENT_STATE.bucket, declare=False)
        await handlers.restore(IncidentStates(kv))

    runtime.on_startup(_restore)
    runtime.replay(REPLAYS[SERVICE], handlers.on_silence)
    runtime.consume_fast("zombie-detector-samples", handlers.on_event)
    runtime.consume("zombie-detector-actions", handlers.on_action_completed)
    for event_type in NODE_INCIDENT_INPUTS:
        runtime.consume(f"zombie-detector-{event_type.__name__}", handlers.on_event)
    runtime.background(handlers.tick)
    return runtime.app()


def run() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = Settings()
        policy = settings.policy.load()
    except (PolicyError, ValueError) as exc:
        sys.exit(f"gpumedic-zombie-detector: {exc}")
    asyncio.run(create_app(settings, policy=policy).run())
