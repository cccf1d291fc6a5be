"""What `gpumedic incidents` prints: the incident list, and one incident's timeline and trace,
read from the store report-builder keeps."""

from __future__ import annotations

from datetime import UTC, datetime

from gpumedic.output import table, to_json
from gpumedic_events.redact import redact
from gpumedic_store import create_engine, session_factory
from report_builder import repository


def fmt_time(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if value else "-"


async def list_text(store_url: str, *, status: str | None = None, limit: int = 50, as_json: bool = False) -> str:
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            rows = await repository.list_incidents(session, where=repository.IncidentFilter(status=status), limit=limit)
    finally:
        await engine.dispose()
    if as_json:
        return to_json(rows)
    if not rows:
        return "no incidents recorded" + (f" with status {status}" if status else "")
    return table(
        ["INCIDENT", "STATUS", "KIND", "NODE/GPU", "OPENED", "SUMMARY"],
        [[i.id[:8], i.status, i.kind, f"{i.node_id}/{i.gpu_index}" if i.gpu_index is not None else i.node_id, fmt_time(i.opened_at),
          i.summary[:80]] for i in rows],
    )


async def incident_text(store_url: str, id_prefix: str, *, as_json: bool = False) -> str:
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            incident = await repository.find_incident(session, id_prefix=id_prefix)
            if incident is None:
                return f"no incident whose id starts with {id_prefix!r}"
            timeline = await repository.incident_timeline(session, incident_id=incident.id)
            spans = await repository.trace_spans(session, trace_id=incident.trace_id) if incident.trace_id else []
            marks = await repository.marks_of(session, incident_id=incident.id)
            notifications = await repository.notifications_of(session, incident_id=incident.id)
    finally:
        await engine.dispose()
    if as_json:
        return to_json({"incident": incident, "timeline": timeline, "trace": spans, "marks": marks, "notifications": notifications})
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
        lines.append(f"  marked {mark.verdict.replace('_', ' ')} by {mark.marked_by} at {fmt_time(mark.marked_at)}: {mark.reason}")
    for n in notifications:
        when = fmt_time(n.finished_at) if n.finished_at else f"next try {fmt_time(n.due_at)}"
        lines.append(f"  notified {n.channel}: {n.status} ({when}, {n.attempts} round(s)){': ' + n.detail if n.detail else ''}")
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
    return redact("\n".join(lines))


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
            lines.append(f"  {'  ' * depth}{span.name:<{max(8, 20 - 2 * depth)}} {span.service:<16} {ms:8.1f} ms  {span.status}")
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


async def mark_false_positive_text(store_url: str, id_prefix: str, *, reason: str, by: str) -> tuple[bool, str]:
    """Record an operator's verdict that an incident was a false positive; (done, what to print)."""
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            incident = await repository.find_incident(session, id_prefix=id_prefix)
            if incident is None:
                return False, f"no incident whose id starts with {id_prefix!r}"
            await repository.mark_false_positive(session, incident_id=incident.id, reason=reason, by=by, now=datetime.now(UTC))
            await session.commit()
    finally:
        await engine.dispose()
    return True, f"incident {incident.id} ({incident.kind} on {incident.node_id}) marked false positive by {by}: {reason}"


async def false_positives_text(store_url: str, *, as_json: bool = False) -> str:
    """The false-positive ledger: per detector and kind, how many incidents operators marked wrong."""
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            records = await repository.false_positive_counts(session)
    finally:
        await engine.dispose()
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
