"""`gpumedic report`: the orchestrator runbook's comprehensive check as one command.

It checks the configuration (the remediator's SSH key present, private and of a usable type; its
known_hosts covering every node of the inventory; the bus and the store reachable; the provider's
API and the task queue as the autoscaler's latest round found them), reads the
fleet's state from the store (open and escalated incidents, drained nodes, the breaker), and ends
with recommendations, most urgent first:

- P1, now: the breaker is open; the store or the bus is down; a service lost a durable consumer (it
  receives nothing of it, as its heartbeat says); a critical incident went to a person; a
  fleet-wide incident (it holds every node action until a person looks).
- P2, today: any other incident that went to a person; a critical incident gpumedic is still
  fixing; a configuration that stops gpumedic from acting (key, known_hosts, inventory).
- P3, watch: a warning incident gpumedic is fixing; an escalated info one.
- P4, note: info incidents being handled, silenced incidents.

A node without an open problem appears nowhere but in the counts. Secrets (a password in the
store's URL, what looks like a token or password in a command line of the evidence) are masked
unless `--show-secrets` is given.
"""

from __future__ import annotations

import asyncio
import html
import json
import os
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from sqlalchemy.exc import DBAPIError

from gpumedic_events.redact import redact_tree
from gpumedic_store import breaker, views
from gpumedic_store.engine import unreadable
from gpumedic_store.models import Incident
from gpumedic_store.settings import mask_url

PRIORITIES = {1: "P1 now", 2: "P2 today", 3: "P3 watch", 4: "P4 note"}
CATEGORY_OF_DETECTOR = {"zombie-detector": "node", "leader-health": "cluster", "autoscaler": "capacity"}
POOL_CHECKS = ("provider", "task queue")
POOL_ROUND_STALE_S = 600.0
"""A capacity round older than this is an autoscaler that stopped (its rounds come every minute or so)."""
_USABLE_KEYS = {b"ssh-ed25519", b"ecdsa-sha2-nistp256", b"ecdsa-sha2-nistp384", b"ecdsa-sha2-nistp521", b"ssh-rsa"}


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok, warn, fail
    detail: str


@dataclass(frozen=True)
class Recommendation:
    priority: int
    category: str
    issue: str
    action: str
    node: str | None = None
    incident_id: str | None = None


@dataclass
class Report:
    generated_at: datetime
    store: str
    checks: list[Check] = field(default_factory=list)
    fleet: dict = field(default_factory=dict)
    problems: list[dict] = field(default_factory=list)
    recommendations: list[Recommendation] = field(default_factory=list)
    since: dict | None = None
    """What changed since the last kept report (`compare`); None: none was kept, or none asked."""

    def to_dict(self) -> dict:
        return {
            "generated_at": self.generated_at.isoformat(timespec="seconds"), "store": self.store,
            "checks": [asdict(c) for c in self.checks], "fleet": self.fleet, "problems": self.problems,
            "recommendations": [asdict(r) | {"priority_name": PRIORITIES[r.priority]} for r in self.recommendations],
            **({"since": self.since} if self.since is not None else {}),
        }


# --- reports kept to compare over time (the runbook's --save-report, "keep historical data") ---

KEPT = "report-*.json"


def keep(report: Report, directory: Path) -> Path:
    """Write the report (as JSON, masked as printed) into `directory`, readable by its owner only."""
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    path = directory / f"report-{report.generated_at:%Y%m%dT%H%M%SZ}.json"
    with os.fdopen(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600), "w") as out:
        json.dump(report.to_dict(), out, indent=2)
    return path


def last_kept(directory: Path) -> tuple[Path, dict] | None:
    """The newest report kept in `directory` that can be read (a damaged one is passed over)."""
    for path in sorted(directory.glob(KEPT), reverse=True) if directory.is_dir() else ():
        try:
            kept = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(kept, dict) and isinstance(kept.get("recommendations"), list):
            return path, kept
    return None


def compare(report: Report, before: dict) -> dict:
    """What changed since `before` (a kept report): recommendations new and gone (an incident's by
    its id, others by what they say), checks whose status moved, and the fleet's counts."""
    def key(r: dict) -> tuple:
        return (r.get("incident_id"),) if r.get("incident_id") else (r.get("category"), r.get("node"), r.get("issue"))

    now = [asdict(r) for r in report.recommendations]
    then = [r for r in before.get("recommendations", []) if isinstance(r, dict)]
    then_keys, now_keys = {key(r) for r in then}, {key(r) for r in now}
    old_checks = {c.get("name"): c.get("status") for c in before.get("checks", []) if isinstance(c, dict)}
    fleet = before.get("fleet") if isinstance(before.get("fleet"), dict) else {}

    def count(value) -> int | None:
        return len(value) if isinstance(value, list) else None

    return {
        "previous_at": str(before.get("generated_at", "?")),
        "new": [r for r in now if key(r) not in then_keys],
        "gone": [r for r in then if key(r) not in now_keys],
        "checks": [f"{c.name}: {old_checks[c.name]} -> {c.status}" for c in report.checks
                   if c.name in old_checks and old_checks[c.name] != c.status],
        "nodes_with_problems": [count(fleet.get("nodes_with_problems")), len(report.fleet.get("nodes_with_problems", []))],
        "drained": [count(fleet.get("drained")), len(report.fleet.get("drained", []))],
    }


@dataclass(frozen=True)
class Sources:
    """Where the report looks: the store, the remediator's files, the bus (None: not configured)."""

    store_url: str
    inventory: Path | None = None
    known_hosts: Path | None = None
    client_key: Path | None = None
    nats: object | None = None  # NatsSettings


async def build_report(sources: Sources, *, node: str | None = None, show_secrets: bool = False) -> Report:
    now = datetime.now(UTC)
    hide = _as_is if show_secrets else redact_tree  # texts and evidence alike
    report = Report(generated_at=now, store=sources.store_url if show_secrets else mask_url(sources.store_url))
    nodes = _check_ssh(sources, report.checks)
    await _check_bus(sources, report.checks)
    try:
        async with views.store_session(sources.store_url) as session:
            rows = [*await views.list_incidents(session, where=views.IncidentFilter(status="escalated"), limit=10_000),
                    *await views.list_incidents(session, where=views.IncidentFilter(status="open"), limit=10_000)]
            trip = await breaker.open_trip(session=session)
            drained = sorted({d.node_id for d in await views.drains(session=session)})
            acks = await views.acknowledgements(session, incident_ids=[r.id for r in rows])
            pool = await views.latest_capacity_check(session)
        report.checks.append(Check("store", "ok", f"{report.store} answers ({len(rows)} open or escalated incident(s))"))
        report.checks += [Check(c.name, c.status, hide(c.detail)) for c in _check_pool(pool, now)]
    except Exception as exc:  # down, or never migrated: the report says so and goes on with what it has
        cause = unreadable(exc) if isinstance(exc, DBAPIError) else str(exc).splitlines()[0]
        report.checks.append(Check("store", "fail", f"cannot be read: {hide(cause)}"))
        rows, trip, drained, acks = [], None, [], {}
    if node is not None:
        rows = [r for r in rows if r.node_id == node]
    report.problems = [_problem(r, hide, acks.get(r.id)) for r in sorted(rows, key=lambda r: (r.node_id, r.opened_at))]
    report.fleet = {
        "nodes_in_inventory": len(nodes) if nodes is not None else None,
        "nodes_with_problems": sorted({r.node_id for r in rows}),
        "drained": drained,
        "breaker": {"open": trip is not None, "since": trip.tripped_at.isoformat(timespec="seconds") if trip else None,
                    "reason": trip.reason if trip else ""},
    }
    report.recommendations = sorted(_recommend(report, rows, trip, hide), key=lambda r: (r.priority, r.category, r.node or "", r.issue))
    return report


# --- the checks -------------------------------------------------------------------------------


def _check_ssh(sources: Sources, checks: list[Check]) -> dict | None:
    """The key, the inventory and known_hosts; the inventory's nodes (None when there is none)."""
    import asyncssh

    from gpumedic_nodes.inventory import InventoryError, load_inventory

    key = sources.client_key
    if key is None:
        checks.append(Check("ssh key", "warn", "no client key configured (GPUMEDIC_REMEDIATOR_CLIENT_KEY): nothing can act over SSH"))
    elif not key.is_file():
        checks.append(Check("ssh key", "fail", f"{key} does not exist"))
    else:
        try:
            private = asyncssh.read_private_key(str(key))
        except (OSError, ValueError, asyncssh.KeyImportError) as exc:
            checks.append(Check("ssh key", "fail", f"{key} is not a usable private key ({type(exc).__name__}; is it passphrase-protected?)"))
        else:
            bits = getattr(getattr(private, "pyca_key", None), "key_size", None)
            weak = private.algorithm == b"ssh-rsa" and (bits or 0) < 3072
            if private.algorithm not in _USABLE_KEYS or weak:
                checks.append(Check("ssh key", "fail", f"{key} is {private.algorithm.decode()}{f' of {bits} bits' if bits else ''}; "
                                    "use ed25519 (ssh-keygen -t ed25519) or RSA of 3072 bits or more"))
            elif key.stat().st_mode & 0o077:
                checks.append(Check("ssh key", "warn", f"{key} is readable by others (mode {oct(key.stat().st_mode & 0o777)}); chmod 600 it"))
            elif (mismatch := _public_half_differs(key, private)) is not None:
                checks.append(Check("ssh key", "fail", mismatch))
            else:
                checks.append(Check("ssh key", "ok", f"{key}: {private.algorithm.decode()}, readable by its owner only"))
    if sources.inventory is None:
        checks.append(Check("inventory", "warn", "no inventory configured (GPUMEDIC_REMEDIATOR_INVENTORY)"))
        return None
    try:
        nodes = load_inventory(sources.inventory)
    except InventoryError as exc:
        checks.append(Check("inventory", "fail", str(exc)))
        return None
    checks.append(Check("inventory", "ok", f"{sources.inventory}: {len(nodes)} node(s)"))
    if sources.known_hosts is None or not sources.known_hosts.is_file():
        checks.append(Check("known_hosts", "fail", f"{sources.known_hosts or 'no known_hosts file'}: host keys cannot be verified, so no node is reached"))
        return nodes
    known = asyncssh.read_known_hosts(str(sources.known_hosts))
    missing = sorted(n for n, a in nodes.items() if not known.match(a.host, "", a.port)[0])
    if missing:
        shown = ", ".join(missing[:10]) + (f" and {len(missing) - 10} more" if len(missing) > 10 else "")
        checks.append(Check("known_hosts", "fail", f"no host key for {len(missing)} of {len(nodes)} node(s): {shown}; "
                            "add them (ssh-keyscan, checked against the provider's console)"))
    else:
        checks.append(Check("known_hosts", "ok", f"{sources.known_hosts} covers all {len(nodes)} node(s)"))
    return nodes


def _check_pool(round_, now: datetime) -> list[Check]:
    """Runbook 001's checks of the provider's API (with its key) and of the task database, as the
    autoscaler made them in its latest round: it holds their credentials, and the report does not
    (least privilege). Nothing when no round was ever recorded (no autoscaler, or no provider)."""
    if round_ is None:
        return []
    at = round_.checked_at if round_.checked_at.tzinfo else round_.checked_at.replace(tzinfo=UTC)
    age_s = (now - at).total_seconds()
    when = f"the autoscaler's round at {at.isoformat(timespec='seconds')}"
    checks = []
    if age_s > POOL_ROUND_STALE_S:
        checks.append(Check("autoscaler", "warn", f"its latest round was {age_s / 60:.0f} min ago ({when}): is it running? "
                            "The provider and task-queue checks below are as old"))
    if round_.provider_error:
        checks.append(Check("provider", "fail", f"{when} could not list the workers: {round_.provider_error} "
                            "(if the API refuses the key, check the key file the autoscaler reads)"))
    elif round_.workers is not None:
        checks.append(Check("provider", "ok", f"{when} listed {round_.workers} worker(s), "
                            f"{round_.workers_in_service or 0} in service, ${round_.cost_per_h or 0:.2f}/h"))
    if round_.demand_error:
        checks.append(Check("task queue", "fail", f"{when} could not read the task queue: {round_.demand_error}"))
    elif round_.queued is not None:
        running = f", {round_.in_progress} in progress" if round_.in_progress is not None else ""
        checks.append(Check("task queue", "ok", f"{when} read it: {round_.queued} queued{running}"))
    return checks


async def _check_bus(sources: Sources, checks: list[Check]) -> None:
    if sources.nats is None:
        checks.append(Check("bus", "warn", "no NATS configured (GPUMEDIC_NATS_URL) and no embedded stack running under --var"))
        return
    from gpumedic_bus.service import CannotStart, wait_for_nats

    settings = sources.nats.model_copy(update={"start_wait_s": 0})
    try:
        await wait_for_nats(settings, "report")
    except CannotStart as exc:
        checks.append(Check("bus", "fail", str(exc)))
        return
    checks.append(Check("bus", "ok", f"NATS at {', '.join(settings.servers)} answers"))
    beats = await _heartbeats(settings)
    if isinstance(beats, str):
        checks.append(Check("consumers", "warn", beats))
        return
    checks.append(_check_consumers(beats))
    checks.append(_check_lag(beats))


async def _heartbeats(settings) -> list | str:
    """Every running service's heartbeat, listened to for one heartbeat interval and a little more;
    or why none could be read."""
    from gpumedic_bus import connect
    from gpumedic_bus.runtime import HEARTBEAT_EVERY_S
    from gpumedic_events import EventDecodeError, ServiceHeartbeat

    beats: dict[str, ServiceHeartbeat] = {}

    async def on_beat(msg) -> None:
        try:
            beat = ServiceHeartbeat.from_json(msg.data, subject=msg.subject)
        except EventDecodeError:
            return
        beats[str(beat.instance_id)] = beat

    try:
        nc = await connect(settings, "gpumedic-report", allow_reconnect=False, max_reconnect_attempts=0)
    except Exception as exc:  # answered a moment ago; say it rather than fail the report
        return f"heartbeats not read: {exc}"
    try:
        await nc.subscribe(ServiceHeartbeat.subject_filter(), cb=on_beat)
        await asyncio.sleep(HEARTBEAT_EVERY_S + 1.0)
    finally:
        await nc.close()
    if not beats:
        return "no service's heartbeat in the last few seconds: is the stack running?"
    return list(beats.values())


def _check_consumers(beats: list) -> Check:
    """Every service that runs says in its heartbeat which of its durable consumers are gone (it
    receives nothing of them)."""
    blind = sorted({(b.service, name) for b in beats for name in b.consumers_missing})
    if blind:
        gone = ", ".join(f"{name} ({service})" for service, name in blind)
        return Check("consumers", "fail", f"consumers gone, their services receive nothing of them: {gone}; run `gpumedic provision`")
    return Check("consumers", "ok", f"every durable consumer of {len({b.service for b in beats})} running services is there")


LAG_WARN_S = 10.0
"""A sample consumer behind its stream by more than this is said (zombie-detector's
`control_plane_behind` incident opens at the same figure, by default)."""


def _check_lag(beats: list) -> Check:
    """Each sample consumer says in its heartbeat how far behind its samples it is."""
    behind = sorted(((b.service, lag) for b in beats for lag in b.lag if lag.behind_s > LAG_WARN_S), key=lambda x: -x[1].behind_s)
    if behind:
        said = "; ".join(f"{service} {lag.behind_s:.0f}s behind ({lag.pending:,} samples waiting on {lag.durable})" for service, lag in behind)
        return Check("samples", "warn", f"{said}: what it judges is that late, and it judges no node silent meanwhile")
    consumers = sum(len(b.lag) for b in beats)
    return Check("samples", "ok", f"{consumers} sample consumers keep up with the samples" if consumers else "no sample consumer runs")


# --- the fleet's problems ---------------------------------------------------------------------


def _public_half_differs(key: Path, private) -> str | None:
    """Runbook 001's check that the key pair is one: the `.pub` beside the key (what was put in the
    nodes' authorized_keys) must be the private key's public half. None when it is, or there is none."""
    import asyncssh

    public = key.with_name(key.name + ".pub")
    if not public.is_file():
        return None
    try:
        given = asyncssh.read_public_key(str(public))
    except (OSError, ValueError, asyncssh.KeyImportError) as exc:
        return f"{public} is not a public key ({type(exc).__name__})"
    if given.public_data != private.public_data:
        return (f"{public} is not {key.name}'s public half: the nodes authorized the key in {public.name}, but the remediator "
                f"logs in with {key.name} (make it again: ssh-keygen -y -f {key} > {public})")
    return None


def _as_is(value):
    return value


def _problem(row: Incident, hide: Callable, ack=None) -> dict:
    return {
        "incident_id": row.id, "node_id": row.node_id, "gpu_index": row.gpu_index, "kind": row.kind, "status": row.status,
        "severity": row.severity, "detector": row.detector, "opened_at": row.opened_at.isoformat(timespec="seconds"),
        "summary": hide(row.summary), "recommended_action": hide(row.recommended_action),
        "silenced": row.silence_id is not None, "evidence": hide(row.evidence or {}),
        "acknowledged_by": ack.marked_by if ack else None,
        "acknowledged_at": ack.marked_at.isoformat(timespec="seconds") if ack else None,
    }


def _recommend(report: Report, rows: list[Incident], trip, hide: Callable) -> list[Recommendation]:
    out: list[Recommendation] = []
    if trip is not None and trip.reason.startswith(breaker.PAUSED_BY):
        out.append(Recommendation(1, "safety", f"remediation is {trip.reason}",
                                  "no action runs on any node until `gpumedic resume --by NAME`; incidents go to a person meanwhile"))
    elif trip is not None:
        out.append(Recommendation(1, "safety", f"the fleet circuit breaker is open: {trip.reason}",
                                  "check the fleet, then `gpumedic breaker reset --by NAME`; no action runs until then"))
    for check in report.checks:
        if check.status == "fail":
            urgent = check.name in ("store", "bus", "consumers")
            cannot = "cannot record or decide" if urgent else "cannot scale the worker pool" if check.name in POOL_CHECKS \
                else "cannot act on the nodes"
            out.append(Recommendation(1 if urgent else 2, "config", f"{check.name}: {check.detail}", f"fix it: gpumedic {cannot} until then"))
    for row in rows:
        category = "fleet" if row.kind == "fleet_anomaly" else CATEGORY_OF_DETECTOR.get(row.detector, "node")
        where = row.node_id + (f" GPU {row.gpu_index}" if row.gpu_index is not None else "")
        issue = f"{row.kind} on {where}: {row.summary}"
        see = f"`gpumedic incidents {row.id[:8]}`"
        if row.silence_id is not None:
            priority, action = 4, f"silenced: recorded, no action; {see}"
        elif row.status == "escalated":
            priority = 1 if row.severity == "critical" or category == "fleet" else 2 if row.severity == "warning" else 3
            action = f"a person must look: {row.recommended_action or row.resolution or 'see the incident'} ({see})"
        else:
            priority = 1 if category == "fleet" else {"critical": 2, "warning": 3}.get(row.severity, 4)
            action = f"gpumedic is handling it{': ' + row.recommended_action if row.recommended_action else ''}; watch it resolve ({see})"
        out.append(Recommendation(priority, category, hide(issue), hide(action), row.node_id, row.id))
    return out


# --- formats ----------------------------------------------------------------------------------


def render(report: Report, fmt: str) -> str:
    if fmt == "json":
        return json.dumps(report.to_dict(), indent=2)
    return _markdown(report) if fmt == "md" else _html(report)


def _markdown(report: Report) -> str:
    f = report.fleet
    lines = [f"# gpumedic report, {report.generated_at:%Y-%m-%d %H:%M}Z", "", f"store: {report.store}", "",
             "## Recommendations", ""]
    if report.recommendations:
        lines += ["| priority | category | issue | action |", "|---|---|---|---|"]
        lines += [f"| {PRIORITIES[r.priority]} | {r.category} | {_cell(r.issue)} | {_cell(r.action)} |" for r in report.recommendations]
    else:
        lines.append("nothing to do: no open problem, every check passed")
    if (s := report.since) is not None:
        lines += ["", f"## Since the last kept report ({s['previous_at']})", ""]
        lines += [f"- new: {PRIORITIES.get(r['priority'], r['priority'])} {_cell(r['issue'])}" for r in s["new"]]
        lines += [f"- gone: {PRIORITIES.get(r.get('priority'), r.get('priority'))} {_cell(str(r.get('issue', '')))}" for r in s["gone"]]
        lines += [f"- check {_cell(c)}" for c in s["checks"]]
        for name in ("nodes_with_problems", "drained"):
            before, after = s[name]
            if before != after:
                lines.append(f"- {name.replace('_', ' ')}: {before if before is not None else '?'} -> {after}")
        if lines[-1] == "":
            lines.append("nothing changed")
    lines += ["", "## Checks", "", "| check | status | detail |", "|---|---|---|"]
    lines += [f"| {c.name} | {c.status} | {_cell(c.detail)} |" for c in report.checks]
    breaker = f"OPEN since {f['breaker']['since']}: {f['breaker']['reason']}" if f["breaker"]["open"] else "closed"
    lines += ["", "## Fleet", "", f"- nodes in the inventory: {f['nodes_in_inventory'] if f['nodes_in_inventory'] is not None else 'unknown'}",
              f"- nodes with open problems: {len(f['nodes_with_problems'])} {', '.join(f['nodes_with_problems'])}".rstrip(),
              f"- drained: {', '.join(f['drained']) or 'none'}", f"- breaker: {breaker}", "", "## Open problems by node", ""]
    node = None
    for p in report.problems:
        if p["node_id"] != node:
            node = p["node_id"]
            lines += ["", f"### {node}", ""]
        gpu = f" GPU {p['gpu_index']}" if p["gpu_index"] is not None else ""
        acked = f", acknowledged by {p['acknowledged_by']} at {p['acknowledged_at']}" if p["acknowledged_by"] else ""
        lines.append(f"- `{p['incident_id'][:8]}` {p['kind']}{gpu}, {p['severity']}, {p['status']} since {p['opened_at']}{acked}: {p['summary']}")
    if not report.problems:
        lines.append("none")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def _html(report: Report) -> str:
    e = html.escape
    rows = "".join(f"<tr class='p{r.priority}'><td>{e(PRIORITIES[r.priority])}</td><td>{e(r.category)}</td><td>{e(r.issue)}</td>"
                   f"<td>{e(r.action)}</td></tr>" for r in report.recommendations) or "<tr><td colspan=4>nothing to do</td></tr>"
    checks = "".join(f"<tr class='{e(c.status)}'><td>{e(c.name)}</td><td>{e(c.status)}</td><td>{e(c.detail)}</td></tr>" for c in report.checks)
    problems = "".join(f"<tr><td>{e(p['node_id'])}</td><td>{e(p['kind'])}</td><td>{e(p['severity'])}</td><td>{e(p['status'])}{e(', acknowledged by ' + p['acknowledged_by']) if p['acknowledged_by'] else ''}</td>"
                       f"<td>{e(p['opened_at'])}</td><td>{e(p['summary'])}</td></tr>" for p in report.problems) or "<tr><td colspan=6>none</td></tr>"
    return f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>gpumedic report {report.generated_at:%Y-%m-%d %H:%M}Z</title>
<style>body{{font:14px system-ui,sans-serif;margin:2em}}table{{border-collapse:collapse;margin-bottom:2em}}
td,th{{border:1px solid #ccc;padding:4px 8px;text-align:left;vertical-align:top}}.p1 td:first-child,.fail td:nth-child(2){{color:#b00;font-weight:bold}}
.p2 td:first-child,.warn td:nth-child(2){{color:#b60}}</style></head><body>
<h1>gpumedic report, {report.generated_at:%Y-%m-%d %H:%M}Z</h1><p>store: {e(report.store)}</p>
<h2>Recommendations</h2><table><tr><th>priority</th><th>category</th><th>issue</th><th>action</th></tr>{rows}</table>
{_html_since(report)}
<h2>Checks</h2><table><tr><th>check</th><th>status</th><th>detail</th></tr>{checks}</table>
<h2>Open problems</h2><table><tr><th>node</th><th>kind</th><th>severity</th><th>status</th><th>since</th><th>summary</th></tr>{problems}</table>
</body></html>
"""


def _html_since(report: Report) -> str:
    if (s := report.since) is None:
        return ""
    e = html.escape
    items = [f"<li>new: {e(PRIORITIES.get(r['priority'], ''))} {e(r['issue'])}</li>" for r in s["new"]]
    items += [f"<li>gone: {e(str(PRIORITIES.get(r.get('priority'), '')))} {e(str(r.get('issue', '')))}</li>" for r in s["gone"]]
    items += [f"<li>check {e(c)}</li>" for c in s["checks"]]
    return f"<h2>Since the last kept report ({e(s['previous_at'])})</h2><ul>{''.join(items) or '<li>nothing changed</li>'}</ul>"


def sources_from(store_url: str, var_dir: Path) -> Sources:
    """The remediator's files as every command finds them (`gpumedic.remediator_paths`), or none;
    the bus from GPUMEDIC_NATS_URL, else the embedded stack running under `var_dir`."""
    from gpumedic.remediator_paths import remediator_file
    from gpumedic.stack import Stack
    from gpumedic_bus import NatsSettings
    from gpumedic_bus.topology import OBSERVER

    nats = NatsSettings() if os.environ.get("GPUMEDIC_NATS_URL") else Stack.running(var_dir, OBSERVER)
    files = (remediator_file(name, var_dir, fallback=False) for name in ("INVENTORY", "KNOWN_HOSTS", "CLIENT_KEY"))
    return Sources(store_url, *files, nats)
