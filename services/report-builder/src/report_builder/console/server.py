"""The web console: server-rendered pages over the incident store and the latest samples, served by
report-builder on its own port (aiohttp in the service's event loop).

Pages: the fleet (`/`), one node (`/nodes/{node}`: its GPUs, processes, host, incidents, actions
and its history over any window, also as `/nodes/{node}/history.json`), incidents (`/incidents`,
filtered) and one incident with its timeline, evidence, actions, the node's figures around it and
the trace waterfall (`/incidents/{id}`, and `.../report.html` to save and hand on), the peer
cluster (`/cluster`), the worker pool's capacity (`/capacity`), and the ledger of false
positives, silences and the breaker (`/ledger`). Charts are data in the page that the script
draws with uPlot (served from `static/vendor/`, fetched from the npm registry at install). Every page marks its live parts; `/live`
is a server-sent event stream that says when something changed, and the page's script fetches
the page again and swaps those parts, so nothing reloads.

Operations (silence, lift a silence, mark a false positive, reset the breaker) need a session
(`auth.Sessions`) and its CSRF token, and a same-origin request. A silence goes out on the bus as
report-builder's SilenceAdded (detectors follow it, as they do the CLI's); a mark and a reset
are written to the store as the CLI writes them. Nothing is loaded from elsewhere: the script and
the style sheet are served from `static/`, and the Content-Security-Policy allows nothing else.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit

import jinja2
from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_bus.topology import FLEET_NODE
from gpumedic_events import ACKNOWLEDGED_NOTE, Event, EventDecodeError, IncidentKind, Matcher, NodeSampled, ServiceHeartbeat, SilenceAdded, SilenceRemoved, TopProcess
from gpumedic_events.base import is_subject_token
from gpumedic_events.redact import redact
from gpumedic_events.silence import mark_said
from gpumedic_store import INCIDENT_STATUSES, StoreUnavailable, breaker, clusterlog
from gpumedic_store import cost
from gpumedic_store import history as node_history
from gpumedic_store import views as read
from report_builder import repository
from report_builder.history import PrometheusHistory, PrometheusUnavailable
from report_builder.console import views
from report_builder.console.auth import LOGIN_COOKIE, SESSION_COOKIE, AuthError, LoginThrottle, Session, Sessions

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
SOURCE = "report-builder-console"
PAGE_SIZE = 50
HEARTBEAT_FRESH = timedelta(seconds=30)
"""A heartbeat older than this says nothing about a service now (it beats every 5 s)."""
LIVE_EVERY_S = 2.0
"""At most one change notice per client this often (samples change something every second)."""
BREAKER_READ_EVERY_S = 3.0
"""How stale the banner saying that no action runs may be."""
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
    "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
NAV = (("/", "Fleet"), ("/incidents", "Incidents"), ("/cluster", "Cluster"), ("/capacity", "Capacity"), ("/cost", "Cost"), ("/ledger", "Ledger"))
COST_SPANS = {"1d": timedelta(days=1), "7d": timedelta(days=7), "30d": timedelta(days=30), "90d": timedelta(days=90)}


@dataclass(frozen=True)
class ConsoleConfig:
    host: str = "127.0.0.1"
    port: int = 8470
    token: str | None = None
    jaeger_url: str | None = None
    """Base URL of a Jaeger UI; an incident page links its trace there."""
    silent_after_s: float = 60.0
    """A node whose last sample is older than this shows as silent."""
    public_url: str | None = None
    """The URL people reach the console at; https makes its cookies Secure whatever the hop before."""
    trusted_proxies: tuple[str, ...] = ()
    """Addresses of reverse proxies whose X-Forwarded-For and X-Forwarded-Proto are believed."""
    history_retention_h: float = 24.0
    """How long report-builder keeps each node's history: the node page says so."""


class Changes:
    """A counter that report-builder's handlers bump when they store something (and the samples on
    every arrival: so bumping is one increment and a flag); `/live` waits on it."""

    def __init__(self) -> None:
        self.version = 0
        self._event = asyncio.Event()

    def bump(self) -> None:
        self.version += 1
        self._event.set()

    async def after(self, version: int, timeout_s: float) -> int:
        """The version once it differs from `version`, or after `timeout_s`."""
        if self.version == version:
            self._event.clear()  # set by bumps every waiter has seen: they compared versions first
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(timeout_s):  # not wait_for: on 3.11 it can swallow a cancellation
                    await self._event.wait()
        return self.version


class Console:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        config: ConsoleConfig,
        *,
        publish: Callable[[Event], Awaitable[None]],
        latest: Callable[[str], Awaitable[NodeSampled | None]] | None = None,
        prometheus: PrometheusHistory | None = None,
        incident_changed: Callable[[], None] | None = None,
    ) -> None:
        """`latest` reads a node's last sample from the samples stream (None: the node page shows
        only what the store has); `prometheus`, where set, gives the GPU charts; `incident_changed`
        is told of an acknowledgement (Alertmanager shows it)."""
        self._db = sessions
        self._incident_changed = incident_changed or (lambda: None)
        self._latest = latest
        self._prometheus = prometheus
        self.config = config
        self._publish = publish
        self.auth = Sessions(config.token)
        self.throttle = LoginThrottle()
        self.readings: dict[str, views.NodeReading] = {}
        self.tops: dict[str, tuple[datetime, tuple[TopProcess, ...]]] = {}
        """Each node's busiest processes as its sampler last sent them (every 30 s), for its page."""
        self.heartbeats: dict[uuid.UUID, ServiceHeartbeat] = {}
        self.changes = Changes()
        self._breaker_trip = None
        self._breaker_read_at = -BREAKER_READ_EVERY_S
        self.url: str | None = None
        self._runner: web.AppRunner | None = None
        self._streams: set[asyncio.Task] = set()
        """The open /live streams: ended first at stop, or the server would wait for them."""
        self._templates = jinja2.Environment(
            loader=jinja2.FileSystemLoader(HERE / "templates"), autoescape=True, undefined=jinja2.StrictUndefined,
            finalize=_masked,
        )
        self._templates.filters["when"] = _when
        self._templates.filters["ago"] = _ago
        self._templates.filters["duration"] = duration
        self._templates.filters["span_status"] = read.span_status
        self._templates.filters["gib"] = _gib
        self._templates.filters["chart_json"] = _chart_json

    # --- inputs from report-builder's handlers -----------------------------------------------

    async def on_sample(self, sample: NodeSampled) -> None:
        self.readings[sample.node_id] = views.NodeReading.of(sample)
        if sample.host.top_processes:
            self.tops[sample.node_id] = (sample.occurred_at, sample.host.top_processes)
        self.changes.bump()

    async def on_heartbeat(self, beat: ServiceHeartbeat) -> None:
        """Each instance's latest heartbeat: a service that lost a consumer says so in it."""
        if beat.state == "stopping":
            self.heartbeats.pop(beat.instance_id, None)
        else:
            self.heartbeats[beat.instance_id] = beat

    def blind(self, now: datetime) -> list[tuple[str, tuple[str, ...]]]:
        """Services that receive nothing of some of their consumers, by their recent heartbeats."""
        recent = [b for b in self.heartbeats.values() if now - b.occurred_at < HEARTBEAT_FRESH]
        return sorted({(b.service, b.consumers_missing) for b in recent if b.consumers_missing})

    # --- serving ------------------------------------------------------------------------------

    def app(self) -> web.Application:
        app = web.Application(middlewares=[_headers, self._errors, self._breaker_state], client_max_size=64 * 1024)
        app.add_routes([
            web.get("/", self.fleet_page),
            web.get("/nodes/{node}", self.node_page),
            web.get("/nodes/{node}/history.json", self.node_history),
            web.get("/incidents", self.incidents_page),
            web.get("/incidents/{id}", self.incident_page),
            web.get("/incidents/{id}/report.html", self.incident_report),
            web.get("/cluster", self.cluster_page),
            web.get("/capacity", self.capacity_page),
            web.get("/cost", self.cost_page),
            web.get("/ledger", self.ledger_page),
            web.get("/live", self.live),
            web.get("/healthz", self.healthz),
            web.post("/login", self.login),
            web.post("/logout", self.logout),
            web.post("/silences", self.add_silence),
            web.post("/silences/{id}/remove", self.remove_silence),
            web.post("/incidents/{id}/false-positive", self.mark_false_positive),
            web.post("/incidents/{id}/acknowledge", self.acknowledge),
            web.post("/breaker/reset", self.reset_breaker),
            web.static("/static", HERE / "static"),
        ])
        return app

    async def start(self) -> None:
        """Listen (a startup hook of the service: a port in use stops the start, saying so)."""
        self._runner = web.AppRunner(self.app(), access_log=None, handle_signals=False, shutdown_timeout=2.0)
        await self._runner.setup()
        try:
            await web.TCPSite(self._runner, self.config.host, self.config.port).start()
        except OSError as exc:
            await self._runner.cleanup()
            raise RuntimeError(
                f"the console cannot listen on {self.config.host}:{self.config.port} ({exc.strerror or exc}); "
                "set GPUMEDIC_REPORTS_CONSOLE_PORT to a free port, or to nothing for no console"
            ) from None
        host, port = self._runner.addresses[0][:2]
        self.url = f"http://{host}:{port}/"
        log.info("console at %s (%s)", self.url, "operations need the token" if self.auth.writable else "read-only: no token")

    async def stop(self) -> None:
        for task in self._streams:
            task.cancel()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None

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
        node = _node_id(request)
        now = datetime.now(UTC)
        try:
            window = views.history_window(request.query, now)
        except views.FilterError as exc:
            raise _BadRequest(str(exc)) from None
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
        containers = sorted({p.container_id for g in sample.gpus for p in g.processes if p.container_id}
                            | {p.container_id for p in top if p.container_id}) if sample else []
        return self._page(
            request, "node.html", node, node=node, sample=sample, sample_error=sample_error, reading=reading,
            incidents=incidents, actions=actions, drains=drains, deaths=deaths, containers=containers, window=window, history_error=history_error,
            top=top, top_at=top_at,
            windows=views.WINDOWS, history=history, charts=views.history_charts(history),
            retention_h=self.config.history_retention_h,
        )

    async def node_history(self, request: web.Request) -> web.Response:
        """A node's history over a window as JSON: the charts' data, and its busiest processes."""
        node = _node_id(request)
        try:
            window = views.history_window(request.query, datetime.now(UTC))
        except views.FilterError as exc:
            raise _BadRequest(str(exc)) from None
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

    async def incidents_page(self, request: web.Request) -> web.Response:
        try:
            where = views.incident_filter(request.query, INCIDENT_STATUSES)
            page = max(1, int(request.query.get("page") or 1))
        except (views.FilterError, ValueError) as exc:
            raise _BadRequest(str(exc) if isinstance(exc, views.FilterError) else "page must be a whole number") from None
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
            css=(HERE / "static" / "console.css").read_text(), generated_at=datetime.now(UTC), interactive=False, **context,
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
            raise _BadRequest(f"{incident_id!r} is not an incident id") from None
        async with self._db() as session:
            incident = await read.find_incident(session, id_prefix=incident_id)
            if incident is None:
                raise web.HTTPNotFound(text=f"no incident {incident_id}")
            timeline = await read.incident_timeline(session, incident_id=incident.id)
            actions = await read.actions_of(session, incident_id=incident.id)
            spans = await read.trace_spans(session, trace_id=incident.trace_id) if incident.trace_id else []
            marks = await read.marks_of(session, incident_id=incident.id)
            notifications = await read.notifications_of(session, incident_id=incident.id)
            start, end = _around(incident, datetime.now(UTC))
            history = await node_history.read(session, incident.node_id, start, end)
        if incident.node_id != FLEET_NODE:
            history, _ = await self._with_prometheus(incident.node_id, history)
        shown = [(incident.opened_at, "opened")] + ([(incident.closed_at, incident.status)] if incident.closed_at else [])
        jaeger = f"{self.config.jaeger_url.rstrip('/')}/trace/{incident.trace_id}" if self.config.jaeger_url and incident.trace_id else None
        return {
            "incident": incident, "timeline": timeline, "actions": actions, "trace": views.waterfall(spans), "marks": marks,
            "notifications": notifications, "jaeger": jaeger, "postmortem": _postmortem(incident),
            "history": history, "charts": views.history_charts(history, keys=INCIDENT_CHARTS, marks=shown), "fleet_node": FLEET_NODE,
            "cost": cost.Cost.from_json(incident.cost) if incident.cost else None, "cost_at": datetime.now(UTC),
        }

    async def cluster_page(self, request: web.Request) -> web.Response:
        hours = _hours(request, default=6)
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
            charts=charts, leaders=_leader_stretches(checks),
        )

    async def capacity_page(self, request: web.Request) -> web.Response:
        hours = _hours(request, default=6)
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
            raise _BadRequest(f"since must be one of {', '.join(COST_SPANS)}, not {span[:20]!r}")
        if by not in cost.BY:
            raise _BadRequest(f"by must be one of {', '.join(cost.BY)}, not {by[:20]!r}")
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

    async def healthz(self, request: web.Request) -> web.Response:
        return web.Response(text="ok\n")

    async def live(self, request: web.Request) -> web.StreamResponse:
        """Server-sent events: `change` when something was stored or sampled (at most every
        LIVE_EVERY_S), a comment every 15 s to keep proxies from closing the stream."""
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream", "Cache-Control": "no-cache"})
        await response.prepare(request)
        task = asyncio.current_task()
        self._streams.add(task)
        try:
            seen = self.changes.version
            while True:
                version = await self.changes.after(seen, 15.0)
                await response.write(f"event: change\ndata: {version}\n\n".encode() if version != seen else b": still here\n\n")
                seen = version
                await asyncio.sleep(LIVE_EVERY_S)
        finally:
            self._streams.discard(task)

    # --- operations ----------------------------------------------------------------------------

    async def login(self, request: web.Request) -> web.Response:
        form = await _same_origin_form(request)
        if not form.get("login_check") or form.get("login_check") != request.cookies.get(LOGIN_COOKIE):
            raise _BadRequest("the login form is stale; reload the page and log in again")
        client = self._client(request)
        wait_s = self.throttle.admit(client)
        if wait_s:
            log.warning("console: a login from %s was not tried: too many tries lately", client)
            raise web.HTTPTooManyRequests(text=f"too many login tries; try again in {wait_s:.0f}s",
                                          headers={"Retry-After": str(max(1, round(wait_s)))})
        try:
            session_id, session = self.auth.login(str(form.get("token", "")), str(form.get("name", "")))
        except AuthError as exc:
            await asyncio.sleep(self.throttle.wrong())  # a guessed token costs time, more while guesses come from everywhere
            log.warning("console: a login was refused from %s: %s", client, exc)
            raise web.HTTPForbidden(text=f"login refused: {exc}") from None
        self.throttle.succeeded(client)
        log.info("console: %s logged in from %s", session.name, client)
        response = _back(form, "/", f"logged in as {session.name}")
        response.set_cookie(SESSION_COOKIE, session_id, httponly=True, samesite="Strict", secure=self._secure(request), path="/")
        return response

    def _from_proxy(self, request: web.Request) -> bool:
        return request.remote is not None and request.remote in self.config.trusted_proxies

    def _client(self, request: web.Request) -> str:
        """Who tries to log in: the address a trusted proxy says it forwards for, else the peer's."""
        forwarded = request.headers.get("X-Forwarded-For", "")
        if forwarded and self._from_proxy(request):
            return forwarded.split(",")[-1].strip()[:64] or str(request.remote)
        return str(request.remote)

    def _secure(self, request: web.Request) -> bool:
        """Cookies are Secure when the console is reached over https: the request itself, the
        configured public URL, or what a trusted TLS-terminating proxy says it received."""
        return (
            request.secure
            or (self.config.public_url or "").startswith("https://")
            or (self._from_proxy(request) and request.headers.get("X-Forwarded-Proto", "").lower() == "https")
        )

    async def logout(self, request: web.Request) -> web.Response:
        form = await _same_origin_form(request)
        if self.auth.get(request.cookies.get(SESSION_COOKIE)) is None:
            response = _back(form, "/", "not logged in")  # nothing to end (expired, restarted, or never)
            response.del_cookie(SESSION_COOKIE, path="/")
            return response
        form, _ = await self._authorized(request)
        self.auth.logout(request.cookies.get(SESSION_COOKIE))
        response = _back(form, "/", "logged out")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def add_silence(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        try:
            minutes = float(form.get("minutes") or 0)
        except ValueError:
            raise _BadRequest(f"the silence was not set: minutes must be a number, not {str(form.get('minutes'))[:40]!r}") from None
        if not 0 < minutes <= 30 * 24 * 60:
            raise _BadRequest("the silence was not set: minutes must be above 0 and at most 30 days")
        try:
            gpu = form.get("gpu") or None
            now = datetime.now(UTC)
            event = SilenceAdded(
                source=SOURCE, silence_id=uuid.uuid4(), node_id=form.get("node") or None, kind=form.get("kind") or None,
                gpu_index=int(gpu) if gpu is not None else None, starts_at=now, ends_at=now + timedelta(minutes=minutes),
                matchers=tuple(Matcher.parse(m) for m in str(form.get("matchers") or "").split()),
                reason=str(form.get("reason") or "").strip(), created_by=who.name,
            )
        except ValueError as exc:  # pydantic's ValidationError included
            raise _BadRequest(f"the silence was not set: {_first_error(exc)}") from None
        await self._publish(event)
        log.info("console: %s silenced %s for %.0f min: %s", who.name, event.node_id or "every node", minutes, event.reason)
        return _back(form, "/ledger", f"silence {str(event.silence_id)[:8]} set")

    async def remove_silence(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        try:
            silence_id = uuid.UUID(request.match_info["id"])
        except ValueError:
            raise _BadRequest(f"{request.match_info['id']!r} is not a silence id") from None
        await self._publish(SilenceRemoved(source=SOURCE, silence_id=silence_id, removed_by=who.name))
        log.info("console: %s lifted silence %s", who.name, silence_id)
        return _back(form, "/ledger", f"silence {str(silence_id)[:8]} lifted")

    async def mark_false_positive(self, request: web.Request) -> web.Response:
        return await self._mark(request, "false_positive")

    async def acknowledge(self, request: web.Request) -> web.Response:
        return await self._mark(request, "acknowledged")

    async def _mark(self, request: web.Request, verdict: str) -> web.Response:
        form, who = await self._authorized(request)
        reason = str(form.get("reason") or "").strip() or (ACKNOWLEDGED_NOTE if verdict == "acknowledged" else "")
        if not reason or len(reason) > 1000:
            raise _BadRequest("say why it was a false positive (1 to 1000 characters)" if verdict == "false_positive"
                              else "a note of 1 to 1000 characters")
        incident_id = request.match_info["id"]
        async with self._db() as session:
            try:
                incident = await read.find_incident(session, id_prefix=str(uuid.UUID(incident_id)))
            except ValueError:
                raise _BadRequest(f"{incident_id!r} is not an incident id") from None
            if incident is None:
                raise web.HTTPNotFound(text=f"no incident {incident_id}")
            await repository.mark(session, incident_id=incident.id, verdict=verdict, reason=reason, by=who.name, now=datetime.now(UTC))
            await session.commit()
        log.info("console: %s %s incident %s: %s", who.name, mark_said(verdict), incident.id, reason)
        self.changes.bump()
        if verdict == "acknowledged":
            self._incident_changed()
        return _back(form, f"/incidents/{incident.id}", mark_said(verdict))

    async def reset_breaker(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        async with self._db() as session:
            trips = await breaker.reset(session=session, by=who.name, now=datetime.now(UTC))
            await session.commit()
        log.info("console: %s reset the breaker (%d trip(s))", who.name, len(trips))
        self._breaker_read_at = -BREAKER_READ_EVERY_S  # the banner goes at once
        self.changes.bump()
        return _back(form, "/ledger", "breaker reset" if trips else "the breaker was closed; nothing to reset")

    async def _authorized(self, request: web.Request) -> tuple:
        form = await _same_origin_form(request)
        try:
            return form, self.auth.authorize(request.cookies.get(SESSION_COOKIE), form.get("csrf"))
        except AuthError as exc:
            raise web.HTTPForbidden(text=str(exc)) from None

    # --- rendering ----------------------------------------------------------------------------

    @web.middleware
    async def _breaker_state(self, request: web.Request, handler):
        """Every page says when no action runs (a pause, or the breaker tripped): read at most every
        few seconds, and not for a store that does not answer (the page says that itself)."""
        if request.method == "GET" and time.monotonic() - self._breaker_read_at > BREAKER_READ_EVERY_S:
            try:
                async with self._db() as session:
                    self._breaker_trip = await breaker.open_trip(session=session)
                self._breaker_read_at = time.monotonic()
            except Exception:  # noqa: BLE001 - the page's own query says what is wrong with the store
                self._breaker_trip = None
        return await handler(request)

    def _page(self, request: web.Request, template: str, title: str, **context) -> web.Response:
        session: Session | None = self.auth.get(request.cookies.get(SESSION_COOKIE))
        login_check = request.cookies.get(LOGIN_COOKIE) or uuid.uuid4().hex
        html = self._templates.get_template(template).render(
            title=title, nav=NAV, path=request.path, session=session, writable=self.auth.writable, login_check=login_check,
            blind=self.blind(datetime.now(UTC)), stopped=self._breaker_trip,
            done=request.query.get("done", "")[:200], here=request.path_qs, now=datetime.now(UTC), **context,
        )
        response = web.Response(text=html, content_type="text/html")
        if not request.cookies.get(LOGIN_COOKIE):
            response.set_cookie(LOGIN_COOKIE, login_check, httponly=True, samesite="Strict", secure=self._secure(request), path="/")
        return response

    @web.middleware
    async def _errors(self, request: web.Request, handler):
        try:
            return await handler(request)
        except _BadRequest as exc:
            return self._error(request, 400, str(exc))
        except web.HTTPException as exc:
            if exc.status < 400:
                raise
            response = self._error(request, exc.status, exc.text or exc.reason)
            if "Retry-After" in exc.headers:
                response.headers["Retry-After"] = exc.headers["Retry-After"]
            return response
        except (StoreUnavailable, OSError) as exc:
            log.warning("console: %s %s failed: %r", request.method, request.path, exc)
            return self._error(request, 503, f"the store cannot be read now ({type(exc).__name__}); the page will try again")

    def _error(self, request: web.Request, status: int, message: str) -> web.Response:
        if request.path == "/live" or request.method != "GET":
            return web.Response(status=status, text=message + "\n")
        response = self._page(request, "error.html", "Error", status=status, message=message)
        response.set_status(status)
        return response


class _BadRequest(Exception):
    """Bad input from the browser: a 400 page that says what was wrong."""


@web.middleware
async def _headers(request: web.Request, handler):
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers.setdefault("Cache-Control", "no-store")
    return response


async def _same_origin_form(request: web.Request):
    """The form of a write, refused when the browser says it comes from another origin."""
    origin = request.headers.get("Origin") or request.headers.get("Referer")
    if origin:  # "null" too: a sandboxed or opaque origin is not this site
        parts = urlsplit(origin)
        if f"{parts.scheme}://{parts.netloc}" != f"{request.scheme}://{request.host}":
            raise web.HTTPForbidden(text=f"a write from another origin ({origin[:100]}) is refused")
    return await request.post()


def _back(form, default: str, done: str) -> web.Response:
    """See other: back to the page the form was on (a path of this site only), saying what was done."""
    target = str(form.get("back") or default)
    if not _console_path(target):
        target = default
    target = target.split("?")[0] if "done=" in target else target
    joiner = "&" if "?" in target else "?"
    return web.Response(status=303, headers={"Location": f"{target}{joiner}{urlencode({'done': done})}"})


def _console_path(target: str) -> bool:
    """Whether `target` is a path of this console and nothing a browser could read as another site:
    browsers take `/\\host` and `\\\\host` as `//host`, and drop tabs and newlines inside a URL."""
    if not target.startswith("/") or any(c in target for c in "\\\t\r\n") or not target.isprintable():
        return False
    parts = urlsplit(target)
    return not target.startswith("//") and not parts.scheme and not parts.netloc


def _first_error(exc: Exception) -> str:
    errors = getattr(exc, "errors", None)
    if callable(errors):
        first = errors()[0]
        where = ".".join(str(p) for p in first.get("loc", ())) or "input"
        return f"{where}: {first.get('msg')}"
    return str(exc)


def _hours(request: web.Request, *, default: float) -> float:
    raw = request.query.get("hours") or str(default)
    try:
        hours = float(raw)
    except ValueError:
        raise _BadRequest(f"hours must be a number, not {raw[:40]!r}") from None
    if not 0 < hours <= 24 * 90:
        raise _BadRequest("hours must be above 0 and at most 90 days")
    return hours


def _leader_stretches(checks) -> list[tuple[datetime, datetime, str | None]]:
    """(from, to, leader) for each stretch of checks that saw the same leader (None: no leader)."""
    stretches: list[tuple[datetime, datetime, str | None]] = []
    for check in checks:
        if stretches and stretches[-1][2] == check.leader:
            stretches[-1] = (stretches[-1][0], check.checked_at, check.leader)
        else:
            stretches.append((check.checked_at, check.checked_at, check.leader))
    return stretches


POSTMORTEM_ORDER = ("container", "image", "exit_code", "signal", "engine_signal", "oom_killed", "oom_pid", "oom_constraint",
                    "oom_kernel_line", "last_lines", "container_id")
"""The facts of a container's death in the order an operator asks for them."""


def _postmortem(incident) -> list[tuple[str, str]] | None:
    """Why a container died, as facts (the named cause first); None for other kinds."""
    if incident.kind != IncidentKind.CONTAINER_DIED.value:
        return None
    evidence = incident.evidence or {}
    facts = [(k.replace("_", " "), str(evidence[k])) for k in POSTMORTEM_ORDER if evidence.get(k) not in (None, "")]
    facts += [(k.replace("_", " "), str(v)) for k, v in evidence.items() if k not in POSTMORTEM_ORDER and v not in (None, "")]
    diagnosis = incident.diagnosis or {}
    if diagnosis:
        facts.insert(0, ("cause", f"{str(diagnosis.get('cause', '?')).replace('_', ' ')} "
                                  f"({float(diagnosis.get('confidence', 0)):.0%} sure): {diagnosis.get('explanation', '')}"))
    return facts


INCIDENT_CHARTS = ("host_memory", "gpu_util", "gpu_memory", "disks", "host_load", "gpu_temperature")
"""The node's figures an incident page shows, in this order (the node page shows them all)."""
BEFORE_INCIDENT = timedelta(hours=1)
AFTER_INCIDENT = timedelta(minutes=15)


def _around(incident, now: datetime) -> tuple[datetime, datetime]:
    """The window an incident page charts: the hour before it opened to a while after it closed
    (or now), at most a day from its start."""
    start = incident.opened_at - BEFORE_INCIDENT
    end = min((incident.closed_at or now) + AFTER_INCIDENT, now, start + timedelta(days=1))
    return start, max(end, incident.opened_at + timedelta(minutes=1))


def _node_id(request: web.Request) -> str:
    node = request.match_info["node"]
    if not is_subject_token(node):
        raise _BadRequest(f"{node[:80]!r} is not a node id (letters, digits, '-' and '_', at most 63)")
    return node


def _gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


def _when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def duration(value: timedelta | float | None) -> str:
    """A span of time as a person says it: 1 h 30 min, 4 min 12 s, 12 s (never 0:01:30.002000)."""
    if value is None:
        return "-"
    seconds = round(value.total_seconds() if isinstance(value, timedelta) else float(value))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def _ago(value: datetime | None) -> str:
    if value is None:
        return "never"
    seconds = (datetime.now(UTC) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


class _ChartData(Markup):
    """Charts' JSON, its text masked already, label by label, where it was made (views)."""


def _chart_json(charts: list[dict]) -> _ChartData:
    # tens of thousands of numbers: masking the whole text again would cost more than the page
    return _ChartData(htmlsafe_json_dumps(charts, separators=(",", ":")))


def _masked(value: object) -> object:
    """Every value a page shows passes here (jinja2's finalize): job text is masked however old the
    row it comes from (gpumedic_events.redact)."""
    if not isinstance(value, str) or isinstance(value, _ChartData):
        return value
    # Markup (already escaped HTML, e.g. `tojson`) stays Markup, or it would be escaped twice.
    return type(value)(redact(str(value))) if hasattr(value, "__html__") else redact(value)
