"""zombie-detector's adapter: node facts (samples over the push consumer, node events over pull
consumers) and the services' heartbeats (how far behind their samples each is) go to the
node-incident logic through the shared detector (`gpumedic_incidents.detector`)."""

from __future__ import annotations

import asyncio

from gpumedic_bus import Delivery, ServiceRuntime
from gpumedic_events import ConsumerLag, Event, ServiceHeartbeat
from gpumedic_incidents.detector import Detector
from zombie_detector.logic import SOURCE, NodeIncidents

OWN_LAG_EVERY_S = 1.0
"""How often the detector tells its rules how far behind its own samples it is (its published
heartbeat says so every 5 s; silence is judged each second)."""


class DetectorHandlers(Detector):
    def __init__(self, runtime: ServiceRuntime, logic: NodeIncidents) -> None:
        super().__init__(runtime, logic, SOURCE)

    async def on_event(self, event: Event, delivery: Delivery | None = None) -> None:
        """A sample (push consumer, no delivery) or a node event (pull consumer)."""
        await self.decide(lambda now: self.logic.on_event(event, now))

    async def watch_own_lag(self) -> None:
        """Its own lag, as its heartbeat would say it, each second."""
        runtime = self._runtime
        while True:
            await asyncio.sleep(OWN_LAG_EVERY_S)
            lags = tuple(ConsumerLag(durable=lag.durable, pending=lag.pending, behind_s=lag.behind_s) for lag in runtime.lags())
            if lags:
                await self.on_event(ServiceHeartbeat(source=SOURCE, service=SOURCE, instance_id=runtime.instance_id, state="ready", lag=lags))
