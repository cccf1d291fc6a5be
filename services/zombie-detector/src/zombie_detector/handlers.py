"""zombie-detector's adapter: node facts (samples over the push consumer, node events over pull
consumers) and the services' heartbeats (how far behind their samples each is) go to the
node-incident logic through the shared detector (`gpumedic_incidents.detector`); the rules'
memory goes to and comes back from its bucket (`zombie_detector.memory`)."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from datetime import UTC, datetime

from nats.js.errors import KeyNotFoundError

from gpumedic_bus import Delivery, ServiceRuntime
from gpumedic_bus.outage import nats_reason
from gpumedic_bus.streams import PARTITIONS, RULE_MEMORY
from gpumedic_events import Event, NodeFindings
from gpumedic_incidents.detector import Detector
from gpumedic_incidents.store import IncidentStates
from zombie_detector import memory
from zombie_detector.node_incidents import RETIRED_KEPT, SOURCE, NodeIncidents

log = logging.getLogger(__name__)

OWN_LAG_EVERY_S = 1.0
"""How often the detector tells its rules how far behind its own samples it is (its published
heartbeat says so every 5 s; silence is judged each second)."""
LAST_WRITE_WITHIN_S = 2.0
"""How long a stopping instance gives its last write of the rules' memory."""


class DetectorHandlers(Detector):
    def __init__(self, runtime: ServiceRuntime, logic: NodeIncidents) -> None:
        super().__init__(runtime, logic, SOURCE)
        self._left_out: set[str] = set()
        """The rules' parts of partitions the last write of the memory left out (said once)."""

    async def restore(self, states: IncidentStates) -> None:
        """The open incidents of an earlier run, and when it closed others: a cell that takes over
        one of its partitions reads the samples it left, and a fault found there may have been
        fixed and closed meanwhile (`NodeIncidents.on_findings`)."""
        opened, closed = await states.load(detector=self.source, closed_since=datetime.now(UTC) - RETIRED_KEPT)
        self.logic.recall_closes(closed)
        await self.resume(states, opened)

    async def on_event(self, event: Event, delivery: Delivery | None = None) -> None:
        """A sample (push consumer, no delivery) or a node event (pull consumer). A node event is
        acknowledged once what it decided is stored; a sample does not wait (the next one decides
        again), so persisting and publishing a flood of incidents never holds the samples."""
        await self.decide(lambda now: self.logic.on_event(event, now), wait=delivery is not None)

    async def on_findings(self, event: NodeFindings, delivery: Delivery) -> None:
        """What a detector cell found, acknowledged once what it decided is stored."""
        await self.decide(lambda now: self.logic.on_findings(event, now))

    async def watch_own_lag(self) -> None:
        """Its own lag, as its heartbeat would say it, each second."""
        while True:
            await asyncio.sleep(OWN_LAG_EVERY_S)
            beat = self._runtime.heartbeat_event("ready")
            if beat.lag:  # a standby consumes nothing
                await self.on_event(beat)

    async def recall_memory(self) -> None:
        """Before anything is consumed: what the rules of the instance before this one remembered."""
        kv = await self._runtime.broker.connection.jetstream().key_value(RULE_MEMORY.bucket)
        stored = {}
        for partition in range(PARTITIONS):
            try:
                stored[memory.key(partition)] = (await kv.get(memory.key(partition))).value or b""
            except KeyNotFoundError:
                continue
        if stored:
            lines = memory.recall(self.logic.rules, stored, datetime.now(UTC))
            log.info("%s: the rules' memory: %s", SOURCE, "; ".join(lines))

    async def keep_memory(self) -> None:
        """Write the rules' memory every `memory.CHECKPOINT_S`, and once more as the service stops
        (the instance that takes over then knows all of it); a bus that does not answer costs a
        line, and the next round writes it all again."""
        kv = await self._runtime.broker.connection.jetstream().key_value(RULE_MEMORY.bucket)
        failing = False
        try:
            while True:
                await asyncio.sleep(memory.CHECKPOINT_S)
                try:
                    await self._write_memory(kv)
                except Exception as exc:  # noqa: BLE001 (the bus is away; a takeover meanwhile learns a little again)
                    if not failing:
                        log.warning("%s: the rules' memory was not kept (%s); trying again every %gs", SOURCE, nats_reason(exc),
                                    memory.CHECKPOINT_S)
                    failing = True
                else:
                    failing = False
        finally:
            lease = self._runtime.lease
            if lease is None or lease.held:  # an instance that lost its lease leaves the memory to the one that has it
                with contextlib.suppress(Exception):
                    await asyncio.wait_for(self._write_memory(kv), LAST_WRITE_WITHIN_S)

    async def _write_memory(self, kv) -> None:
        values, left_out = memory.snapshot(self.logic.rules, datetime.now(UTC))
        said = {line.split(" (", 1)[0] for line in left_out}  # which rule of which partition, without its size
        if said != self._left_out:
            for line in left_out:
                log.warning("%s: %s", SOURCE, line)
            self._left_out = said
        for key, value in values.items():
            await kv.put(key, value)
