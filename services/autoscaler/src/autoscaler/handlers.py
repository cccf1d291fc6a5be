"""autoscaler's adapters: remember each node's latest sample and which nodes are drained (replayed
from the node events at start, then followed); evaluate and publish periodically."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_events import NodeDrained, NodeSampled, NodeUndrained
from autoscaler.logic import evaluate
from autoscaler.settings import Settings

log = logging.getLogger(__name__)


class CapacityHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: Settings) -> None:
        self._runtime = runtime
        self._settings = settings
        self.latest: dict[str, NodeSampled] = {}
        self.drained: set[str] = set()

    async def on_sample(self, sample: NodeSampled) -> None:
        self.latest[sample.node_id] = sample

    async def on_drain(self, event: NodeDrained | NodeUndrained) -> None:
        if isinstance(event, NodeDrained):
            self.drained.add(event.node_id)
        else:
            self.drained.discard(event.node_id)

    async def evaluate_loop(self) -> None:
        s = self._settings
        while True:
            await asyncio.sleep(s.interval_s)
            evaluated = evaluate(
                self.latest, datetime.now(UTC), busy_util_pct=s.busy_util_pct,
                up_above=s.scale_up_above, down_below=s.scale_down_below, stale_after_s=s.stale_after_s,
                drained=frozenset(self.drained),
            )
            try:
                await publish_event(self._runtime.broker, evaluated)
            except Exception as exc:
                log.warning("capacity evaluation not published (%r); the bus may be reconnecting", exc)
