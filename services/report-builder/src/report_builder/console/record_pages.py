"""The peer cluster's log, the worker pool's capacity, what incidents cost, and the ledger."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from aiohttp import web

from gpumedic_events import IncidentKind
from gpumedic_store import breaker, clusterlog
from gpumedic_store import cost
from gpumedic_store import views as read
from report_builder.console import views
from report_builder.console.forms import BadRequest, hours_asked

log = logging.getLogger(__name__)


def leader_stretches(checks) -> list[tuple[datetime, datetime, str | None]]:
    """(from, to, leader) for each stretch of checks that saw the same leader (None: no leader)."""
    stretches: list[tuple[datetime, datetime, str | None]] = []
    for check in checks:
        if stretches and stretches[-1][2] == check.leader:
            stretches[-1] = (stretches[-1][0], check.checked_at, check.leader)
        else:
            stretches.append((check.checked_at, check.checked_at, check.leader))
    return stretches


COST_SPANS = {"1d": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30), "90d": timedelta(days=90)}


class RecordPages:
    """Mixed into `Console`: the peer cluster's log, the worker pool's capacity, what incidents cost, and the ledger."""

    async def cluster_page(self, request: web.Request) -> web.Response:
        hours = hours_asked(request, default=6)
        since = datetime.now(UTC) - timedelta(hours=hours)
        async with self._db() as session:
            names = await read.clusters(session)
            chosen = request.query.get("cluster") or (names[0] if names else None)
            checks = await read.cluster_checks(session, cluster=chosen, since=since) if chosen else []
        summary = clusterlog.summarize(checks)
        times = [c.checked_at for c in checks]
        charts = [views.time_chart("peers", "Peers", "peers", times, {
            "answering": [c.peers_answering for c in checks], "in all": [c.peers_total for c in checks],
            "with a leader": [1 if c.leader else 0 for c in checks],
        }, breaks=True)] if checks else []
        return self._page(
            request, "cluster.html", "Cluster", names=names, chosen=chosen, checks=checks[-200:], summary=summary, hours=hours,
            charts=charts, leaders=leader_stretches(checks), matrix=views.reachability(checks[-1].peers or []) if checks else None,
        )

    async def capacity_page(self, request: web.Request) -> web.Response:
        hours = hours_asked(request, default=6)
        async with self._db() as session:
            rows = await read.capacity_checks(session, since=datetime.now(UTC) - timedelta(hours=hours))
        times = [r.checked_at for r in rows]
        charts = []
        if rows:
            if any(r.queued is not None or r.in_progress is not None for r in rows):
                charts.append(views.time_chart("queue", "Tasks", "tasks", times, {
                    "queued": [r.queued for r in rows], "in progress": [r.in_progress for r in rows],
                }, breaks=True))
            charts.append(views.time_chart("gpus", "GPUs", "GPUs", times, {
                "in service": [r.gpus_total for r in rows], "busy": [r.gpus_busy for r in rows], "wanted": [r.gpus_wanted for r in rows],
            }, breaks=True))
            if any(r.cost_per_h is not None for r in rows):
                charts.append(views.time_chart("cost", "Cost of the billed workers", "$/h", times, {"$/h": [r.cost_per_h for r in rows]}, breaks=True))
        return self._page(
            request, "capacity.html", "Capacity", rows=rows[-100:], hours=hours, last=rows[-1] if rows else None, charts=charts,
        )

    async def cost_page(self, request: web.Request) -> web.Response:
        span, by = request.query.get("since") or "7d", request.query.get("by") or "kind"
        if span not in COST_SPANS:
            raise BadRequest(f"since must be one of {', '.join(COST_SPANS)}, not {span[:20]!r}")
        if by not in cost.BY:
            raise BadRequest(f"by must be one of {', '.join(cost.BY)}, not {by[:20]!r}")
        now = datetime.now(UTC)
        since = now - COST_SPANS[span]
        async with self._db() as session:
            costs = await cost.costs_since(session, since, now)
        lines = cost.summed(costs, by=by, since=since, now=now)
        days = cost.summed(costs, by="day", since=since, now=now)
        kinds = [line.group for line in cost.summed(costs, by="kind", since=since, now=now)][:6]
        per_day = {kind: cost.summed([c for c in costs if c[0].kind == kind], by="day", since=since, now=now) for kind in kinds}
        times = [datetime.fromisoformat(d.group).replace(tzinfo=UTC) for d in days]
        charts = [
            views.time_chart("gpu_hours", "GPU-hours lost per day", "GPU-h", times, {
                kind: [next((d.gpu_hours for d in per_day[kind] if d.group == day.group), 0.0) for day in days] for kind in kinds
            }),
            views.time_chart("dollars", "What they cost per day", "$", times, {"$": [round(d.usd, 2) for d in days]}),
        ] if len(days) > 1 else []
        return self._page(
            request, "cost.html", "Cost", lines=lines, by=by, span=span, spans=COST_SPANS, bys=cost.BY, charts=charts, since=since,
            incidents=sorted(costs, key=lambda c: -c[1].gpu_hours(now, since=since))[:20], at=now,
            total_gpu_hours=sum(line.gpu_hours for line in lines), total_usd=sum(line.usd for line in lines),
            unpriced=sum(line.unpriced_gpu_hours for line in lines),
        )

    async def ledger_page(self, request: web.Request) -> web.Response:
        now = datetime.now(UTC)
        async with self._db() as session:
            rules = await read.false_positive_counts(session)
            silences = await read.list_silences(session, now=now)
            trip = await breaker.open_trip(session=session)
        return self._page(request, "ledger.html", "Ledger", rules=rules, silences=silences, trip=trip, kinds=[k.value for k in IncidentKind])
