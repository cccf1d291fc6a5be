"""Every node's history, kept by report-builder (and read from Prometheus where one scrapes the
GPU figures: `PrometheusHistory`): each live sample is folded into its node's
minute (`gpumedic_store.history`), and finished minutes are written every few seconds by one
instance (the `history` lease); once an hour has ended its minutes are folded into the hour's
row, a few node-hours each time (the work of an hour of a large fleet spread over the next,
between samples); minutes past the retention are deleted as it goes.

A sample that arrives after its minute was closed (a node whose clock or link lags) is dropped
and counted, not written into a minute that is already stored. While the store is down, finished
minutes wait in memory, at most `MAX_WAITING` per node (the oldest go first).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_events import NodeSampled
from gpumedic_store import StoreUnavailable
from gpumedic_store import history as store
from gpumedic_store import reliability
from gpumedic_store.history import Minute, MinuteFolder, minute_of

log = logging.getLogger(__name__)

CLOSE_AFTER = timedelta(seconds=15)
"""A minute is closed this long after it ended: samples still on their way get in."""
MAX_WAITING = 60
"""Finished minutes kept per node while they cannot be written."""
PRUNE_EVERY_S = 600.0
DAYS_KEPT = 400
"""Days each node's day figures are kept, for reliability over months."""
FOLD_EACH_FLUSH = 60
"""Node-hours folded at most per flush: 10,000 nodes' hour in half an hour at a flush every 10 s."""
FOLD_AT_ONCE = 5
"""Node-hours folded in one transaction (about 10 ms each), samples handled between."""


class HistoryRecorder:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        *,
        retention: timedelta,
        flush_every_s: float = 10.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
        provider_of: Callable[[str], str | None] = lambda node_id: None,
        days_kept: timedelta = timedelta(days=DAYS_KEPT),
    ) -> None:
        """Each finished minute also counts towards its node's day (`gpumedic_store.reliability`),
        under the provider `provider_of` names; days are kept for `days_kept`."""
        self._db = sessions
        self.retention = retention
        self.provider_of = provider_of
        self.days_kept = days_kept
        self.flush_every_s = flush_every_s
        self._now = now
        self._open: dict[str, MinuteFolder] = {}
        self._done: dict[str, list[Minute]] = {}
        self._closed: dict[str, datetime] = {}
        """Per node, the last minute closed: a sample of it or before comes too late."""
        self.late = 0
        """Samples dropped because their minute was already closed."""
        self._pruned_at: float | None = None
        self._failing = False

    async def on_sample(self, sample: NodeSampled) -> None:
        minute = minute_of(sample.occurred_at)
        folder = self._open.get(sample.node_id)
        if folder is not None and minute > folder.minute:
            self._finish(sample.node_id, folder)
            folder = None
        if folder is None:
            closed = self._closed.get(sample.node_id)
            if closed is not None and minute <= closed:
                self.late += 1
                return
            folder = self._open[sample.node_id] = MinuteFolder(minute)
        elif minute < folder.minute:
            self.late += 1
            return
        folder.add(sample)

    def _finish(self, node_id: str, folder: MinuteFolder) -> None:
        self._closed[node_id] = folder.minute
        waiting = self._done.setdefault(node_id, [])
        waiting.append(folder.minute_figures())
        del waiting[:-MAX_WAITING]

    async def flush(self) -> int:
        """Close the minutes that ended, write every finished one, prune now and then; rows written."""
        cutoff = minute_of(self._now() - CLOSE_AFTER)
        for node_id, folder in list(self._open.items()):
            if folder.minute < cutoff:
                self._finish(node_id, folder)
                del self._open[node_id]
        batch = {node: list(minutes) for node, minutes in self._done.items() if minutes}
        written = 0
        try:
            async with self._db() as session, session.begin():
                if batch:
                    await store.write(session, batch)
                    await reliability.count_days(session, batch, {node: self.provider_of(node) for node in batch})
                    written = sum(len(minutes) for minutes in batch.values())
                if self._pruned_at is None or time.monotonic() - self._pruned_at >= PRUNE_EVERY_S:
                    await reliability.prune_days(session, self._now() - self.days_kept)
                    gone = await store.prune(session, self._now() - self.retention)
                    self._pruned_at = time.monotonic()
                    if gone:
                        log.info("history: %d node-minutes older than %s forgotten", gone, self.retention)
        except Exception as exc:  # the store down, or another instance wrote a row meanwhile: try again
            if not self._failing:
                why = "the store is unavailable" if isinstance(exc, StoreUnavailable) else "the write failed"
                log.warning("history: %s (%s); finished minutes wait in memory", why, exc)
            self._failing = True
            return 0
        if self._failing:
            log.info("history: the store is back; %d node-minutes written", written)
            self._failing = False
        for node_id, minutes in batch.items():  # what finished meanwhile stays for the next flush
            written_ids = {id(m) for m in minutes}
            self._done[node_id] = [m for m in self._done[node_id] if id(m) not in written_ids]
        await self.fold()
        return written

    async def fold(self, limit: int = FOLD_EACH_FLUSH) -> int:
        """Fold up to `limit` node-hours that have ended (and had time for their last minute to be
        written) into their rows; the minutes folded. A failure leaves them for the next flush."""
        folded = 0
        try:
            async with self._db() as session:
                keys = await store.hours_to_fold(session, self._now() - CLOSE_AFTER - timedelta(seconds=2 * self.flush_every_s), limit)
            for at in range(0, len(keys), FOLD_AT_ONCE):
                async with self._db() as session, session.begin():
                    folded += await store.fold(session, keys[at : at + FOLD_AT_ONCE])
                await asyncio.sleep(0)  # the samples that came meanwhile
        except Exception as exc:
            log.warning("history: folding finished hours failed (%s); trying again at the next flush", exc)
        return folded

    async def loop(self) -> None:
        """Run on the `history` lease."""
        while True:
            await asyncio.sleep(self.flush_every_s)
            await self.flush()


class PrometheusUnavailable(Exception):
    """Prometheus did not answer a history query usably; the message says what it said."""


PROMETHEUS_GPU_CHARTS = (
    # chart key, dcgm-exporter's series (node-sampler serves the same names), folded per point as the store folds a minute
    ("gpu_util", "DCGM_FI_DEV_GPU_UTIL", "avg", 1.0),
    ("gpu_memory", "DCGM_FI_DEV_FB_USED", "max", 1 / 1024),
    ("gpu_temperature", "DCGM_FI_DEV_GPU_TEMP", "max", 1.0),
    ("gpu_power", "DCGM_FI_DEV_POWER_USAGE", "avg", 1.0),
    ("gpu_clock", "DCGM_FI_DEV_SM_CLOCK", "avg", 1.0),
)


class PrometheusHistory:
    """A node's GPU figures from a Prometheus server that scrapes node-sampler's `/metrics` (or
    dcgm-exporter: the same series names), read with its HTTP API's range queries: Prometheus keeps
    them as long as it is told to, so the store need keep only the host's figures and processes.

    A node's series are those whose `node_label` (dcgm-exporter's `Hostname` by default; relabel
    in Prometheus if the node ids of the inventory are not the hosts' names) is the node id.
    """

    def __init__(self, url: str, *, node_label: str = "Hostname", timeout_s: float = 5.0) -> None:
        self.url = url.rstrip("/")
        self.node_label = node_label
        self.timeout_s = timeout_s

    async def gpu_charts(self, node_id: str, times: list[int], step_s: int) -> list[store.Chart]:
        """The GPU charts over `times` (a grid `step_s` apart), each point the figure over the step
        before it; PrometheusUnavailable when the server cannot be asked or answers nonsense."""
        if not times:
            return []
        titles = {key: (title, unit) for key, title, unit, _, _ in store.GPU_CHARTS}
        charts = []
        async with httpx.AsyncClient(timeout=self.timeout_s) as client:
            for key, metric, fold, scale in PROMETHEUS_GPU_CHARTS:
                query = f'max by (gpu) ({fold}_over_time({metric}{{{self.node_label}="{node_id}"}}[{step_s}s]))'
                by_gpu = await self._range(client, query, times[0] + step_s, times[-1] + step_s, step_s)
                series = []
                for gpu in sorted(by_gpu, key=lambda g: int(g) if g.isdigit() else 1 << 20):
                    points = by_gpu[gpu]
                    values = [points.get(t + step_s) for t in times]
                    series.append(store.Series(f"GPU {gpu}", [None if v is None else round(v * scale, 2) for v in values]))
                if series:
                    charts.append(store.Chart(key, *titles[key], series))
        return charts

    async def _range(self, client: httpx.AsyncClient, query: str, start: int, end: int, step_s: int) -> dict[str, dict[int, float]]:
        where = f"{self.url}/api/v1/query_range"
        try:
            response = await client.get(where, params={"query": query, "start": start, "end": end, "step": step_s})
            body = response.json()
        except (httpx.HTTPError, ValueError) as exc:
            raise PrometheusUnavailable(f"{where}: {type(exc).__name__} ({exc})") from None
        if response.status_code != 200 or not isinstance(body, dict) or body.get("status") != "success":
            said = body.get("error") if isinstance(body, dict) else None
            raise PrometheusUnavailable(f"{where} answered HTTP {response.status_code}: {str(said or body)[:200]}")
        out: dict[str, dict[int, float]] = {}
        try:
            for result in body["data"]["result"]:
                gpu = str(result["metric"].get("gpu", "?"))
                out[gpu] = {int(float(t)): float(v) for t, v in result["values"] if v not in ("NaN", "+Inf", "-Inf")}
        except (KeyError, TypeError, ValueError) as exc:
            raise PrometheusUnavailable(f"{where} answered a result that is not a range vector ({type(exc).__name__}: {exc})") from None
        return out
