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

import jinja2
from aiohttp import web
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_events import ContainerUsage, Event, NodeSampled, ServiceHeartbeat, TopProcess
from gpumedic_store import StoreUnavailable, breaker
from gpumedic_store import views as read
from report_builder.console import views
from report_builder.console.auth import LOGIN_COOKIE, SESSION_COOKIE, LoginThrottle, Session, Sessions
from report_builder.console.fleet_pages import FleetPages
from report_builder.console.format import ago, chart_json, duration, gib, masked, when
from report_builder.console.forms import BadRequest
from report_builder.console.incident_pages import IncidentPages
from report_builder.console.operations import Operations
from report_builder.console.record_pages import RecordPages
from report_builder.history import PrometheusHistory

log = logging.getLogger(__name__)

HERE = Path(__file__).parent
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


class Console(FleetPages, IncidentPages, RecordPages, Operations):
    """The console: its state (the latest readings, heartbeats, sessions), its routes and serving,
    and what every page shares (`_page`, errors, the breaker's banner); the pages and the writes
    are mixed in from one module each."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        config: ConsoleConfig,
        *,
        publish: Callable[[Event], Awaitable[None]],
        latest: Callable[[str], Awaitable[NodeSampled | None]] | None = None,
        prometheus: PrometheusHistory | None = None,
        incident_changed: Callable[[], None] | None = None,
        ask: Callable[[str, bytes, float], Awaitable[bytes]] | None = None,
    ) -> None:
        """`latest` reads a node's last sample from the samples stream (None: the node page shows
        only what the store has); `prometheus`, where set, gives the GPU charts; `incident_changed`
        is told of an acknowledgement (Alertmanager shows it); `ask` sends a request to the
        remediator and returns its reply (a fleet operation; None: the console runs none)."""
        self._ask = ask
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
        self.container_usage: dict[str, tuple[datetime, tuple[ContainerUsage, ...]]] = {}
        """Each node's containers' CPU and memory as its sampler last sent them (every 30 s), for its page."""
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
            finalize=masked,
        )
        self._templates.filters["when"] = when
        self._templates.filters["ago"] = ago
        self._templates.filters["duration"] = duration
        self._templates.filters["span_status"] = read.span_status
        self._templates.filters["gib"] = gib
        self._templates.filters["chart_json"] = chart_json

    # --- inputs from report-builder's handlers -----------------------------------------------

    async def on_sample(self, sample: NodeSampled) -> None:
        self.readings[sample.node_id] = views.NodeReading.of(sample)
        if sample.host.top_processes:
            self.tops[sample.node_id] = (sample.occurred_at, sample.host.top_processes)
        if sample.host.containers:
            self.container_usage[sample.node_id] = (sample.occurred_at, sample.host.containers)
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
            web.post("/rollouts", self.run_rollout),
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
        except BadRequest as exc:
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


@web.middleware
async def _headers(request: web.Request, handler):
    response = await handler(request)
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Referrer-Policy"] = "same-origin"
    response.headers.setdefault("Cache-Control", "no-store")
    return response
