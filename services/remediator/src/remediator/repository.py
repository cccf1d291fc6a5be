"""The remediator's ledger and breaker trips in the incident store.

The ledger is what makes actions idempotent: a request is recorded (as executing, or with the
gate's refusal) and committed before any command runs, and a request whose action id is
already recorded is never run again. It is also what the gate reads: what is executing, how
often an incident was tried, which nodes needed action lately, whether the breaker is open.
Every gate decision and every breaker reset first takes `gpumedic_store.breaker.lock_gate` in
its transaction, so they happen one at a time across all remediator instances. Functions take the session
keyword-only and never commit: the handler decides the transaction boundaries.
"""

from __future__ import annotations

import uuid
from collections.abc import Sequence
from datetime import datetime, timedelta

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_events import ActionOutcome, ActionRequested
from gpumedic_events.redact import redact, redact_tree
from gpumedic_store.breaker import open_trip
from gpumedic_store.models import ActionRecord, BreakerTrip, NodeDrain
from remediator.catalogue import NOT_FIXES
from remediator.gate import LedgerView

EXECUTING = "executing"
FINISHED = ("succeeded", "failed", "blocked", "observed", "interrupted")
RAN = ("executing", "succeeded", "failed", "interrupted")
"""Statuses of actions that touched (or may have touched) a node: these count against its limit."""
NOT_COUNTED_FOR_BREAKER = ("blocked",)
"""A blocked request did nothing; observed ones count, so observe mode previews the breaker."""


_ASIDE_NAMESPACE = uuid.UUID("0b6e7d2c-4f1a-4c3e-9a8d-5e2f1c0b7a69")


async def get_action(*, session: AsyncSession, action_id: uuid.UUID) -> ActionRecord | None:
    return await session.get(ActionRecord, str(action_id))


def aside_id(action_id: uuid.UUID | str, request_sha256: str) -> uuid.UUID:
    """Where a request is kept that shares its action id with another request asking something else."""
    return uuid.uuid5(_ASIDE_NAMESPACE, f"{action_id}/{request_sha256}")


async def find_request(*, session: AsyncSession, request: ActionRequested) -> ActionRecord | None:
    """This very request's row, if it was seen before: under its action id, or set aside (`claim`)."""
    row = await get_action(session=session, action_id=request.action_id)
    if row is None or row.request_sha256 in ("", request.request_sha256):  # '': recorded before digests
        return row
    return await get_action(session=session, action_id=aside_id(request.action_id, request.request_sha256))


async def killed(*, session: AsyncSession, incident_id: uuid.UUID) -> frozenset[str]:
    """The nodes where this ledger holds a succeeded kill for the incident, or a succeeded stop of
    its job's ranks (each succeeds only once its processes were verified gone)."""
    rows = await session.execute(
        select(ActionRecord.node_id, ActionRecord.operation)
        .where(ActionRecord.incident_id == str(incident_id), ActionRecord.status == ActionOutcome.SUCCEEDED.value)
    )
    nodes: set[str] = set()
    for node_id, operation in rows:
        if operation.get("operation") == "kill_gpu_processes":
            nodes.add(node_id)
        elif operation.get("operation") == "stop_job":
            nodes.update(str(rank.get("node_id")) for rank in operation.get("ranks", ()) if isinstance(rank, dict))
    return frozenset(nodes)


async def claim(*, session: AsyncSession, request: ActionRequested) -> tuple[uuid.UUID, str]:
    """The id to record a request under, and why it may not run ('' if it may), for a request
    `find_request` did not find.

    Action ids can be predicted, so another request may hold this one's id already. One that was
    blocked did nothing and counts for nothing: it steps aside and this request takes the id. One
    that ran, or runs, keeps it: this request is recorded aside, refused, and its answer carries
    the aside id, so that no asker takes it for the answer to the request that ran."""
    holder = await get_action(session=session, action_id=request.action_id)
    if holder is None:
        return request.action_id, ""
    if holder.status == "blocked":
        holder.action_id = str(aside_id(holder.action_id, holder.request_sha256))
        await session.flush()
        return request.action_id, ""
    why_not = f"refused: action {request.action_id} was already asked for with other fields, and is {holder.status}"
    return aside_id(request.action_id, request.request_sha256), why_not


async def record(
    *, session: AsyncSession, request: ActionRequested, status: str, detail: str, now: datetime, action_id: uuid.UUID | None = None
) -> ActionRecord:
    """The ledger's row for a request just decided: executing (it runs next) or finished (refused,
    observed); under `action_id` when `claim` set it aside."""
    if status != EXECUTING and status not in FINISHED:
        raise ValueError(f"{status!r} is not an action status")
    row = ActionRecord(
        action_id=str(action_id or request.action_id),
        incident_id=str(request.incident_id),
        node_id=request.node_id,
        attempt=request.attempt,
        operation=redact_tree(request.operation.model_dump(mode="json")),
        requested_by=request.source,
        reason=redact(request.reason),
        request_sha256=request.request_sha256,
        status=status,
        detail=detail,
        steps=[],
        audit=[],
        requested_at=request.occurred_at,
        started_at=now,
        finished_at=None if status == EXECUTING else now,
    )
    session.add(row)
    await session.flush()
    return row


async def finish(
    *,
    session: AsyncSession,
    record: ActionRecord,
    status: str,
    detail: str,
    steps: Sequence[str],
    now: datetime,
    audit: Sequence[dict] | None = None,
    in_use: bool = False,
) -> ActionRecord:
    if status not in FINISHED:
        raise ValueError(f"{status!r} is not a finished action status ({', '.join(FINISHED)})")
    record.status = status
    record.detail = detail
    record.in_use = in_use
    record.steps = list(steps)
    if audit is not None:
        record.audit = list(audit)
    record.finished_at = now
    await session.flush()
    return record


_operation_name = ActionRecord.operation["operation"].as_string()


async def ledger_view(
    *, session: AsyncSession, request: ActionRequested, now: datetime, window_s: float, node_window_s: float
) -> LedgerView:
    """What the gate needs to know about everything except `request` itself: `window_s` is the
    breaker's window, `node_window_s` the one-node limit's."""
    this = str(request.action_id)
    trip = await open_trip(session=session)
    executing = (
        await session.scalars(
            select(ActionRecord.action_id)
            .where(ActionRecord.node_id == request.node_id, ActionRecord.status == EXECUTING, ActionRecord.action_id != this)
            .order_by(ActionRecord.started_at)
        )
    ).all()
    on_node = await session.scalar(
        select(func.count())
        .select_from(ActionRecord)
        .where(
            ActionRecord.node_id == request.node_id,
            ActionRecord.status.in_(RAN),
            ActionRecord.started_at >= now - timedelta(seconds=node_window_s),
            ActionRecord.action_id != this,
            _operation_name.not_in(NOT_FIXES),
        )
    )
    since = now - timedelta(seconds=window_s)
    last_reset = await session.scalar(select(func.max(BreakerTrip.reset_at)))
    if last_reset is not None and last_reset > since:
        # A person reset the breaker after checking the fleet: what came before is judged.
        since = last_reset
    nodes = (
        await session.scalars(
            select(ActionRecord.node_id).distinct().where(
                ActionRecord.started_at >= since,
                ActionRecord.status.not_in(NOT_COUNTED_FOR_BREAKER),
                ActionRecord.action_id != this,
                _operation_name.not_in(NOT_FIXES),  # moving jobs harms none: not what the breaker counts
            )
        )
    ).all()
    return LedgerView(
        breaker_open_since=trip.tripped_at if trip else None,
        breaker_reason=trip.reason if trip else "",
        executing_on_node=tuple(executing),
        actions_on_node=int(on_node or 0),
        nodes_in_window=frozenset(nodes),
    )


# --- drained nodes ------------------------------------------------------------------------------


async def hold_drained(*, session: AsyncSession, request: ActionRequested, holder: str, now: datetime) -> None:
    """`holder` (the request's incident, or the operators' hold) holds the node drained (once, however often it asks)."""
    key = (request.node_id, holder)
    if await session.get(NodeDrain, key) is None:
        session.add(
            NodeDrain(
                node_id=request.node_id,
                incident_id=holder,
                action_id=str(request.action_id),
                reason=request.reason,
                drained_at=now,
            )
        )


async def release_drained(*, session: AsyncSession, node_id: str, holder: str) -> None:
    row = await session.get(NodeDrain, (node_id, holder))
    if row is not None:
        await session.delete(row)

