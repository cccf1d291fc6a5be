"""`gpumedic silence add|list|remove`: maintenance windows and known issues, as facts on the bus.

A silence is published as SilenceAdded by the `operator` NATS user (only it, and only these
subjects); every detector replays silences when it starts and follows new ones, and report-builder
keeps them in the store, which `list` reads. The bus is the embedded stack's under `--var` when
one runs there, else the one GPUMEDIC_NATS_* names (compose: the operator's password is in .env).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

from gpumedic.operator_bus import SOURCE, OperatorError, publish
from gpumedic.output import table, to_json
from gpumedic_bus import NatsSettings
from gpumedic_events import IncidentKind, SilenceAdded, SilenceRemoved
from gpumedic_store import views


async def add(
    settings: NatsSettings,
    *,
    reason: str,
    by: str,
    duration_s: float,
    node_id: str | None = None,
    kind: str | None = None,
    gpu_index: int | None = None,
    starts_at: datetime | None = None,
) -> SilenceAdded:
    """A silence from `starts_at` (now if None) for `duration_s`."""
    starts_at = starts_at or datetime.now(UTC)
    event = SilenceAdded(
        source=SOURCE,
        silence_id=uuid.uuid4(),
        node_id=node_id,
        kind=IncidentKind(kind) if kind else None,
        gpu_index=gpu_index,
        starts_at=starts_at,
        ends_at=starts_at + timedelta(seconds=duration_s),
        reason=reason,
        created_by=by,
    )
    await publish(settings, event)
    return event


async def remove(settings: NatsSettings, *, silence_id: str, by: str) -> SilenceRemoved:
    event = SilenceRemoved(source=SOURCE, silence_id=uuid.UUID(silence_id), removed_by=by)
    await publish(settings, event)
    return event


async def whole_id(store_url: Callable[[], str], id_or_prefix: str) -> str:
    """The silence a person names by its id or the start of it (as `list` and `incidents` show
    ids), found in the store (`store_url()` says where); a whole id is taken as it is."""
    try:
        return str(uuid.UUID(id_or_prefix))
    except ValueError:
        pass
    async with views.store_session(store_url()) as session:
        found = await views.find_silence(session, id_prefix=id_or_prefix)
    if found is None:
        raise OperatorError(f"no silence's id starts with {id_or_prefix!r}: `gpumedic silence list --all` shows them")
    return found.id


async def check_node(store_url: str, node_id: str) -> None:
    """Refuse a silence on a node the store has never heard of (a typo silences nothing), naming
    the nodes it knows. A store that knows no node yet (a fleet's first minute) checks nothing."""
    async with views.store_session(store_url) as session:
        known = await views.known_nodes(session)
    if known and node_id not in known:
        shown = sorted(known)
        listed = ", ".join(shown[:10]) + (f" ... ({len(shown)} in all)" if len(shown) > 10 else "")
        raise OperatorError(f"no node {node_id!r} is known (sampled within the history kept, or in an incident): the store "
                            f"knows {listed}; --unseen silences a node none has heard of yet")


async def list_text(store_url: str, *, include_past: bool = False, as_json: bool = False) -> str:
    async with views.store_session(store_url) as session:
        rows = await views.list_silences(session, now=datetime.now(UTC), include_past=include_past)
    if as_json:
        return to_json(rows)
    if not rows:
        return "no silence in force" if not include_past else "no silence recorded"
    return table(
        ["SILENCE", "NODE", "KIND", "GPU", "FROM", "UNTIL", "BY", "REASON"],
        [[s.id, s.node_id or "any", s.kind or "any", "any" if s.gpu_index is None else s.gpu_index,
          s.starts_at.strftime("%Y-%m-%d %H:%M:%SZ"), s.ends_at.strftime("%Y-%m-%d %H:%M:%SZ"),
          s.created_by, s.reason + (f" (lifted by {s.removed_by})" if s.removed_at else "")] for s in rows],
    )


def describe(event: SilenceAdded) -> str:
    scope = ", ".join(
        part for part in (
            f"node {event.node_id}" if event.node_id else "",
            f"kind {event.kind.value}" if event.kind else "",
            f"GPU {event.gpu_index}" if event.gpu_index is not None else "",
        ) if part
    ) or "everything"
    starts = f" from {event.starts_at:%Y-%m-%d %H:%M:%S}Z" if event.starts_at > datetime.now(UTC) else ""
    return f"silence {event.silence_id} on {scope}{starts} until {event.ends_at:%Y-%m-%d %H:%M:%S}Z: {event.reason}"
