"""Formatting for the pages and their templates: times, durations, sizes, chart data, masked values, a post-mortem's lines."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from jinja2.utils import htmlsafe_json_dumps
from markupsafe import Markup

from gpumedic_events import IncidentKind
from gpumedic_events.redact import redact


def when(value: datetime | None) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%SZ") if value else "-"


def ago(value: datetime | None) -> str:
    if value is None:
        return "never"
    seconds = (datetime.now(UTC) - value).total_seconds()
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{max(seconds, 0):.0f}s ago"


def duration(value: timedelta | float | None) -> str:
    """A span of time as a person says it: 1 h 30 min, 4 min 12 s, 12 s (never 0:01:30.002000)."""
    if value is None:
        return "-"
    seconds = round(value.total_seconds() if isinstance(value, timedelta) else float(value))
    days, rest = divmod(seconds, 86400)
    hours, rest = divmod(rest, 3600)
    minutes, secs = divmod(rest, 60)
    parts = [(days, "d"), (hours, "h"), (minutes, "min"), (secs, "s")]
    shown = [f"{n} {unit}" for n, unit in parts if n][:2]
    return " ".join(shown) or "0 s"


def gib(mib: float | None) -> str:
    return "?" if mib is None else f"{mib / 1024:.1f} GiB"


class ChartData(Markup):
    """Charts' JSON, its text masked already, label by label, where it was made (views)."""


def chart_json(charts: list[dict]) -> ChartData:
    # tens of thousands of numbers: masking the whole text again would cost more than the page
    return ChartData(htmlsafe_json_dumps(charts, separators=(",", ":")))


def masked(value: object) -> object:
    """Every value a page shows passes here (jinja2's finalize): job text is masked however old the
    row it comes from (gpumedic_events.redact)."""
    if not isinstance(value, str) or isinstance(value, ChartData):
        return value
    # Markup (already escaped HTML, e.g. `tojson`) stays Markup, or it would be escaped twice.
    return type(value)(redact(str(value))) if hasattr(value, "__html__") else redact(value)


POSTMORTEM_ORDER = ("container", "image", "exit_code", "signal", "engine_signal", "oom_killed", "oom_pid", "oom_constraint",
                    "oom_kernel_line", "last_lines", "container_id")
"""The facts of a container's death in the order an operator asks for them."""


def postmortem(incident) -> list[tuple[str, str]] | None:
    """Why a container died, as facts (the named cause first); None for other kinds."""
    if incident.kind != IncidentKind.CONTAINER_DIED.value:
        return None
    evidence = incident.evidence or {}
    facts = [(k.replace("_", " "), str(evidence[k])) for k in POSTMORTEM_ORDER if evidence.get(k) not in (None, "")]
    facts += [(k.replace("_", " "), str(v)) for k, v in evidence.items() if k not in POSTMORTEM_ORDER and v not in (None, "")]
    diagnosis = incident.diagnosis or {}
    if diagnosis:
        facts.insert(0, ("cause", f"{str(diagnosis.get('cause', '?')).replace('_', ' ')} "
                                  f"({float(diagnosis.get('confidence', 0)):.0%} sure): {diagnosis.get('explanation', '')}"))
    return facts
