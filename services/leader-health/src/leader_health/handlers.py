"""leader-health's loop: probe every peer, publish the check, and run the round through the
cluster's incidents (the shared detector: persist, publish, request the remediator's actions).

Rounds start every `interval_s` however long one takes (a blocked peer holds a round for the
HTTP timeout), so "two rounds in a row" is two intervals; a round longer than the interval
is followed by the next at once. One that outlasts its interval by more than its slowest peer
explains (a blocked or slow peer holds a round as long as it makes it wait) is the prober's own
lateness: it says so and judges no peer slow by it, since each answer's time was measured by a
prober that could not keep up, not only by the peer."""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_incidents.detector import Detector
from gpumedic_nodes.inventory import InventoryError, load_inventory
from leader_health.judge import ClusterIncidents, assess, round_overran
from leader_health.probe import probe_all
from leader_health.settings import Settings
from leader_health.status import StatusReader

log = logging.getLogger(__name__)


def check_loop(runtime: ServiceRuntime, settings: Settings, detector: Detector, logic: ClusterIncidents, reader: StatusReader):
    inventory = Inventory(settings.inventory)

    async def check_cluster() -> None:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            answers = await probe_all(
                settings.peers,
                connect_timeout_s=settings.connect_timeout_s,
                http_timeout_s=settings.http_timeout_s,
                concurrency=settings.probe_concurrency,
                reader=reader,
            )
            took = loop.time() - started
            if overran := round_overran(took, answers, settings.interval_s):
                log.warning("the probe round over %d peers took %.1fs, past its %gs interval by more than its slowest peer "
                            "explains: no peer is judged slow by it", len(answers), took, settings.interval_s)
            elif overran := runtime.loop_lag.lagging_since(started):
                log.warning("leader-health's own event loop lagged %.1fs during the probe round: no peer is judged slow, "
                            "blocked or unreachable by it", runtime.loop_lag.worst_since(started))
            for answer in answers:
                if answer.state != "ok":
                    log.info("peer %s: %s: %s", answer.url, answer.state, answer.detail)
            try:
                await publish_event(runtime.broker, assess(settings.cluster, answers))
            except Exception as exc:
                log.warning("cluster check not published (%r); the bus may be reconnecting", exc)
            try:
                known = await asyncio.to_thread(inventory.names)
                await detector.decide(lambda now: logic.on_round(answers, now, known, overran=overran))
            except Exception:  # the bus or the state bucket; the next round decides again
                log.exception("the round's incidents were not applied; the next round decides again")
            await asyncio.sleep(max(0.0, started + settings.interval_s - loop.time()))

    return check_cluster


class Inventory:
    """The node ids and hosts the fleet's inventory names, read again when the file changes (enroll
    adds nodes); None when none is set or it cannot be read (said once): then no member is a stranger."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._read: tuple[tuple[int, int], frozenset[str]] | None = None
        self._said = False

    def names(self) -> frozenset[str] | None:
        if self.path is None:
            return None
        try:
            info = self.path.stat()
            if self._read is None or self._read[0] != (info.st_mtime_ns, info.st_size):
                nodes = load_inventory(self.path)
                self._read = ((info.st_mtime_ns, info.st_size), frozenset(nodes) | {a.host for a in nodes.values()})
                self._said = False
        except (OSError, InventoryError) as exc:
            if not self._said:
                log.warning("the inventory %s cannot be read (%s): no peer is judged a stranger meanwhile", self.path, exc)
                self._said = True
            return None
        return self._read[1]
