"""autoscaler's adapters: remember each node's latest load (`NodeLoad`), since when its GPUs all idle, and
which nodes are drained (replayed from the node events at start, then followed); each round read
the queue, the provider's workers and the open incidents, decide, and publish.

With a provider and a demand source configured, the round goes through the pool's incidents (the
shared detector: persist, publish, and the remediator's gate for every spawn, termination and
requeue). Without them the decision is published and nothing is done about it, and the round
looks for repeat offenders among the nodes only. Either way every incident opened is counted
against its host (`autoscaler.offenders`)."""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_events import CapacityEvaluated, IncidentMarked, IncidentOpened, IncidentResolved, NodeDrained, NodeUndrained
from gpumedic_events.views import SampleLoad
from gpumedic_incidents import FLEET_NODE
from gpumedic_incidents.detector import Detector
from gpumedic_providers.base import Provider, ProviderError

from autoscaler.demand import DemandSource, DemandUnavailable
from autoscaler.capacity import evaluate, evaluate_demand
from autoscaler.pool import SOURCE, FleetView, HostIncidents, PoolIncidents, Reading
from autoscaler.scaling import NodeLoad, Scaler
from autoscaler.settings import Settings

log = logging.getLogger(__name__)


class CapacityHandlers:
    def __init__(
        self,
        runtime: ServiceRuntime,
        settings: Settings,
        detector: Detector,
        demand: DemandSource | None = None,
        provider: Provider | None = None,
        *,
        behind_after_s: float = 10.0,
    ) -> None:
        self._runtime = runtime
        self._settings = settings
        self._demand = demand
        self._provider = provider
        self._detector = detector
        """The pool's incidents (PoolIncidents, with a provider and a demand source), else the hosts' (HostIncidents)."""
        self._scaler = Scaler(settings.scaling)
        """The decision without a provider (the pool's incidents keep their own)."""
        self.latest: dict[str, NodeLoad] = {}
        self.idle_since: dict[str, datetime] = {}
        self.drained: set[str] = set()
        self._behind_after_s = behind_after_s
        self._was_behind = False

    async def on_sample(self, sample: SampleLoad) -> None:
        if isinstance(self._detector.logic, PoolIncidents):
            self._detector.logic.trials.on_sample(sample)
        load = self.latest[sample.node_id] = NodeLoad.of(sample)
        if not load.busy(self._settings.busy_util_pct):
            self.idle_since.setdefault(sample.node_id, sample.occurred_at)
        else:
            self.idle_since.pop(sample.node_id, None)

    async def on_incident(self, event: IncidentOpened | IncidentResolved | IncidentMarked) -> None:
        """Every incident opened, counted against its host unless found while the control plane was
        behind, or marked false by a person (replayed at start, then followed)."""
        offenders = self._detector.logic.offenders  # type: ignore[attr-defined]
        if isinstance(event, IncidentOpened):
            offenders.on_opened(event)
        elif isinstance(event, IncidentResolved):
            offenders.on_resolved(event)
        else:
            offenders.on_marked(event)

    async def on_drain(self, event: NodeDrained | NodeUndrained) -> None:
        if isinstance(event, NodeDrained):
            self.drained.add(event.node_id)
        else:
            self.drained.discard(event.node_id)

    async def evaluate_once(self) -> CapacityEvaluated:
        if (held := self._held_behind()) is not None:
            return held
        if isinstance(self._detector.logic, PoolIncidents):
            return await self._pool_round()
        evaluated = await self._decision()
        logic: HostIncidents = self._detector.logic  # type: ignore[assignment]
        fleet = FleetView(latest=self.latest)
        await self._detector.decide(lambda now: logic.on_round(fleet, now))
        return evaluated

    def _held_behind(self) -> CapacityEvaluated | None:
        """While its samples consumer is behind, no round: what the samples did not show yet (a node
        busy again, an idle one gone) is no ground to rent, end or judge a worker. Once caught up,
        every idle clock starts afresh. zombie-detector says so in a control_plane_behind incident."""
        worst = max(self._runtime.lags(), key=lambda lag: lag.behind_s, default=None)
        if worst is not None and worst.behind(self._behind_after_s):
            self._was_behind = True
            gpus = [u for load in self.latest.values() for u in load.gpus]
            return CapacityEvaluated(
                source=SOURCE, nodes_seen=len(self.latest), gpus_total=len(gpus), gpus_busy=sum(u > self._settings.busy_util_pct for u in gpus),
                decision="hold", reason=f"samples {worst.behind_s:.0f}s behind ({worst.pending:,} waiting): no scaling, and no worker "
                "judged, on what they have not shown yet",
            )
        if self._was_behind and worst is not None and not worst.behind(self._behind_after_s / 2):
            now = datetime.now(UTC)
            self.idle_since = dict.fromkeys(self.idle_since, now)
            self._was_behind = False
        return None

    async def _decision(self) -> CapacityEvaluated:
        """The decision published without a worker pool to manage."""
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

    async def _pool_round(self) -> CapacityEvaluated:
        assert self._demand is not None and self._provider is not None
        reading = Reading(
            demand=await _read(self._demand.read()),
            workers=await _read(self._provider.workers()),
            records=await _read(self._demand.records()),
            outcomes=await _read(self._demand.outcomes()),
        )
        for failed in (reading.demand, reading.workers, reading.records, reading.outcomes):
            if isinstance(failed, Exception):
                log.warning("no decision on this: %s", failed)
        fleet = FleetView(
            latest=self.latest, idle_since=self.idle_since, drained=frozenset(self.drained), needs_person=await self._needs_person(),
        )
        logic: PoolIncidents = self._detector.logic  # type: ignore[assignment]
        evaluated: list[CapacityEvaluated] = []

        def decide(now: datetime):
            result, transitions = logic.on_round(reading, fleet, now)
            evaluated.append(result)
            return transitions

        await self._detector.decide(decide)
        return evaluated[0]

    async def _needs_person(self) -> dict[str, str]:
        """Nodes with another detector's incident that a person must look at (escalated, or a node
        it drained): no capacity while it lasts. Unreadable: none (the round still decides on the
        provider's and the queue's word, and the drains it follows from the bus)."""
        states = self._detector.states
        if states is None:
            return {}
        try:
            incidents = await states.load_all()
        except Exception as exc:  # the bucket may be reconnecting
            log.warning("open incidents not read this round (%r)", exc)
            return {}
        return {
            i.node_id: f"{i.kind.value} incident {i.incident_id} waits for a person"
            for i in incidents
            if i.detector != SOURCE and i.node_id != FLEET_NODE and (i.phase == "escalated" or i.drained)
        }

    async def evaluate_loop(self) -> None:
        last = None
        while True:
            await asyncio.sleep(self._settings.interval_s)
            try:
                evaluated = await self.evaluate_once()
            except Exception:  # the bus or the state bucket; the next round decides again
                log.exception("this round's capacity was not decided; the next round decides again")
                continue
            if evaluated.decision != last:  # the log shows each turn and why, not every round
                log.info("capacity: %s (%d GPUs in service, %d workers in service): %s", evaluated.decision,
                         evaluated.gpus_total, evaluated.workers_in_service or 0, evaluated.reason)
                last = evaluated.decision
            try:
                await publish_event(self._runtime.broker, evaluated)
            except Exception as exc:
                log.warning("capacity evaluation not published (%r); the bus may be reconnecting", exc)


async def _read(read):
    """The reading, or the error that says why there is none (a demand source or provider error)."""
    try:
        return await read
    except (DemandUnavailable, ProviderError) as exc:
        return exc
