"""What `gpumedic report reliability` writes: each host's and provider's record over a span
(`gpumedic_store.reliability`), as JSON, Markdown or one self-contained HTML file to send a
provider. Job text never appears: only counts, times and shares."""

from __future__ import annotations

import html
import json
from datetime import UTC, datetime, timedelta

from gpumedic_store import views
from gpumedic_store.reliability import Figures, Reliability, reliability

COLUMNS = ("host", "provider", "GPU-days", "incidents", "per 100 GPU-days", "MTTD", "MTTR", "availability", "goodput", "GPU-h lost", "$ lost")


async def build(store_url: str, *, since: timedelta, now: datetime | None = None) -> Reliability:
    now = now or datetime.now(UTC)
    async with views.store_session(store_url) as session:
        return await reliability(session, now - since, now)


def render(report: Reliability, fmt: str) -> str:
    if fmt == "json":
        return json.dumps({
            "since": report.since.isoformat(), "until": report.until.isoformat(), "fleet": report.fleet.as_json(),
            "providers": [f.as_json() for f in report.providers], "hosts": [f.as_json() for f in report.hosts],
        }, indent=2)
    return _markdown(report) if fmt == "md" else _html(report)


def _columns(first: str) -> tuple[str, ...]:
    """A provider's table has no provider column."""
    return (first, *(c for c in COLUMNS[1:] if not (first == "provider" and c == "provider")))


def _row(f: Figures, *, first: str) -> list[str]:
    return [
        f.group, *([] if first == "provider" else [f.provider or "-"]), f"{f.gpu_days:.2f}", str(f.incident_count), _num(f.per_100_gpu_days, "{:.1f}"), _span(f.mttd_s),
        _span(f.mttr_s), _num(f.availability, "{:.2%}"), _num(f.goodput, "{:.1%}"), f"{f.lost_gpu_hours:.2f}", f"{f.lost_usd:,.2f}",
    ]


def _kinds(f: Figures) -> str:
    return ", ".join(f"{kind} {n}" for kind, n in f.incidents.most_common()) or "none"


def _markdown(report: Reliability) -> str:
    head = f"# gpumedic reliability, {report.since:%Y-%m-%d %H:%M}Z to {report.until:%Y-%m-%d %H:%M}Z"
    lines = [head, "", _fleet_line(report.fleet), "", "## By provider", "", _md_table(report.providers, "provider"), "",
             "## By host (the least reliable first)", "", _md_table(report.hosts, "host"), "", "## Incidents by kind", ""]
    lines += [f"- **{f.group}**: {_kinds(f)}" for f in report.hosts if f.incident_count] or ["none"]
    lines += ["", _notes()]
    return "\n".join(lines) + "\n"


def _md_table(rows: list[Figures], first: str) -> str:
    if not rows:
        return "none observed"
    out = ["| " + " | ".join(_columns(first)) + " |", "|" + "---|" * len(_columns(first))]
    out += ["| " + " | ".join(cell.replace("|", "\\|") for cell in _row(f, first=first)) + " |" for f in rows]
    return "\n".join(out)


def _fleet_line(f: Figures) -> str:
    return (f"The fleet: {f.gpu_days:.1f} GPU-days observed on {len(f.nodes)} node(s); {f.incident_count} incident(s) "
            f"({_num(f.per_100_gpu_days, '{:.1f}')} per 100 GPU-days); availability {_num(f.availability, '{:.2%}')}; "
            f"goodput {_num(f.goodput, '{:.1%}')}; {f.lost_gpu_hours:.1f} GPU-hours lost (${f.lost_usd:,.2f}).")


def _notes() -> str:
    return ("GPU-days: the GPU-minutes the nodes' samples covered. MTTD: how long a fault had lasted when its incident opened, "
            "where the evidence says. MTTR: opened to resolved. Availability: observed GPU-hours not lost to incidents. Goodput: "
            "observed GPU-hours the GPUs were at work (10 % utilisation or more). A rented worker counts for the provider's "
            "machine its incidents name.")


def _html(report: Reliability) -> str:
    e = html.escape

    def table(rows: list[Figures], first: str) -> str:
        if not rows:
            return "<p>none observed</p>"
        head = "".join(f"<th>{e(c)}</th>" for c in _columns(first))
        body = "".join(
            f"<tr class='{'bad' if (f.per_100_gpu_days or 0) > 0 else ''}'>" + "".join(f"<td>{e(c)}</td>" for c in _row(f, first=first))
            + f"<td>{e(_kinds(f))}</td></tr>" for f in rows
        )
        return f"<table><thead><tr>{head}<th>incidents by kind</th></tr></thead><tbody>{body}</tbody></table>"

    title = f"gpumedic reliability, {report.since:%Y-%m-%d %H:%M}Z to {report.until:%Y-%m-%d %H:%M}Z"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><meta name="viewport" content="width=device-width, initial-scale=1"><title>{e(title)}</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em;color:#111827}}table{{border-collapse:collapse;margin-bottom:2em;display:block;overflow-x:auto}}
td,th{{border:1px solid #d1d5db;padding:4px 8px;text-align:left;vertical-align:top;white-space:nowrap}}th{{background:#f3f4f6}}
tr.bad td:first-child{{border-left:4px solid #b26a00}}p.note{{color:#6b7280;max-width:60em}}</style></head><body>
<h1>{e(title)}</h1><p>{e(_fleet_line(report.fleet))}</p>
<h2>By provider</h2>{table(report.providers, "provider")}
<h2>By host, the least reliable first</h2>{table(report.hosts, "host")}
<p class="note">{e(_notes())}</p>
</body></html>
"""


def _num(value: float | None, fmt: str) -> str:
    return "-" if value is None else fmt.format(value)


def _span(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f} h" if seconds >= 3600 else f"{seconds / 60:.1f} min" if seconds >= 60 else f"{seconds:.0f} s"
