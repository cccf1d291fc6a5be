"""zombie-detector's adapter: node facts (samples over the push consumer, node events over pull
consumers) go to the node-incident logic through the shared detector (`gpumedic_incidents.detector`)."""

from __future__ import annotations

from gpumedic_bus import Delivery, ServiceRuntime
from gpumedic_events import Event
from gpumedic_incidents.detector import Detector
from zombie_detector.logic import SOURCE, NodeIncidents


class DetectorHandlers(Detector):
    def __init__(self, runtime: ServiceRuntime, logic: NodeIncidents) -> None:
        super().__init__(runtime, logic, SOURCE)

    async def on_event(self, event: Event, delivery: Delivery | None = None) -> None:
        """A sample (push consumer, no delivery) or a node event (pull consumer)."""
        await self.decide(lambda now: self.logic.on_event(event, now))
