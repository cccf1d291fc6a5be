"""What the console's pages show, worked out from store rows and samples. Pure: no I/O, no HTML.

- `fleet`: one tile per node with its health (the worst of its unresolved incidents, drained, or
  silent when its samples stopped) and each GPU's utilisation, memory and temperature;
- `waterfall`: an incident's trace laid out as bars on one time axis, children under parents;
- `time_chart` and `history_charts`: time series as the data the console's script draws with uPlot
  (shared times in seconds, one line per series, a unit, and marks such as an incident's start);
- `history_window`: the window a node page or its JSON asks for (1h, 6h, 24h, 7d, or from/to);
- `incident_filter`: the list's query string, checked, as the repository's filter.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta

import msgspec

from gpumedic_events import NodeSampled
from gpumedic_events.redact import redact
from gpumedic_store.history import History
from gpumedic_store.views import IncidentFilter

HEALTH_ORDER = ("escalated", "critical", "warning", "drained", "silent", "info", "ok")
"""Worst first: a tile shows the first that applies (escalated: gpumedic handed one of its
incidents to a person, whatever its severity)."""


class GpuTile(msgspec.Struct, frozen=True, gc=False):
    """One GPU's figures on its node's tile. A struct, as `NodeReading`: one is made for each GPU of
    every sample (frozen dataclasses cost report-builder 17 µs a sample, these 2)."""

    index: int
    utilization_pct: int | None
    memory_used_mib: int | None
    memory_total_mib: int | None
    temperature_c: int | None
    lost: bool = False

    @property
    def memory_pct(self) -> int | None:
        if self.memory_used_mib is None or not self.memory_total_mib:
            return None
        return round(100 * self.memory_used_mib / self.memory_total_mib)


class NodeReading(msgspec.Struct, frozen=True, gc=False):
    """What the console keeps of a node's latest sample: when, and its GPUs' tiles. (The whole
    sample, with its processes, holders and jobs, is about 30 KB a node at 8 GPUs: 300 MB for a
    10,000-node fleet, for what a tile shows.)"""

    sampled_at: datetime
    gpus: tuple[GpuTile, ...]
    memory_used_pct: int | None = None
    """Host memory in use (total less available), percent."""
    fullest_disk: tuple[str, float] | None = None
    """The configured path whose file system is fullest, and its share in use."""

    @classmethod
    def of(cls, sample: NodeSampled) -> NodeReading:
        host = sample.host
        memory = None
        if host.memory_total_mib and host.memory_available_mib is not None:
            memory = round(100 * (host.memory_total_mib - host.memory_available_mib) / host.memory_total_mib)
        fullest = max(host.disks, key=lambda d: d.used_pct, default=None)
        return cls(sample.occurred_at, tuple(
            GpuTile(g.index, g.utilization_gpu_pct, g.memory_used_mib, g.memory_total_mib, g.temperature_c, g.lost)
            for g in sample.gpus
        ), memory, (fullest.path, fullest.used_pct) if fullest else None)


@dataclass(frozen=True)
class NodeTile:
    node_id: str
    health: str
    why: str
    incidents: tuple[tuple[str, str, str], ...] = ()
    """(incident id, kind, status) of its unresolved incidents."""
    reading: NodeReading | None = None
    """Its latest sample's figures; None when none came since report-builder started."""

    @property
    def gpus(self) -> tuple[GpuTile, ...]:
        return self.reading.gpus if self.reading else ()

    @property
    def sampled_at(self) -> datetime | None:
        return self.reading.sampled_at if self.reading else None


def fleet(
    readings: Mapping[str, NodeReading],
    unresolved: Mapping[str, Sequence],
    drained: Iterable[str],
    now: datetime,
    *,
    silent_after_s: float,
) -> list[NodeTile]:
    """Every node that sampled or has an unresolved incident, worst health first, then by name."""
    drained = set(drained)
    tiles = []
    for node in sorted(set(readings) | set(unresolved) | drained):
        reading = readings.get(node)
        incidents = list(unresolved.get(node, ()))
        health, why = _health(reading, incidents, node in drained, now, silent_after_s)
        tiles.append(NodeTile(node, health, why, tuple((i.id, i.kind, i.status) for i in incidents), reading))
    return sorted(tiles, key=lambda t: (HEALTH_ORDER.index(t.health), t.node_id))


def _health(reading: NodeReading | None, incidents: list, drained: bool, now: datetime, silent_after_s: float) -> tuple[str, str]:
    # A node's incidents keep their own severity and state here, as on their pages, in `report` and
    # at Alertmanager: an escalated warning is "escalated", never promoted to "critical".
    for health, picked in (("escalated", [i for i in incidents if i.status == "escalated"]),
                           ("critical", [i for i in incidents if i.severity == "critical"]),
                           ("warning", [i for i in incidents if i.severity == "warning"])):
        if picked:
            return health, ", ".join(f"{i.kind} ({i.severity}, {i.status})" for i in picked)
    if drained:
        return "drained", "held out of service by the remediator"
    if reading is None:
        return "silent", "no sample since report-builder started"
    age = (now - reading.sampled_at).total_seconds()
    if age > silent_after_s:
        return "silent", f"last sample {age:.0f}s ago"
    if incidents:
        return "info", ", ".join(sorted({i.kind for i in incidents}))
    return "ok", "no open incident"


@dataclass(frozen=True)
class Bar:
    span_id: str
    name: str
    service: str
    depth: int
    offset_ms: float
    duration_ms: float
    status: str
    attributes: Mapping = field(default_factory=dict)


@dataclass(frozen=True)
class Waterfall:
    bars: tuple[Bar, ...]
    total_ms: float
    started_at: datetime | None

    def x(self, ms: float, width: float) -> float:
        """Where `ms` after the start lies on an axis `width` wide."""
        return width * ms / self.total_ms if self.total_ms else 0.0


def waterfall(spans: Sequence) -> Waterfall:
    """Spans (started_at, ended_at, span_id, parent_span_id, ...) depth-first, children by start
    time under their parent; a span whose parent was not kept starts a root."""
    if not spans:
        return Waterfall((), 0.0, None)
    start = min(s.started_at for s in spans)
    end = max(s.ended_at for s in spans)
    ids = {s.span_id for s in spans}
    children: dict[str | None, list] = {}
    for span in spans:
        children.setdefault(span.parent_span_id if span.parent_span_id in ids else None, []).append(span)
    bars: list[Bar] = []

    def walk(parent: str | None, depth: int) -> None:
        for span in sorted(children.get(parent, ()), key=lambda s: (s.started_at, s.span_id)):
            bars.append(Bar(
                span.span_id, span.name, span.service, depth, _ms(span.started_at - start), _ms(span.ended_at - span.started_at),
                span.status, span.attributes or {},
            ))
            walk(span.span_id, depth + 1)

    walk(None, 0)
    return Waterfall(tuple(bars), _ms(end - start), start)


def _ms(delta: timedelta) -> float:
    return max(0.0, delta.total_seconds() * 1000)


MATRIX_PEERS = 64
"""Peers the who-sees-whom matrix shows at most (a larger cluster: its one-way pairs are in the check's summary)."""


@dataclass(frozen=True)
class Reachability:
    """Runbook 002's who-sees-whom: for each peer that answered (a row), whether it lists each peer (a
    column) alive; a pair seen one way only is marked, and so is a peer that did not answer."""

    columns: tuple[str, ...]
    rows: tuple[tuple[str, tuple[str, ...]], ...]
    """(peer, per column: 'self', 'sees', 'one-way' (it sees the column, which answered and does not see it), 'no', or '' unknown)."""


def reachability(peers: Sequence[Mapping]) -> Reachability | None:
    """From a stored check's peer rows; None when no answering peer says whom it sees (an older check)."""
    sees = {p["node_id"]: set(p.get("sees") or ()) for p in peers if p.get("node_id") and p.get("sees")}
    if not sees:
        return None
    names = sorted({p.get("node_id") or p.get("url", "?") for p in peers} | {n for seen in sees.values() for n in seen})[:MATRIX_PEERS]

    def cell(row: str, column: str) -> str:
        if row == column:
            return "self"
        if column in sees[row]:
            return "one-way" if column in sees and row not in sees[column] else "sees"
        return "no"

    rows = tuple((row, tuple(cell(row, column) for column in names)) for row in sorted(sees)[:MATRIX_PEERS])
    return Reachability(columns=tuple(names), rows=rows)


def time_chart(
    key: str, title: str, unit: str, times: Sequence[datetime], series: Mapping[str, Sequence[float | None]], *, breaks: bool = False,
) -> dict:
    """One chart's data as the console's script draws it: times in seconds since the epoch. Labels
    are masked here (the page does not mask chart data again: see format.chart_json). With
    `breaks`, checks taken at a steady pace have their gaps drawn as gaps: where two lie more than
    three times their usual spacing apart (nothing checked meanwhile: a restart), a point with no
    value goes between, so the line stops rather than claims what nobody saw."""
    stamps = [int(t.timestamp()) for t in times]
    values = {label: list(v) for label, v in series.items()}
    if breaks and len(stamps) >= 3:
        spacing = sorted(b - a for a, b in zip(stamps, stamps[1:], strict=False))[(len(stamps) - 1) // 2]
        gaps = [i for i in range(1, len(stamps)) if stamps[i] - stamps[i - 1] > 3 * max(spacing, 1)]
        for i in reversed(gaps):
            stamps.insert(i, stamps[i - 1] + max(spacing, 1))
            for v in values.values():
                v.insert(i, None)
    return {
        "id": key, "title": title, "unit": unit, "times": stamps,
        "series": [{"label": label, "values": v} for label, v in values.items()], "marks": [],
    }


def history_charts(history: History, *, keys: Sequence[str] | None = None, marks: Sequence[tuple[datetime, str]] = ()) -> list[dict]:
    """A node's history as charts (those named by `keys`, in that order, or all), each with the
    given marks (an incident's start and end) as labelled vertical lines."""
    charts = history.charts if keys is None else [c for k in keys if (c := history.chart(k)) is not None]
    shown = [{"at": int(at.timestamp()), "label": label} for at, label in marks]
    return [
        {
            "id": c.key, "title": c.title, "unit": c.unit, "times": history.times, "step_s": history.step_s,
            "series": [{"label": redact(s.label), "values": s.values} for s in c.series], "marks": shown,
        }
        for c in charts
    ]


WINDOWS = {"1h": timedelta(hours=1), "6h": timedelta(hours=6), "24h": timedelta(hours=24), "7d": timedelta(days=7)}
LONGEST_WINDOW = timedelta(days=31)


@dataclass(frozen=True)
class Window:
    start: datetime
    end: datetime
    name: str
    """A key of WINDOWS, or "custom" for from/to."""


def history_window(query: Mapping[str, str], now: datetime, *, default: str = "24h") -> Window:
    """`window=1h|6h|24h|7d` back from now, or `from` and `to` (ISO times, UTC unless they say)."""
    start, end = (query.get("from") or "").strip(), (query.get("to") or "").strip()
    if start or end:
        times = {}
        for key, value in (("from", start), ("to", end)):
            if not value:
                times[key] = now if key == "to" else None
                continue
            try:
                when = datetime.fromisoformat(value)
            except ValueError:
                raise FilterError(f"{key} must be a date and time such as 2026-11-23T10:00 (UTC), not {value!r}") from None
            times[key] = when if when.tzinfo else when.replace(tzinfo=UTC)
        if times["from"] is None:
            raise FilterError("to needs a from: the window's start")
        if times["to"] <= times["from"]:
            raise FilterError("from must be before to")
        if times["to"] - times["from"] > LONGEST_WINDOW:
            raise FilterError(f"a window is at most {LONGEST_WINDOW.days} days")
        return Window(times["from"], times["to"], "custom")
    name = (query.get("window") or default).strip()
    if name not in WINDOWS:
        raise FilterError(f"window must be one of {', '.join(WINDOWS)}, not {name!r}")
    return Window(now - WINDOWS[name], now, name)


def fitted_window(query: Mapping[str, str], first_at: datetime | None, now: datetime) -> Window | None:
    """The shortest window that still holds all of a young node's history, where the person asked
    for none (the default 24 h would draw a few minutes as dots at its right edge); None: keep it."""
    if first_at is None or any(query.get(k) for k in ("window", "from", "to")):
        return None
    for name in ("1h", "6h"):
        if first_at >= now - WINDOWS[name]:
            return Window(now - WINDOWS[name], now, name)
    return None


class FilterError(ValueError):
    """A filter in the query string that makes no sense; the message names it."""


def incident_filter(query: Mapping[str, str], statuses: Sequence[str]) -> IncidentFilter:
    """The incident list's filters from its query string (empty values mean any)."""
    values = {k: (query.get(k) or "").strip() or None for k in ("status", "kind", "node", "since", "until")}
    if values["status"] is not None and values["status"] not in statuses:
        raise FilterError(f"status must be one of {', '.join(statuses)}, not {values['status']!r}")
    times = {}
    for key in ("since", "until"):
        if values[key] is None:
            continue
        try:
            when = datetime.fromisoformat(values[key])
        except ValueError:
            raise FilterError(f"{key} must be a date and time such as 2026-11-23T10:00 (UTC), not {values[key]!r}") from None
        times[key] = when if when.tzinfo else when.replace(tzinfo=UTC)
    return IncidentFilter(status=values["status"], kind=values["kind"], node_id=values["node"], **times)

