"""Incidents as Alertmanager alerts, for operators who route their alerts there already (Slack,
PagerDuty, e-mail; grouping, inhibition and silences as they configured them).

Every `every_s`, and within a second of an incident recorded (`poke`), one report-builder
instance (the `alertmanager` lease) posts to each configured
Alertmanager's API v2 (`POST /api/v2/alerts`) every incident not resolved, as a firing alert
whose `endsAt` lies a few rounds ahead (were gpumedic to stop, Alertmanager resolves it by
itself rather than keep it firing for ever), and every incident resolved lately with its real
`endsAt`: Alertmanager keeps the latest word about each alert, so a round said again changes
nothing and no state is kept here. An incident under one of gpumedic's own silences is not sent.

Labels identify an alert, so they hold what does not change during an incident: `alertname`
(the kind), `node`, `gpu`, `severity`, `incident` (its id: a fault that comes back is a new
alert) and `source="gpumedic"`. Annotations hold the rest: summary, status, the named cause, the
next step, who acknowledged it, and the console's page of the incident (also the alert's `generatorURL`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import httpx
from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_events.silence import said_by_a_person
from gpumedic_store import views
from gpumedic_store.models import Incident, IncidentMark
from gpumedic_webhook import DeliveryError, host_of, post

log = logging.getLogger(__name__)

EVERY_S = 30.0
"""How often every open incident is said again: Alertmanager asks for 30 s to 3 min."""
ROUNDS_AHEAD = 4
"""A firing alert's endsAt lies this many rounds ahead."""
POKED_AFTER_S = 0.5
"""A round this long after an incident was recorded."""
RESOLVED_FOR = timedelta(minutes=10)
"""How long an incident's resolution is said again (an Alertmanager that was away hears it too)."""


def alert_of(incident: Incident, now: datetime, *, console_url: str | None, every_s: float, acknowledged: IncidentMark | None = None) -> dict:
    """One incident as an alert of Alertmanager's API v2 (an acknowledgement as annotations: who,
    since when, their note)."""
    labels = {"alertname": incident.kind, "node": incident.node_id, "severity": incident.severity,
              "incident": incident.id, "source": "gpumedic"}
    if incident.gpu_index is not None:
        labels["gpu"] = str(incident.gpu_index)
    cause = (incident.diagnosis or {}).get("cause")
    annotations = {"summary": incident.summary or f"{incident.kind} on {incident.node_id}", "status": incident.status}
    if cause:
        annotations["cause"] = str(cause)
    if incident.recommended_action:
        annotations["next_step"] = incident.recommended_action
    if acknowledged is not None:
        # Masked again: a note stored before acknowledgements were masked (IncidentMarked's own check).
        annotations["acknowledged_by"] = said_by_a_person(acknowledged.marked_by)
        annotations["acknowledged_at"] = _rfc3339(acknowledged.marked_at)
        annotations["acknowledged_note"] = said_by_a_person(acknowledged.reason)
    page = f"{console_url.rstrip('/')}/incidents/{incident.id}" if console_url else ""
    if page:
        annotations["console"] = page
    resolved = incident.status == "resolved"
    ends = (incident.closed_at or now) if resolved else now + timedelta(seconds=every_s * ROUNDS_AHEAD)
    alert = {"labels": labels, "annotations": annotations, "startsAt": _rfc3339(incident.opened_at), "endsAt": _rfc3339(ends)}
    if page:
        alert["generatorURL"] = page
    return alert


def _rfc3339(at: datetime) -> str:
    return at.astimezone(UTC).isoformat().replace("+00:00", "Z")


class AlertmanagerPush:
    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        urls: Sequence[str],
        *,
        console_url: str | None = None,
        every_s: float = EVERY_S,
        timeout_s: float = 5.0,
        now: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._db = sessions
        self.urls = [url.rstrip("/") for url in urls]
        self.console_url = console_url
        self.every_s = every_s
        self.timeout_s = timeout_s
        self._now = now
        self._failing: set[str] = set()
        """Alertmanagers whose last post failed: said once, and again when they answer."""
        self._poked = asyncio.Event()

    def poke(self) -> None:
        """Something was recorded: a round soon, not at the next tick."""
        self._poked.set()

    async def alerts(self) -> list[dict]:
        """Every alert a round posts now."""
        now = self._now()
        async with self._db() as session:
            incidents = (await session.scalars(
                select(Incident).where(
                    Incident.silence_id.is_(None),
                    or_(Incident.status != "resolved", Incident.closed_at >= now - RESOLVED_FOR),
                ).order_by(Incident.opened_at)
            )).all()
            acks = await views.acknowledgements(session, incident_ids=[i.id for i in incidents])
        return [alert_of(i, now, console_url=self.console_url, every_s=self.every_s, acknowledged=acks.get(i.id)) for i in incidents]

    async def round(self) -> int:
        """Post the alerts to every Alertmanager; how many it took."""
        alerts = await self.alerts()
        if not alerts:
            return 0
        took = 0
        async with httpx.AsyncClient(timeout=self.timeout_s, follow_redirects=False) as client:
            for url in self.urls:
                try:
                    await post(client, f"{url}/api/v2/alerts", alerts)
                except DeliveryError as exc:  # names the host only: a URL may carry a password
                    if url not in self._failing:
                        log.warning("alertmanager: %s did not take %d alert(s) (%s); trying again every %gs",
                                    host_of(url), len(alerts), exc, self.every_s)
                    self._failing.add(url)
                    continue
                if url in self._failing:
                    log.info("alertmanager: %s takes alerts again", host_of(url))
                    self._failing.discard(url)
                took += 1
        return took

    async def loop(self) -> None:
        while True:
            self._poked.clear()
            try:
                await self.round()
            except Exception as exc:  # the store down: the next round says it all again
                log.warning("alertmanager: no round (%s: %s)", type(exc).__name__, exc)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.every_s):
                    await self._poked.wait()
                await asyncio.sleep(POKED_AFTER_S)  # what else the same moment records comes in the same round
