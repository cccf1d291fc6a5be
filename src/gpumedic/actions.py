"""What `gpumedic actions` prints: the remediator's ledger as an audit log, every decision with its
reason, and for one action each command it ran with exit status, output digest and timing."""

from __future__ import annotations

from pydantic import TypeAdapter, ValidationError

from gpumedic.output import clip, fmt_time, table, to_json
from gpumedic_events import Operation
from gpumedic_events.redact import redact
from gpumedic_store import ActionRecord, views

_OPERATION = TypeAdapter(Operation)


def _what(record: ActionRecord) -> str:
    try:
        return _OPERATION.validate_python(record.operation or {}).describe()
    except ValidationError:  # a row written by a version that knew other operations
        return str((record.operation or {}).get("operation", "?"))


async def actions_text(
    store_url: str, *, node_id: str | None = None, incident: str | None = None, limit: int = 50, as_json: bool = False
) -> str:
    async with views.store_session(store_url) as session:
        rows = await views.list_actions(session=session, node_id=node_id, incident_id=incident, limit=limit)
    if as_json:
        return to_json(rows)
    if not rows:
        return "no actions recorded" + (f" on {node_id}" if node_id else "")
    return table(
        ["ACTION", "INCIDENT", "NODE", "DECIDED", "STATUS", "WHAT", "WHY / RESULT"],
        [[r.action_id[:8], r.incident_id[:8], r.node_id, fmt_time(r.started_at), r.status, clip(_what(r), 60), clip(r.detail, 100)]
         for r in rows],
    )


async def action_text(store_url: str, id_prefix: str, *, as_json: bool = False) -> tuple[bool, str]:
    async with views.store_session(store_url) as session:
        try:
            record = await views.find_action(session=session, id_prefix=id_prefix)
        except ValueError as exc:
            return False, str(exc)
    if record is None:
        return False, f"no action whose id starts with {id_prefix!r}"
    if as_json:
        return True, to_json(record)
    took = f"{(record.finished_at - record.started_at).total_seconds():.2f}s" if record.finished_at else "still running"
    lines = [
        f"action {record.action_id}  [{record.status}]",
        f"  {_what(record)} on {record.node_id}, attempt {record.attempt} of incident {record.incident_id}",
        f"  asked by {record.requested_by or '?'}: {record.reason or '(no reason recorded)'}",
        f"  requested {fmt_time(record.requested_at)}, decided {fmt_time(record.started_at)}, finished {fmt_time(record.finished_at)} ({took})",
        f"  {record.detail}",
    ]
    audit = record.audit or []
    if audit:
        lines += ["", f"  {'AT':>9} {'TOOK':>8} {'EXIT':>4}  {'OUTPUT (sha256, bytes out/err)':<34} COMMAND"]
        for entry in audit:
            status = "-" if entry.get("exit_status") is None else str(entry["exit_status"])
            if entry.get("output_sha256"):
                output = f"{entry['output_sha256'][:16]} {entry.get('stdout_bytes', 0)}/{entry.get('stderr_bytes', 0)}"
            else:
                output = clip(entry.get("error", ""), 34)
            lines.append(f"  {entry.get('at_ms', 0):>7.1f}ms {entry.get('took_ms', 0):>6.1f}ms {status:>4}  {output:<34} {entry.get('command', '')}")
    elif record.steps:
        lines += ["", *(f"  ran: {step}" for step in record.steps)]
    elif record.status in ("blocked", "observed"):
        lines += ["", "  nothing ran on the node"]
    return True, redact("\n".join(lines))


async def drained_text(store_url: str, *, node_id: str | None = None, as_json: bool = False) -> str:
    """Which nodes take no new jobs, held by which incident since when (`gpumedic drained`)."""
    async with views.store_session(store_url) as session:
        rows = await views.drains(session=session, node_id=node_id)
    if as_json:
        return to_json(rows)
    if not rows:
        return "no node is drained" if node_id is None else f"{node_id} is not drained"
    lines = [table(
        ["NODE", "INCIDENT", "SINCE", "BY ACTION", "WHY"],
        [[r.node_id, r.incident_id[:8], fmt_time(r.drained_at), r.action_id[:8], " ".join(r.reason.split())[:100]] for r in rows],
    )]
    nodes = len({r.node_id for r in rows})
    lines.append(f"{nodes} node(s) drained; each returns once every incident holding it is fixed and validated")
    return "\n".join(lines)
