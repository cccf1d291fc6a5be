"""autoscaler's adapters: remember each node's latest sample, since when its GPUs all idle, and
which nodes are drained (replayed from the node events at start, then followed); read the demand
source and evaluate periodically, and publish."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_events import CapacityEvaluated, NodeDrained, NodeSampled, NodeUndrained

from autoscaler.demand import DemandSource, DemandUnavailable
from autoscaler.logic import evaluate, evaluate_demand
from autoscaler.scaling import Scaler
from autoscaler.settings import Settings

log = logging.getLogger(__name__)


class CapacityHandlers:
    def __init__(self, runtime: ServiceRuntime, settings: Settings, demand: DemandSource | None = None) -> None:
        self._runtime = runtime
        self._settings = settings
        self._demand = demand
        self._scaler = Scaler(settings.scaling)
        self.latest: dict[str, NodeSampled] = {}
        self.idle_since: dict[str, datetime] = {}
        self.drained: set[str] = set()

    async def on_sample(self, sample: NodeSampled) -> None:
        self.latest[sample.node_id] = sample
        if all((g.utilization_gpu_pct or 0) <= self._settings.busy_util_pct for g in sample.gpus):
            self.idle_since.setdefault(sample.node_id, sample.occurred_at)
        else:
            self.idle_since.pop(sample.node_id, None)

    async def on_drain(self, event: NodeDrained | NodeUndrained) -> None:
        if isinstance(event, NodeDrained):
            self.drained.add(event.node_id)
        else:
            self.drained.discard(event.node_id)

    async def evaluate_once(self) -> CapacityEvaluated:
        s, now = self._settings, datetime.now(UTC)
        if self._demand is None:
            return evaluate(
                self.latest, now, busy_util_pct=s.busy_util_pct, up_above=s.scale_up_above, down_below=s.scale_down_below,
                stale_after_s=s.stale_after_s, drained=frozenset(self.drained),
            )
        try:
            reading = await self._demand.read()
        except DemandUnavailable as exc:
            log.warning("no scale decision this round: %s", exc)
            reading = exc
        return evaluate_demand(
            reading, self._scaler, self.latest, now, busy_util_pct=s.busy_util_pct, stale_after_s=s.stale_after_s,
            drained=frozenset(self.drained), idle_since=self.idle_since,
        )

    async def evaluate_loop(self) -> None:
        while True:
            await asyncio.sleep(self._settings.interval_s)
            evaluated = await self.evaluate_once()
            try:
                await publish_event(self._runtime.broker, evaluated)
            except Exception as exc:
                log.warning("capacity evaluation not published (%r); the bus may be reconnecting", exc)
