"""The writes: logging in and out, silences, a false positive or an acknowledgement, the breaker's
reset, a fleet operation (through the remediator's gate). Each needs a session and its CSRF token,
and a same-origin request."""

from __future__ import annotations

import asyncio
import logging
import re
import uuid
from datetime import UTC, datetime, timedelta

import nats.errors
from aiohttp import web

from gpumedic_events import ACKNOWLEDGED_NOTE, ROLLOUT_SUBJECT, EventDecodeError, Matcher, RolloutReport, RolloutRequest, SilenceAdded, SilenceRemoved
from gpumedic_events.silence import mark_said
from gpumedic_store import breaker
from gpumedic_store import views as read
from report_builder import repository
from report_builder.console.auth import LOGIN_COOKIE, SESSION_COOKIE, AuthError
from report_builder.console.forms import BadRequest, back_to, first_error, same_origin_form

log = logging.getLogger(__name__)

SOURCE = "report-builder-console"
ROLLOUT_WAIT_S = 1800.0
"""How long the page waits for a fleet operation (each batch's actions are verified before the next)."""


def _token(name: str) -> str:
    """Who asks, as the audit log keeps it (a subject token)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", name).strip("-_")[:63] or "console"


class Operations:
    """Mixed into `Console`: the writes (see the module)."""

    # --- operations ----------------------------------------------------------------------------

    async def login(self, request: web.Request) -> web.Response:
        form = await same_origin_form(request)
        if not form.get("login_check") or form.get("login_check") != request.cookies.get(LOGIN_COOKIE):
            raise BadRequest("the login form is stale; reload the page and log in again")
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
        response = back_to(form, "/", f"logged in as {session.name}")
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
        form = await same_origin_form(request)
        if self.auth.get(request.cookies.get(SESSION_COOKIE)) is None:
            response = back_to(form, "/", "not logged in")  # nothing to end (expired, restarted, or never)
            response.del_cookie(SESSION_COOKIE, path="/")
            return response
        form, _ = await self._authorized(request)
        self.auth.logout(request.cookies.get(SESSION_COOKIE))
        response = back_to(form, "/", "logged out")
        response.del_cookie(SESSION_COOKIE, path="/")
        return response

    async def add_silence(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        try:
            minutes = float(form.get("minutes") or 0)
        except ValueError:
            raise BadRequest(f"the silence was not set: minutes must be a number, not {str(form.get('minutes'))[:40]!r}") from None
        if not 0 < minutes <= 30 * 24 * 60:
            raise BadRequest("the silence was not set: minutes must be above 0 and at most 30 days")
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
            raise BadRequest(f"the silence was not set: {first_error(exc)}") from None
        await self._publish(event)
        log.info("console: %s silenced %s for %.0f min: %s", who.name, event.node_id or "every node", minutes, event.reason)
        return back_to(form, "/ledger", f"silence {str(event.silence_id)[:8]} set")

    async def remove_silence(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        try:
            silence_id = uuid.UUID(request.match_info["id"])
        except ValueError:
            raise BadRequest(f"{request.match_info['id']!r} is not a silence id") from None
        await self._publish(SilenceRemoved(source=SOURCE, silence_id=silence_id, removed_by=who.name))
        log.info("console: %s lifted silence %s", who.name, silence_id)
        return back_to(form, "/ledger", f"silence {str(silence_id)[:8]} lifted")

    async def mark_false_positive(self, request: web.Request) -> web.Response:
        return await self._mark(request, "false_positive")

    async def acknowledge(self, request: web.Request) -> web.Response:
        return await self._mark(request, "acknowledged")

    async def _mark(self, request: web.Request, verdict: str) -> web.Response:
        form, who = await self._authorized(request)
        reason = str(form.get("reason") or "").strip() or (ACKNOWLEDGED_NOTE if verdict == "acknowledged" else "")
        if not reason or len(reason) > 1000:
            raise BadRequest("say why it was a false positive (1 to 1000 characters)" if verdict == "false_positive"
                              else "a note of 1 to 1000 characters")
        incident_id = request.match_info["id"]
        async with self._db() as session:
            try:
                incident = await read.find_incident(session, id_prefix=str(uuid.UUID(incident_id)))
            except ValueError:
                raise BadRequest(f"{incident_id!r} is not an incident id") from None
            if incident is None:
                raise web.HTTPNotFound(text=f"no incident {incident_id}")
            await repository.mark(session, incident_id=incident.id, verdict=verdict, reason=reason, by=who.name, now=datetime.now(UTC))
            await session.commit()
        log.info("console: %s %s incident %s: %s", who.name, mark_said(verdict), incident.id, reason)
        self.changes.bump()
        if verdict == "acknowledged":
            self._incident_changed()
        return back_to(form, f"/incidents/{incident.id}", mark_said(verdict))

    async def reset_breaker(self, request: web.Request) -> web.Response:
        form, who = await self._authorized(request)
        async with self._db() as session:
            trips = await breaker.reset(session=session, by=who.name, now=datetime.now(UTC))
            await session.commit()
        log.info("console: %s reset the breaker (%d trip(s))", who.name, len(trips))
        self._breaker_read_at = float("-inf")  # read again at once: the banner goes
        self.changes.bump()
        return back_to(form, "/ledger", "breaker reset" if trips else "the breaker was closed; nothing to reset")

    async def run_rollout(self, request: web.Request) -> web.Response:
        """One operation on many nodes (or the provider's workers), batch by batch, as `gpumedic
        rollout` runs it: asked of the remediator, whose gate decides each node's action."""
        form, who = await self._authorized(request)
        if self._ask is None:
            raise web.HTTPServiceUnavailable(text="this console is not connected to the bus: use `gpumedic rollout`")
        listed = lambda name: tuple(w for w in re.split(r"[\s,]+", str(form.get(name) or "")) if w)  # noqa: E731
        try:
            ask = RolloutRequest(
                operation=str(form.get("operation") or ""), unit=str(form.get("unit") or "").strip() or None,
                nodes=listed("nodes"), workers=listed("workers"), batch=int(str(form.get("batch") or "1")),
                dry_run=form.get("dry_run") == "on", requested_by=_token(who.name),
            )
        except ValueError as exc:  # pydantic's ValidationError included
            raise BadRequest(f"nothing ran: {first_error(exc)}") from None
        log.info("console: %s asks the remediator for a %s%s", who.name, ask.operation, " (dry run)" if ask.dry_run else "")
        try:
            report = RolloutReport.from_json(await self._ask(ROLLOUT_SUBJECT, ask.to_json(), ROLLOUT_WAIT_S))
        except (TimeoutError, nats.errors.Error, EventDecodeError) as exc:
            raise web.HTTPServiceUnavailable(text=f"no answer from the remediator ({type(exc).__name__}: {exc}); "
                                             "`gpumedic actions` lists what ran") from None
        self.changes.bump()
        return self._page(request, "rollout.html", "Fleet operation", report=report, asked=ask)

    async def _authorized(self, request: web.Request) -> tuple:
        form = await same_origin_form(request)
        try:
            return form, self.auth.authorize(request.cookies.get(SESSION_COOKIE), form.get("csrf"))
        except AuthError as exc:
            raise web.HTTPForbidden(text=str(exc)) from None
