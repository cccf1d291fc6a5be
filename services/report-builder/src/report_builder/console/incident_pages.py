"""The incidents page and one incident's page (and its saved report): timeline, evidence, actions, the node's figures around it, the trace."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode

from aiohttp import web

from gpumedic_bus.topology import FLEET_NODE
from gpumedic_store import INCIDENT_STATUSES
from gpumedic_store import cost
from gpumedic_store import history as node_history
from gpumedic_store import views as read
from report_builder.console import views
from report_builder.console.format import postmortem
from report_builder.console.forms import BadRequest

PAGE_SIZE = 50
STYLE_SHEET = Path(__file__).parent / "static" / "console.css"


INCIDENT_CHARTS = ("host_memory", "gpu_util", "gpu_memory", "disks", "host_load", "gpu_temperature")
"""The node's figures an incident page shows, in this order (the node page shows them all)."""


BEFORE_INCIDENT = timedelta(hours=1)


AFTER_INCIDENT = timedelta(minutes=15)


def around(incident, now: datetime) -> tuple[datetime, datetime]:
    """The window an incident page charts: the hour before it opened to a while after it closed
    (or now), at most a day from its start."""
    start = incident.opened_at - BEFORE_INCIDENT
    end = min((incident.closed_at or now) + AFTER_INCIDENT, now, start + timedelta(days=1))
    return start, max(end, incident.opened_at + timedelta(minutes=1))


class IncidentPages:
    """Mixed into `Console`: the incidents page and one incident's page (and its saved report): timeline, evidence, actions, the node's figures around it, the trace."""

    async def incidents_page(self, request: web.Request) -> web.Response:
        try:
            where = views.incident_filter(request.query, INCIDENT_STATUSES)
            page = max(1, int(request.query.get("page") or 1))
        except (views.FilterError, ValueError) as exc:
            raise BadRequest(str(exc) if isinstance(exc, views.FilterError) else "page must be a whole number") from None
        async with self._db() as session:
            rows = await read.list_incidents(session, where=where, limit=PAGE_SIZE + 1, offset=(page - 1) * PAGE_SIZE)
            kinds = sorted({*await read.incident_kinds(session), *([where.kind] if where.kind else [])})
        query = {k: v for k, v in request.query.items() if k != "page" and v}
        return self._page(
            request, "incidents.html", "Incidents", rows=rows[:PAGE_SIZE], kinds=kinds, statuses=INCIDENT_STATUSES, query=query,
            page=page, more=len(rows) > PAGE_SIZE, page_link=lambda n: "/incidents?" + urlencode({**query, "page": n}),
        )

    async def incident_page(self, request: web.Request) -> web.Response:
        context = await self._incident(request)
        return self._page(request, "incident.html", f"Incident {context['incident'].id[:8]}", interactive=True, **context)

    async def incident_report(self, request: web.Request) -> web.Response:
        """The incident as one standalone HTML file (its style inline) to save and hand to a colleague."""
        context = await self._incident(request)
        incident = context["incident"]
        html = self._templates.get_template("report.html").render(
            css=STYLE_SHEET.read_text(), generated_at=datetime.now(UTC), interactive=False, **context,
        )
        name = f"gpumedic-incident-{incident.id[:8]}-{incident.kind}.html"
        return web.Response(text=html, content_type="text/html", headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            # The saved file carries its style sheet inline; nothing else may run or load.
            "Content-Security-Policy": "default-src 'none'; style-src 'unsafe-inline'",
        })

    async def _incident(self, request: web.Request) -> dict:
        incident_id = request.match_info["id"]
        try:
            uuid.UUID(incident_id)
        except ValueError:
            raise BadRequest(f"{incident_id!r} is not an incident id") from None
        async with self._db() as session:
            incident = await read.find_incident(session, id_prefix=incident_id)
            if incident is None:
                raise web.HTTPNotFound(text=f"no incident {incident_id}")
            timeline = await read.incident_timeline(session, incident_id=incident.id)
            actions = await read.actions_of(session, incident_id=incident.id)
            spans = await read.trace_spans(session, trace_id=incident.trace_id) if incident.trace_id else []
            marks = await read.marks_of(session, incident_id=incident.id)
            notifications = await read.notifications_of(session, incident_id=incident.id)
            start, end = around(incident, datetime.now(UTC))
            history = await node_history.read(session, incident.node_id, start, end)
        if incident.node_id != FLEET_NODE:
            history, _ = await self._with_prometheus(incident.node_id, history)
        shown = [(incident.opened_at, "opened")] + ([(incident.closed_at, incident.status)] if incident.closed_at else [])
        jaeger = f"{self.config.jaeger_url.rstrip('/')}/trace/{incident.trace_id}" if self.config.jaeger_url and incident.trace_id else None
        return {
            "incident": incident, "timeline": timeline, "actions": actions, "trace": views.waterfall(spans), "marks": marks,
            "notifications": notifications, "jaeger": jaeger, "postmortem": postmortem(incident),
            "history": history, "charts": views.history_charts(history, keys=INCIDENT_CHARTS, marks=shown), "fleet_node": FLEET_NODE,
            "cost": cost.Cost.from_json(incident.cost) if incident.cost else None, "cost_at": datetime.now(UTC),
        }
