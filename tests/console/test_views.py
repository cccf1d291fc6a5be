"""The console's pure views: fleet health, the trace waterfall, charts and the list's filters."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpumedic_events import GpuSample, NodeSampled
from report_builder.console import views

NOW = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


def _sample(node: str, age_s: float = 1, util: int = 90) -> views.NodeReading:
    return views.NodeReading.of(NodeSampled(
        source="node-sampler", node_id=node, occurred_at=NOW - timedelta(seconds=age_s), interval_s=10,
        gpus=(GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=40_000, memory_total_mib=80_000, temperature_c=61),),
    ))


def _incident(node: str, kind: str, severity: str = "warning", status: str = "open"):
    return SimpleNamespace(id=f"{node}-{kind}", node_id=node, kind=kind, severity=severity, status=status)


def test_each_node_shows_its_worst_state_and_the_worst_nodes_come_first():
    samples = {n: _sample(n) for n in ("a-ok", "b-warn", "c-crit", "d-drained", "e-info")}
    samples["f-silent"] = _sample("f-silent", age_s=300)
    unresolved = {
        "b-warn": [_incident("b-warn", "zombie_job")],
        "c-crit": [_incident("c-crit", "zombie_job"), _incident("c-crit", "gpu_lost", "critical")],
        "e-info": [_incident("e-info", "container_died", "info")],
        "g-gone": [_incident("g-gone", "node_silent", "warning", "escalated")],
    }
    tiles = views.fleet(samples, unresolved, {"d-drained"}, NOW, silent_after_s=60)
    assert [(t.node_id, t.health) for t in tiles] == [
        ("g-gone", "escalated"), ("c-crit", "critical"), ("b-warn", "warning"), ("d-drained", "drained"),
        ("f-silent", "silent"), ("e-info", "info"), ("a-ok", "ok"),
    ]
    crit = tiles[1]
    assert crit.why == "gpu_lost (critical, open)" and {k for _, k, _ in crit.incidents} == {"zombie_job", "gpu_lost"}
    assert tiles[4].why == "last sample 300s ago"
    assert tiles[0].gpus == () and tiles[0].why == "node_silent (warning, escalated)"
    gpu = tiles[-1].gpus[0]
    assert (gpu.utilization_pct, gpu.memory_pct, gpu.temperature_c) == (90, 50, 61)


def _span(span_id, parent, start_ms, end_ms, name="s"):
    t0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
    return SimpleNamespace(span_id=span_id, parent_span_id=parent, name=name, service="svc", status="OK", attributes={},
                           started_at=t0 + timedelta(milliseconds=start_ms), ended_at=t0 + timedelta(milliseconds=end_ms))


def test_the_waterfall_puts_children_under_parents_on_one_time_axis():
    spans = [_span("c2", "root", 50, 80), _span("root", None, 0, 100), _span("c1", "root", 10, 40), _span("g", "c1", 20, 30),
             _span("orphan", "not-kept", 90, 120)]
    fall = views.waterfall(spans)
    assert [(b.span_id, b.depth) for b in fall.bars] == [("root", 0), ("c1", 1), ("g", 2), ("c2", 1), ("orphan", 0)]
    assert fall.total_ms == pytest.approx(120)
    c1 = fall.bars[1]
    assert (c1.offset_ms, c1.duration_ms) == (pytest.approx(10), pytest.approx(30))
    assert fall.x(60, 600) == pytest.approx(300)
    assert views.waterfall([]).bars == ()


def test_a_time_chart_is_seconds_and_named_series():
    t0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
    chart = views.time_chart("gpus", "GPUs", "GPUs", [t0, t0 + timedelta(minutes=1)], {"busy": [3, None]})
    assert chart["times"] == [int(t0.timestamp()), int(t0.timestamp()) + 60]
    assert chart["series"] == [{"label": "busy", "values": [3, None]}] and chart["unit"] == "GPUs"


def test_a_history_window_is_a_named_span_back_from_now_or_from_and_to():
    now = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    assert views.history_window({}, now) == views.Window(now - timedelta(hours=24), now, "24h")
    assert views.history_window({"window": "1h"}, now).start == now - timedelta(hours=1)
    custom = views.history_window({"from": "2026-11-26T08:00", "to": "2026-11-26T09:30"}, now)
    assert (custom.start.hour, custom.end.minute, custom.name, custom.start.tzinfo) == (8, 30, "custom", UTC)
    assert views.history_window({"from": "2026-11-26T08:00"}, now).end == now
    for query, says in (
        ({"window": "5y"}, "window must be one of 1h, 6h, 24h, 7d"),
        ({"from": "yesterday"}, "from must be a date and time"),
        ({"to": "2026-11-26T08:00"}, "to needs a from"),
        ({"from": "2026-11-26T09:00", "to": "2026-11-26T08:00"}, "from must be before to"),
        ({"from": "2026-01-01T00:00", "to": "2026-11-26T08:00"}, "at most 31 days"),
    ):
        with pytest.raises(views.FilterError, match=says):
            views.history_window(query, now)
def test_the_list_filter_is_checked_and_says_what_is_wrong():
    statuses = ("open", "resolved", "escalated")
    where = views.incident_filter({"status": "open", "kind": "zombie_job", "node": " n1 ", "since": "2026-11-23T10:00"}, statuses)
    assert (where.status, where.kind, where.node_id, where.since) == ("open", "zombie_job", "n1", datetime(2026, 11, 23, 10, tzinfo=UTC))
    assert views.incident_filter({"status": "", "until": ""}, statuses).status is None
    with pytest.raises(views.FilterError, match="status must be one of open, resolved, escalated, not 'closed'"):
        views.incident_filter({"status": "closed"}, statuses)
    with pytest.raises(views.FilterError, match="until must be a date and time"):
        views.incident_filter({"until": "yesterday"}, statuses)


def test_a_steady_series_breaks_where_nothing_was_checked():
    """Checks every 10 s with a 60 s hole (a restart): a point with no value goes into the hole, so
    the chart draws a gap there instead of a line across it; an irregular last step is no hole."""
    times = [NOW + timedelta(seconds=s) for s in (0, 10, 20, 30, 90, 100, 125)]
    chart = views.time_chart("peers", "Peers", "peers", times, {"answering": [3, 3, 3, 3, 2, 2, 2]}, breaks=True)
    stamps = [t - int(NOW.timestamp()) for t in chart["times"]]
    assert stamps == [0, 10, 20, 30, 40, 90, 100, 125]
    assert chart["series"][0]["values"] == [3, 3, 3, 3, None, 2, 2, 2]
    assert views.time_chart("peers", "Peers", "peers", times, {"answering": [3] * 7})["times"] == [int(t.timestamp()) for t in times]


@pytest.mark.parametrize(("first_minutes_ago", "query", "fitted"), [
    (20, {}, "1h"), (200, {}, "6h"), (600, {}, None), (20, {"window": "24h"}, None), (None, {}, None),
])
def test_a_young_nodes_page_fits_its_window_to_the_history_it_has(first_minutes_ago, query, fitted):
    first = None if first_minutes_ago is None else NOW - timedelta(minutes=first_minutes_ago)
    window = views.fitted_window(query, first, NOW)
    assert (window.name if window else None) == fitted
    if window is not None:
        assert window.end == NOW and window.start <= first
