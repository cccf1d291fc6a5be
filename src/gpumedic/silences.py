"""`gpumedic silence add|list|remove`: maintenance windows and known issues, as facts on the bus.

A silence is published as SilenceAdded by the `operator` NATS user (only it, and only these
subjects); every detector replays silences when it starts and follows new ones, and report-builder
keeps them in the store, which `list` reads. Before a silence is published it is checked against
the store: one that names nodes none of which the store knows is refused, and `--preview` shows the
nodes and the incidents it matches now without adding it. The bus is the embedded stack's under `--var` when
one runs there, else the one GPUMEDIC_NATS_* names (compose: the operator's password is in .env).
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import select

from gpumedic.operator_bus import SOURCE, OperatorError, publish
from gpumedic.output import table, to_json
from gpumedic_bus import NatsSettings
from gpumedic_events import IncidentKind, Matcher, SilenceAdded, SilenceRemoved
from gpumedic_events.silence import split_matcher
from gpumedic_store import views
from gpumedic_store.models import Incident


def expand_groups(matchers: Sequence[str], groups: Mapping[str, str | None]) -> list[str]:
    """The matchers with each on an inventory group (`group=gpu-a`, `group!=spot`, `group=~"a|b"`)
    turned into one on the nodes the inventory puts in it now (`groups`: node -> its group):
    detectors know nodes, not groups, so the silence holds the nodes, and a node added to the group
    later is not in it. A group with no node is refused, naming the groups there are."""
    out = []
    for text in matchers:
        label, op, value = split_matcher(text)
        if label != "group":
            out.append(text)
            continue
        if op in ("=~", "!~"):
            try:
                pattern = re.compile(value)
            except re.error as exc:
                raise ValueError(f"{text!r}: {value!r} is not a regular expression: {exc}") from None
            named = {n for n, g in groups.items() if g is not None and pattern.fullmatch(g)}
        else:
            named = {n for n, g in groups.items() if g == value}
        if not named:
            known = sorted({g for g in groups.values() if g})
            raise ValueError(f"{text!r}: no node of the inventory is in such a group (groups: {', '.join(known) or 'none'})")
        nodes = "|".join(re.escape(n) for n in sorted(named))
        out.append(f"node{'=~' if op in ('=', '=~') else '!~'}{nodes}")
    return out


def names_a_group(matchers: Sequence[str]) -> bool:
    """Whether any matcher is on an inventory group (which `expand_groups` turns into nodes)."""
    return any(split_matcher(m)[0] == "group" for m in matchers)


def build(
    *,
    reason: str,
    by: str,
    duration_s: float,
    node_id: str | None = None,
    kind: str | None = None,
    gpu_index: int | None = None,
    matchers: Sequence[str] = (),
    starts_at: datetime | None = None,
    every_s: float | None = None,
    repeat_until: datetime | None = None,
) -> SilenceAdded:
    """A silence from `starts_at` (now if None) for `duration_s`, again every `every_s` until
    `repeat_until` if given; a matcher that does not parse raises ValueError saying which and why."""
    starts_at = starts_at or datetime.now(UTC)
    return SilenceAdded(
        source=SOURCE,
        silence_id=uuid.uuid4(),
        node_id=node_id,
        kind=IncidentKind(kind) if kind else None,
        gpu_index=gpu_index,
        matchers=tuple(Matcher.parse(m) for m in matchers),
        starts_at=starts_at,
        ends_at=starts_at + timedelta(seconds=duration_s),
        every_s=None if every_s is None else round(every_s),
        repeat_until=repeat_until,
        reason=reason,
        created_by=by,
    )


async def add(settings: NatsSettings, event: SilenceAdded) -> SilenceAdded:
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


@dataclass(frozen=True)
class Preview:
    """What a silence matches in the store now: the nodes it names and the incidents not yet
    resolved that it would silence (from its start)."""

    nodes: list[str]
    incidents: list
    known: set[str]


def _names_nodes(event: SilenceAdded) -> bool:
    return event.node_id is not None or any(m.label == "node" and m.op in ("=", "=~") for m in event.matchers)


def _node_matches(event: SilenceAdded, node_id: str) -> bool:
    """Its conditions on the node alone (a kind or GPU condition may still leave the node's other incidents out)."""
    return event.node_id in (None, node_id) and all(m.matches({"node": node_id}) for m in event.matchers if m.label == "node")


async def preview(store_url: str, event: SilenceAdded) -> Preview:
    async with views.store_session(store_url) as session:
        known = await views.known_nodes(session)
        unresolved = (await session.scalars(select(Incident).where(Incident.status != "resolved"))).all()
    return Preview(
        nodes=sorted(n for n in known if _node_matches(event, n)),
        incidents=sorted((i for i in unresolved if event.covers(i.kind, i.node_id, i.gpu_index, _cluster_of(i))), key=lambda i: i.opened_at),
        known=known,
    )


def _cluster_of(incident: Incident) -> str | None:
    cluster = (incident.evidence or {}).get("cluster")
    return cluster if isinstance(cluster, str) else None


def check(event: SilenceAdded, seen: Preview) -> None:
    """Refuse a silence that names nodes of which the store knows none (a typo silences nothing),
    naming the nodes it knows. A store that knows no node yet (a fleet's first minute) checks nothing."""
    if seen.known and _names_nodes(event) and not seen.nodes:
        shown = sorted(seen.known)
        listed = ", ".join(shown[:10]) + (f" ... ({len(shown)} in all)" if len(shown) > 10 else "")
        raise OperatorError(f"{event.scope()} matches no node the store knows (sampled within the history kept, or in an "
                            f"incident): it knows {listed}; --unseen silences nodes none has heard of yet")


def preview_text(event: SilenceAdded, seen: Preview) -> str:
    nodes = ", ".join(seen.nodes[:20]) + (f" ... ({len(seen.nodes)} in all)" if len(seen.nodes) > 20 else "")
    lines = [f"{event.scope()} matches {len(seen.nodes)} known node(s){': ' + nodes if nodes else ''}",
             f"and {len(seen.incidents)} incident(s) not resolved now" + (":" if seen.incidents else "")]
    lines += [f"  {i.id[:8]} {i.kind} on {i.node_id}{'' if i.gpu_index is None else f' GPU {i.gpu_index}'} ({i.severity}, {i.status})"
              for i in seen.incidents[:50]]
    return "\n".join(lines)


async def silences_text(store_url: str, *, include_past: bool = False, as_json: bool = False) -> str:
    async with views.store_session(store_url) as session:
        rows = await views.list_silences(session, now=datetime.now(UTC), include_past=include_past)
    if as_json:
        return to_json(rows)
    if not rows:
        return "no silence in force" if not include_past else "no silence recorded"
    return table(
        ["SILENCE", "NODE", "KIND", "GPU", "MATCHERS", "FROM", "UNTIL", "BY", "REASON"],
        [[s.id, s.node_id or "any", s.kind or "any", "any" if s.gpu_index is None else s.gpu_index, " ".join(s.matchers or ()) or "-",
          s.starts_at.strftime("%Y-%m-%d %H:%M:%SZ"), s.ends_at.strftime("%Y-%m-%d %H:%M:%SZ") + _recurring(s.every_s, s.last_ends_at),
          s.created_by, s.reason + (f" (lifted by {s.removed_by})" if s.removed_at else "")] for s in rows],
    )


def _recurring(every_s: int | None, last_end: datetime | None) -> str:
    if not every_s or last_end is None:
        return ""
    period = f"{every_s // 86400}d" if every_s % 86400 == 0 else f"{every_s // 3600}h" if every_s % 3600 == 0 else f"{every_s}s"
    return f", again every {period}, the last window ending {last_end:%Y-%m-%d %H:%M:%S}Z"


def describe(event: SilenceAdded) -> str:
    starts = f" from {event.starts_at:%Y-%m-%d %H:%M:%S}Z" if event.starts_at > datetime.now(UTC) else ""
    return (f"silence {event.silence_id} on {event.scope()}{starts} until {event.ends_at:%Y-%m-%d %H:%M:%S}Z"
            f"{_recurring(event.every_s, event.last_end)}: {event.reason}")
