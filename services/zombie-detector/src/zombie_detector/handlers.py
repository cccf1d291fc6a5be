"""zombie-detector's adapter: node facts (samples over the push consumer, node events over pull
consumers) and the services' heartbeats (how far behind their samples each is) go to the
node-incident logic through the shared detector (`gpumedic_incidents.detector`)."""

from __future__ import annotations

import asyncio

from gpumedic_bus import Delivery, ServiceRuntime
from gpumedic_events import Event
from gpumedic_incidents.detector import Detector
from zombie_detector.node_incidents import SOURCE, NodeIncidents

OWN_LAG_EVERY_S = 1.0
"""How often the detector tells its rules how far behind its own samples it is (its published
heartbeat says so every 5 s; silence is judged each second)."""


class DetectorHandlers(Detector):
    def __init__(self, runtime: ServiceRuntime, logic: NodeIncidents) -> None:
        super().__init__(runtime, logic, SOURCE)

    async def on_event(self, event: Event, delivery: Delivery | None = None) -> None:
        """A sample (push consumer, no delivery) or a node event (pull consumer). A node event is
        acknowledged once what it decided is stored; a sample does not wait (the next one decides
        again), so persisting and publishing a flood of incidents never holds the samples."""
        await self.decide(lambda now: self.logic.on_event(event, now), wait=delivery is not None)

    async def watch_own_lag(self) -> None:
        """Its own lag, as its heartbeat would say it, each second."""
        while True:
            await asyncio.sleep(OWN_LAG_EVERY_S)
            beat = self._runtime.heartbeat_event("ready")
            if beat.lag:  # a standby consumes nothing
                await self.on_event(beat)
