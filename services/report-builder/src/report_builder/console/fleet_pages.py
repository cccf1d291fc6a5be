"""The fleet page and a node's page, with the node's history over any window."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from aiohttp import web

from gpumedic_events import EventDecodeError, IncidentKind, NodeSampled
from gpumedic_store import history as node_history
from gpumedic_store import views as read
from report_builder.console import views
from report_builder.console.forms import BadRequest, path_node
from report_builder.history import PrometheusUnavailable

log = logging.getLogger(__name__)


class FleetPages:
    """Mixed into `Console`: the fleet page and a node's page, with the node's history over any window."""

    # --- pages --------------------------------------------------------------------------------

    async def fleet_page(self, request: web.Request) -> web.Response:
        now = datetime.now(UTC)
        async with self._db() as session:
            unresolved = await read.unresolved_by_node(session)
            drained = await read.drained_nodes(session)
        tiles = views.fleet(self.readings, unresolved, drained, now, silent_after_s=self.config.silent_after_s)
        counts = {h: sum(1 for t in tiles if t.health == h) for h in views.HEALTH_ORDER}
        return self._page(request, "fleet.html", "Fleet", tiles=tiles, counts=counts)

    async def node_page(self, request: web.Request) -> web.Response:
        node = path_node(request)
        now = datetime.now(UTC)
        try:
            window = views.history_window(request.query, now)
        except views.FilterError as exc:
            raise BadRequest(str(exc)) from None
        sample, sample_error = await self._latest_sample(node)
        async with self._db() as session:
            incidents = await read.list_incidents(session, where=read.IncidentFilter(node_id=node), limit=20)
            actions = await read.list_actions(session, node_id=node, limit=20)
            drains = await read.drains(session, node_id=node)
            history = await node_history.read(session, node, window.start, window.end)
            if (fitted := views.fitted_window(request.query, history.first_at, now)) is not None:
                window, history = fitted, await node_history.read(session, node, fitted.start, fitted.end)
        history, history_error = await self._with_prometheus(node, history)
        reading = self.readings.get(node)
        if sample is None and reading is None and not incidents and not actions and history.empty and not sample_error:
            raise web.HTTPNotFound(text=f"no node {node}: nothing sampled it in the last minutes, and the store has no incident, action or history of it")
        deaths = [i for i in incidents if i.kind == IncidentKind.CONTAINER_DIED.value]
        # the sampler sends its busiest processes every 30 s: between, the last ones seen stand
        top_at, top = (sample.occurred_at, sample.host.top_processes) if sample and sample.host.top_processes else self.tops.get(node, (None, ()))
        usage_at, usage = ((sample.occurred_at, sample.host.containers) if sample and sample.host.containers
                           else self.container_usage.get(node, (None, ())))
        containers = sorted({p.container_id for g in sample.gpus for p in g.processes if p.container_id}
                            | {p.container_id for p in top if p.container_id}) if sample else []
        return self._page(
            request, "node.html", node, node=node, sample=sample, sample_error=sample_error, reading=reading,
            incidents=incidents, actions=actions, drains=drains, deaths=deaths, containers=containers, window=window, history_error=history_error,
            top=top, top_at=top_at, usage=usage, usage_at=usage_at,
            windows=views.WINDOWS, history=history, charts=views.history_charts(history),
            retention_h=self.config.history_retention_h,
        )

    async def node_history(self, request: web.Request) -> web.Response:
        """A node's history over a window as JSON: the charts' data, and its busiest processes."""
        node = path_node(request)
        try:
            window = views.history_window(request.query, datetime.now(UTC))
        except views.FilterError as exc:
            raise BadRequest(str(exc)) from None
        async with self._db() as session:
            history = await node_history.read(session, node, window.start, window.end)
        history, history_error = await self._with_prometheus(node, history)
        body = history.as_json() | {"source": history.source, "source_error": history_error, "top_processes": [
            {"pid": p.pid, "command": p.command, "user": p.user, "container_id": p.container_id, "cpu_pct": p.cpu_pct,
             "memory_rss_mib": p.memory_rss_mib, "last_seen": p.last_seen.isoformat()} for p in history.top
        ]}
        return web.json_response(body)

    async def _with_prometheus(self, node: str, history: node_history.History) -> tuple[node_history.History, str | None]:
        """The GPU charts from Prometheus where one is configured; the store's, and why, where it fails."""
        if self._prometheus is None:
            return history, None
        try:
            charts = await self._prometheus.gpu_charts(node, history.times, history.step_s)
        except PrometheusUnavailable as exc:
            log.warning("console: GPU history of %s from Prometheus: %s", node, exc)
            return history, f"Prometheus did not give the GPU figures ({exc}); they are the store's"
        return history.replacing(charts, f"Prometheus ({self._prometheus.url}) for the GPUs, the store for the rest"), None

    async def _latest_sample(self, node: str) -> tuple[NodeSampled | None, str | None]:
        if self._latest is None:
            return None, None
        try:
            return await self._latest(node), None
        except EventDecodeError as exc:
            return None, f"its last sample does not validate: {exc.reason}"
        except Exception as exc:  # the bus away: the page still shows what the store has
            log.warning("console: the last sample of %s could not be read: %r", node, exc)
            return None, f"its last sample could not be read from the bus ({type(exc).__name__})"
