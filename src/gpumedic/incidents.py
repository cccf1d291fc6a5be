"""What `gpumedic incidents` prints: the incident list, and one incident's timeline and trace,
read from the store report-builder keeps."""

from __future__ import annotations

import asyncio
import time
import uuid
from collections.abc import Callable

from gpumedic.operator_bus import SOURCE, publish
from gpumedic.output import clip, fmt_time, table, to_json
from gpumedic_bus import NatsSettings
from gpumedic_events import IncidentMarked
from gpumedic_events.redact import redact
from gpumedic_events.silence import mark_said
from gpumedic_store import views


async def incidents_text(store_url: str, *, status: str | None = None, limit: int = 50, as_json: bool = False) -> str:
    async with views.store_session(store_url) as session:
        rows = await views.list_incidents(session, where=views.IncidentFilter(status=status), limit=limit)
    if as_json:
        return to_json(rows)
    if not rows:
        return "no incidents recorded" + (f" with status {status}" if status else "")
    return table(
        ["INCIDENT", "STATUS", "KIND", "NODE/GPU", "OPENED", "SUMMARY"],
        [[i.id[:8], i.status, i.kind, f"{i.node_id}/{i.gpu_index}" if i.gpu_index is not None else i.node_id, fmt_time(i.opened_at),
          clip(i.summary, 80)] for i in rows],
    )


async def incident_text(store_url: str, id_prefix: str, *, as_json: bool = False) -> tuple[bool, str]:
    """(found, text): one incident's page for a terminal, or what was not found."""
    async with views.store_session(store_url) as session:
        incident = await views.find_incident(session, id_prefix=id_prefix)
        if incident is None:
            return False, f"no incident whose id starts with {id_prefix!r}"
        timeline = await views.incident_timeline(session, incident_id=incident.id)
        spans = await views.trace_spans(session, trace_id=incident.trace_id) if incident.trace_id else []
        marks = await views.marks_of(session, incident_id=incident.id)
        notifications = await views.notifications_of(session, incident_id=incident.id)
    if as_json:
        return True, to_json({"incident": incident, "timeline": timeline, "trace": spans, "marks": marks, "notifications": notifications})
    lines = [
        f"incident {incident.id}  [{incident.status}{' ' + incident.resolution if incident.resolution else ''}]",
        f"  {incident.kind} on {incident.node_id}" + (f" GPU {incident.gpu_index}" if incident.gpu_index is not None else "")
        + f"  ({incident.severity}, by {incident.detector or '?'}"
        + (f", seen {incident.occurrences} times" if incident.occurrences > 1 else "")
        + ")",
        f"  {incident.summary}",
    ]
    lines += _diagnosis(incident)
    if incident.recommended_action:
        lines.append(f"  recommended: {incident.recommended_action}")
    if incident.related_incident_id:
        lines.append(f"  part of incident {incident.related_incident_id}")
    if incident.silence_id:
        lines.append(f"  silenced by {incident.silence_id}: recorded, no action requested")
    for mark in marks:
        lines.append(f"  {mark_said(mark.verdict)} by {mark.marked_by} at {fmt_time(mark.marked_at)}: {mark.reason}")
    for n in notifications:
        when = fmt_time(n.finished_at) if n.finished_at else f"next try {fmt_time(n.due_at)}"
        lines.append(f"  notified {n.channel} ({n.event}): {n.status} ({when}, {n.attempts} round(s)){': ' + n.detail if n.detail else ''}")
    if incident.evidence:
        lines.append("  evidence: " + ", ".join(f"{k}={v}" for k, v in incident.evidence.items() if v not in (None, "")))
    lines += [f"  trace id: {incident.trace_id or '(none)'}", "", "timeline:"]
    start = timeline[0].occurred_at if timeline else None
    for entry in timeline:
        offset = (entry.occurred_at - start).total_seconds() if start else 0.0
        lines.append(f"  {fmt_time(entry.occurred_at)}  +{offset:6.2f}s  {entry.source:<16} {entry.summary}")
    if spans:
        lines += ["", f"trace {incident.trace_id}:"]
        lines += _trace_tree(spans)
    return True, redact("\n".join(lines))


def _trace_tree(spans) -> list[str]:
    by_parent: dict[str | None, list] = {}
    ids = {s.span_id for s in spans}
    for span in spans:
        parent = span.parent_span_id if span.parent_span_id in ids else None
        by_parent.setdefault(parent, []).append(span)
    lines: list[str] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(by_parent.get(parent, []), key=lambda s: s.started_at):
            ms = (span.ended_at - span.started_at).total_seconds() * 1000
            lines.append(f"  {'  ' * depth}{span.name:<{max(8, 20 - 2 * depth)}} {span.service:<16} {ms:8.1f} ms  {views.span_status(span.status)}")
            walk(span.span_id, depth + 1)

    walk(None, 0)
    return lines


def _diagnosis(incident) -> list[str]:
    d = incident.diagnosis
    if not d:
        return []
    lines = [f"  cause: {d.get('cause')} (confidence {float(d.get('confidence', 0)):.0%}): {d.get('explanation', '')}"]
    lines += [f"    remedy: {r}" for r in d.get("remedies", [])]
    return lines


async def mark_text(
    store_url: str, id_prefix: str, *, verdict: str, reason: str, by: str, bus: Callable[[], NatsSettings], wait_s: float = 10.0
) -> tuple[bool, str]:
    """Tell report-builder, the marks' owner, that an incident was a false positive or that `by`
    acknowledged it (an IncidentMarked on the bus, as the operator), then wait for the store to
    show it; (done, what to print). `bus` gives the operator's bus settings, asked only once the
    incident is found."""
    async with views.store_session(store_url) as session:
        try:
            incident = await views.find_incident(session, id_prefix=id_prefix)
        except ValueError as exc:  # empty or ambiguous
            return False, str(exc)
    if incident is None:
        return False, f"no incident whose id starts with {id_prefix!r}"
    event = IncidentMarked(source=SOURCE, incident_id=uuid.UUID(incident.id), verdict=verdict, reason=reason, marked_by=by)
    await publish(bus(), event)
    what = f"incident {incident.id} ({incident.kind} on {incident.node_id})"
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        async with views.store_session(store_url) as session:
            marks = await views.marks_of(session, incident_id=incident.id)
        if any(m.verdict == verdict and m.marked_by == by and m.reason == reason for m in marks):
            return True, f"{what} {mark_said(verdict)} by {by}: {reason}"
        await asyncio.sleep(0.2)
    return True, f"{what}: the mark is on the bus; report-builder has not recorded it within {wait_s:g}s and will when it runs"


async def false_positives_text(store_url: str, *, as_json: bool = False) -> str:
    """The false-positive ledger: per detector and kind, how many incidents operators marked wrong."""
    async with views.store_session(store_url) as session:
        records = await views.false_positive_counts(session)
    if as_json:
        return to_json(records)
    if not records:
        return "no incidents recorded"
    lines = [table(
        ["DETECTOR", "KIND", "INCIDENTS", "FALSE POS.", "SHARE"],
        [[r.detector, r.kind, r.incidents, r.false_positives, f"{r.share:.0%}"] for r in records],
        right=["INCIDENTS", "FALSE POS.", "SHARE"],
    )]
    return "\n".join(lines)
