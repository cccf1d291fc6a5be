"""Escalations reach a person: a generic JSON webhook and a Slack-compatible incoming webhook;
and when an escalated incident is resolved, whoever was told of it is told it is over.

The escalation is recorded and its notifications queued in one transaction (the `notifications`
outbox, one row per incident and channel), so a redelivered escalation is told once and a crash
loses none. This loop delivers what is due. It waits `wait_s` after the escalation first, as
Alertmanager's group_wait does: a node incident that turns out to be part of a fleet incident is
told once, through the fleet incident, and one that cleared meanwhile is not told at all.

A delivery round retries transient failures (connection errors, timeouts, 408, 429, 5xx) with
exponential back-off and jitter (`gpumedic_webhook`); a round that still fails is tried again
later, less often, until `give_up_s` after the escalation. A 4xx answer means the channel is
misconfigured: it fails at once, with the status in the row and the log. The URL (for Slack, the
secret itself) and the bearer token never reach a payload, a log line or the store: errors name
the host only.
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Literal

import httpx
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_events.redact import redact, redact_tree
from gpumedic_store import Incident, Notification
from gpumedic_webhook import DeliveryError, host_of, post_with_retries
from report_builder import repository

log = logging.getLogger(__name__)

Format = Literal["json", "slack"]
SEVERITY_RANK = {"info": 0, "warning": 1, "critical": 2}
MAX_EVIDENCE_CHARS = 4000
"""Evidence beyond this is cut: a notification points at the incident, it does not replace it."""
ROUND_BACKOFF_S = (30, 60, 120, 300, 900)
"""Between delivery rounds that failed, by round; the last repeats until give-up."""


@dataclass(frozen=True)
class Channel:
    """Where escalations go. `url` and `token` are secrets: never printed, logged or stored."""

    name: str
    format: Format
    url: str
    token: str | None = None

    @property
    def host(self) -> str:
        """The only part of the URL that may be shown."""
        return host_of(self.url)

    def __repr__(self) -> str:
        return f"Channel({self.name!r}, {self.format}, host={self.host!r})"


# --- what is sent -----------------------------------------------------------------------------

def _evidence(incident: Incident) -> dict[str, Any]:
    evidence = redact_tree(incident.evidence or {})
    text = json.dumps(evidence, default=str)
    if len(text) <= MAX_EVIDENCE_CHARS:
        return evidence
    return {"truncated": text[:MAX_EVIDENCE_CHARS] + "..."}


def incident_link(console_url: str | None, incident_id: str) -> str | None:
    return f"{console_url.rstrip('/')}/incidents/{incident_id}" if console_url else None


def json_payload(incident: Incident, reason: str, *, console_url: str | None, event: str = "escalated") -> dict[str, Any]:
    """The generic webhook's body (documented in the README; `version` changes only with a break).
    For an escalation `reason` is why a person is needed; for its end, how it ended."""
    diagnosis = redact_tree(incident.diagnosis) if incident.diagnosis else None
    body = {
        "version": 1,
        "event": f"incident.{event}",
        "incident": {
            "id": incident.id,
            "kind": incident.kind,
            "node_id": incident.node_id,
            "gpu_index": incident.gpu_index,
            "severity": incident.severity,
            "status": incident.status,
            "summary": redact(incident.summary),
            "why_a_person": redact(reason),
            "cause": diagnosis,
            "recommended_action": redact(incident.recommended_action),
            "evidence": _evidence(incident),
            "occurrences": incident.occurrences,
            "detector": incident.detector,
            "opened_at": incident.opened_at.isoformat(),
            "escalated_at": incident.closed_at.isoformat() if incident.closed_at else None,
            "trace_id": incident.trace_id,
        },
        "link": incident_link(console_url, incident.id),
        "cli": f"gpumedic incidents {incident.id}",
    }
    if event == "resolved":
        body["incident"] |= {"why_a_person": None, "resolution": incident.resolution, "how_it_ended": redact(reason),
                             "resolved_at": incident.closed_at.isoformat() if incident.closed_at else None}
    return body


def _slack_escape(text: str) -> str:
    # Slack's mrkdwn gives &, < and > meaning; a hostile job name must not become a link or a mention.
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack_payload(incident: Incident, reason: str, *, console_url: str | None, event: str = "escalated") -> dict[str, Any]:
    """A Slack-compatible incoming-webhook body (`text`, mrkdwn); Mattermost and others accept it too."""
    where = incident.node_id + (f" GPU {incident.gpu_index}" if incident.gpu_index is not None else "")
    link = incident_link(console_url, incident.id)
    if event == "resolved":
        lines = [f"*[resolved] {incident.kind} on {_slack_escape(where)}*: {_slack_escape(redact(reason))}",
                 f"<{link}|incident {incident.id[:8]}>" if link else f"`gpumedic incidents {incident.id}`"]
        return {"text": "\n".join(lines)}
    lines = [
        f"*[{incident.severity}] {incident.kind} on {_slack_escape(where)}*: {_slack_escape(redact(incident.summary))}",
        f"*Why a person:* {_slack_escape(redact(reason))}",
    ]
    if incident.diagnosis:
        cause = redact_tree(incident.diagnosis)
        lines.append(f"*Cause:* {_slack_escape(str(cause.get('cause', '?')))} ({_slack_escape(str(cause.get('explanation', '')))})")
    if incident.recommended_action:
        lines.append(f"*Do:* {_slack_escape(redact(incident.recommended_action))}")
    evidence = ", ".join(f"{k}={v}" for k, v in _evidence(incident).items() if v not in (None, ""))
    if evidence:
        lines.append(f"*Evidence:* {_slack_escape(evidence[:1500])}")
    link = incident_link(console_url, incident.id)
    lines.append(f"<{link}|incident {incident.id[:8]}>" if link else f"`gpumedic incidents {incident.id}`")
    return {"text": "\n".join(lines)}


PAYLOADS: dict[Format, Callable[..., dict[str, Any]]] = {"json": json_payload, "slack": slack_payload}


# --- how it is sent ---------------------------------------------------------------------------


class Notifier:
    """Delivers the outbox's due notifications; one instance per report-builder process."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        channels: Sequence[Channel],
        *,
        console_url: str | None = None,
        give_up_s: float = 86_400,
        min_severity: str = "warning",
        tries_per_round: int = 3,
        retry_initial_s: float = 0.5,
        timeout_s: float = 10.0,
        poll_s: float = 1.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._sessions = sessions
        self._channels = {c.name: c for c in channels}
        self._console_url = console_url
        self._give_up = timedelta(seconds=give_up_s)
        self._min_rank = SEVERITY_RANK[min_severity]
        self._tries = tries_per_round
        self._retry_initial_s = retry_initial_s
        self._timeout_s = timeout_s
        self._poll_s = poll_s
        self._clock = clock

    async def loop(self) -> None:
        async with httpx.AsyncClient(timeout=self._timeout_s, follow_redirects=False) as client:
            while True:
                try:
                    await self.deliver_due(client)
                except Exception:  # noqa: BLE001 - a store outage must not end the loop; rows stay due
                    log.exception("delivering notifications failed; trying again in %gs", self._poll_s)
                await asyncio.sleep(self._poll_s)

    async def deliver_due(self, client: httpx.AsyncClient) -> int:
        """Deliver every notification due now; returns how many rows were settled or rescheduled."""
        now = self._clock()
        async with self._sessions() as session:
            due = await repository.due_notifications(session, now=now)
        handled = 0
        for row in due:
            # Another instance may have taken the row since we read it: claim it first.
            async with self._sessions() as session:
                claimed = await repository.claim_notification(session, row=row, until=now + timedelta(seconds=self._timeout_s * self._tries * 2))
                await session.commit()
            if claimed:
                await self._deliver(client, row, now)
                handled += 1
        return handled

    async def _deliver(self, client: httpx.AsyncClient, row: Notification, now: datetime) -> None:
        async with self._sessions() as session:
            incident = await session.get(Incident, row.incident_id)
            told = None
            if row.event == "resolved":
                told = await session.get(Notification, (row.incident_id, row.channel, "escalated"))
        if told is not None and told.status == "pending":  # its escalation is still waiting, or being told now
            async with self._sessions() as session:
                await repository.reschedule_notification(session, row=row, due_at=now + timedelta(seconds=5 * self._poll_s),
                                                         attempts=row.attempts, detail="waits for its escalation to be told first")
                await session.commit()
            return
        channel = self._channels.get(row.channel)
        skip = self._skip_end(incident, channel, told) if row.event == "resolved" else self._skip_reason(incident, channel)
        if skip:
            await self._settle(row, "skipped", skip, attempts=row.attempts)  # nothing was sent
            log.info("notification of incident %s to %s skipped: %s", row.incident_id, row.channel, skip)
            return
        assert incident is not None and channel is not None  # _skip_reason said so
        body = PAYLOADS[channel.format](incident, row.reason, console_url=self._console_url, event=row.event)
        try:
            await post_with_retries(
                client, channel.url, body, token=channel.token, tries=self._tries, initial_s=self._retry_initial_s
            )
        except DeliveryError as exc:
            await self._failed_round(row, channel, str(exc), transient=exc.transient, now=now)
            return
        await self._settle(row, "delivered", f"delivered to {channel.host}")
        log.info("incident %s %s: told %s (%s)", row.incident_id, row.event, channel.name, channel.host)

    def _skip_reason(self, incident: Incident | None, channel: Channel | None) -> str:
        if channel is None:
            return "the channel is no longer configured"
        if incident is None:
            return "the incident is not in the store"
        if incident.related_incident_id:
            return f"part of fleet incident {incident.related_incident_id}, which is told instead"
        if incident.status != "escalated":
            return f"the incident was {incident.status} before anyone was told"
        if SEVERITY_RANK.get(incident.severity, 1) < self._min_rank:
            return f"severity {incident.severity} is below the notification threshold"
        return ""

    @staticmethod
    def _skip_end(incident: Incident | None, channel: Channel | None, told: Notification | None) -> str:
        if channel is None:
            return "the channel is no longer configured"
        if incident is None:
            return "the incident is not in the store"
        if incident.status != "resolved":
            return f"the incident is {incident.status} again"
        if told is None or told.status != "delivered":
            return "its escalation was not told here" + (f" ({told.status})" if told is not None else "")
        return ""

    async def _failed_round(self, row: Notification, channel: Channel, error: str, *, transient: bool, now: datetime) -> None:
        rounds = row.attempts + 1
        if not transient or now - row.created_at >= self._give_up:
            why = error if not transient else f"{error}; gave up after {rounds} round(s)"
            log.error("notification of incident %s to %s failed: %s", row.incident_id, channel.name, why)
            await self._settle(row, "failed", why, attempts=rounds)
            return
        wait = ROUND_BACKOFF_S[min(rounds, len(ROUND_BACKOFF_S)) - 1]
        log.warning("notification of incident %s to %s: %s; next round in %ds", row.incident_id, channel.name, error, wait)
        async with self._sessions() as session:
            await repository.reschedule_notification(session, row=row, due_at=now + timedelta(seconds=wait), attempts=rounds, detail=error)
            await session.commit()

    async def _settle(self, row: Notification, status: str, detail: str, *, attempts: int | None = None) -> None:
        async with self._sessions() as session:
            await repository.settle_notification(
                session, row=row, status=status, detail=detail, now=self._clock(), attempts=row.attempts + 1 if attempts is None else attempts
            )
            await session.commit()
