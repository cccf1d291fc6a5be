"""`gpumedic silence add|list|remove`: maintenance windows and known issues, as facts on the bus.

A silence is published as SilenceAdded by the `operator` NATS user (only it, and only these
subjects); every detector replays silences when it starts and follows new ones, and report-builder
keeps them in the store, which `list` reads. The bus is the embedded stack's under `--var` when
one runs there, else the one GPUMEDIC_NATS_* names (compose: the operator's password is in .env).
"""

from __future__ import annotations

import os
import uuid
from datetime import UTC, datetime, timedelta
from pathlib import Path

from gpumedic.output import table, to_json
from gpumedic.stack import Stack
from gpumedic_bus import NatsSettings, connect
from gpumedic_bus.topology import OPERATOR
from gpumedic_events import Event, IncidentKind, SilenceAdded, SilenceRemoved
from gpumedic_store import create_engine, session_factory
from report_builder import repository

SOURCE = "gpumedic-cli"


class OperatorError(RuntimeError):
    """The operator's command cannot be carried out; the message says why and what to do."""


def operator_settings(var_dir: Path, user: str = OPERATOR) -> NatsSettings:
    """The embedded stack's bus under `var_dir` as `user` if one runs there, else GPUMEDIC_NATS_*."""
    if os.environ.get("GPUMEDIC_NATS_URL"):
        return NatsSettings()
    settings = Stack.running(var_dir, user)
    if settings is None:
        raise OperatorError(
            f"no embedded stack runs under {var_dir}/ (start one with `gpumedic up`), and GPUMEDIC_NATS_URL is not set "
            f"(for compose: GPUMEDIC_NATS_URL=tls://HOST:4222 GPUMEDIC_NATS_USER={user} GPUMEDIC_NATS_PASSWORD=... "
            "GPUMEDIC_NATS_TLS_CA_FILE=deploy/secrets/tls/ca.pem)"
        )
    return settings


async def _publish(settings: NatsSettings, event: Event) -> None:
    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        await nc.jetstream().publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": str(event.event_id)}, timeout=5)
    finally:
        await nc.close()


async def add(
    settings: NatsSettings,
    *,
    reason: str,
    by: str,
    duration_s: float,
    node_id: str | None = None,
    kind: str | None = None,
    gpu_index: int | None = None,
) -> SilenceAdded:
    now = datetime.now(UTC)
    event = SilenceAdded(
        source=SOURCE,
        silence_id=uuid.uuid4(),
        node_id=node_id,
        kind=IncidentKind(kind) if kind else None,
        gpu_index=gpu_index,
        starts_at=now,
        ends_at=now + timedelta(seconds=duration_s),
        reason=reason,
        created_by=by,
    )
    await _publish(settings, event)
    return event


async def remove(settings: NatsSettings, *, silence_id: str, by: str) -> SilenceRemoved:
    event = SilenceRemoved(source=SOURCE, silence_id=uuid.UUID(silence_id), removed_by=by)
    await _publish(settings, event)
    return event


async def list_text(store_url: str, *, include_past: bool = False, as_json: bool = False) -> str:
    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            rows = await repository.list_silences(session, now=datetime.now(UTC), include_past=include_past)
    finally:
        await engine.dispose()
    if as_json:
        return to_json(rows)
    if not rows:
        return "no silence in force" if not include_past else "no silence recorded"
    return table(
        ["SILENCE", "NODE", "KIND", "GPU", "UNTIL", "BY", "REASON"],
        [[s.id, s.node_id or "any", s.kind or "any", "any" if s.gpu_index is None else s.gpu_index, s.ends_at.strftime("%Y-%m-%d %H:%M:%SZ"),
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
    return f"silence {event.silence_id} on {scope} until {event.ends_at:%Y-%m-%d %H:%M:%S}Z: {event.reason}"
