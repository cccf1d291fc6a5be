"""What happened: incidents, the remediator's actions, the report, drained nodes, the peer cluster's log, costs and silences."""

from __future__ import annotations

import asyncio
import functools
import sys

import click

from gpumedic.cli.core import PATH, NoStore, by_option, command, json_option, store_option, store_url, var_option
from gpumedic.remediator_paths import remediator_file
from gpumedic_events import ACKNOWLEDGED_NOTE, IncidentKind


def cmd_incidents(args) -> int:
    from gpumedic import operator_bus
    from gpumedic.incidents import false_positives_text, incident_text, incidents_text, mark_text

    url = store_url(args)
    words = args.words
    if words and words[0] in ("mark", "ack"):
        if words[0] == "mark" and (len(words) != 2 or not args.false_positive or not args.reason):
            print("gpumedic incidents: usage: gpumedic incidents mark ID --false-positive --reason TEXT [--by NAME]", file=sys.stderr)
            return 2
        if words[0] == "ack" and len(words) != 2:
            print("gpumedic incidents: usage: gpumedic incidents ack ID [--reason NOTE] [--by NAME]", file=sys.stderr)
            return 2
        verdict, reason = ("false_positive", args.reason) if words[0] == "mark" else ("acknowledged", args.reason or ACKNOWLEDGED_NOTE)
        bus = functools.partial(operator_bus.operator_settings, args.var)
        try:
            done, text = asyncio.run(mark_text(url, words[1], verdict=verdict, reason=reason, by=args.by, bus=bus))
        except (operator_bus.OperatorError, ValueError) as exc:  # no bus, or a field the event refuses
            print(f"gpumedic incidents: {exc}", file=sys.stderr)
            return 2
        except (OSError, TimeoutError, RuntimeError) as exc:
            print(f"gpumedic incidents: cannot reach the bus: {exc}", file=sys.stderr)
            return 1
        print(text, file=sys.stdout if done else sys.stderr)
        return 0 if done else 1
    if len(words) > 1:
        print(f"gpumedic incidents: one incident id at a time, not {' '.join(words)!r}", file=sys.stderr)
        return 2
    if args.false_positives:
        print(asyncio.run(false_positives_text(url, as_json=args.json)))
    elif words:
        found, text = asyncio.run(incident_text(url, words[0], as_json=args.json))
        print(text, file=sys.stdout if found else sys.stderr)
        return 0 if found else 1
    else:
        print(asyncio.run(incidents_text(url, status=args.status, limit=args.limit, as_json=args.json)))
    return 0


def cmd_actions(args) -> int:
    """The remediator's audit log: every decision, and what each action ran on its node."""
    from gpumedic.actions import action_text, actions_text

    url = store_url(args)
    if args.action_id:
        found, text = asyncio.run(action_text(url, args.action_id, as_json=args.json))
        print(text, file=sys.stdout if found else sys.stderr)
        return 0 if found else 1
    print(asyncio.run(actions_text(url, node_id=args.node, incident=args.incident, limit=args.limit, as_json=args.json)))
    return 0


def cmd_report(args) -> int:
    """The diagnostics report (exit 1 when something needs a person now: a P1), or the reliability
    report of every host and provider over `--since`."""
    if args.what == "reliability":
        return _reliability_report(args)
    from gpumedic.report import build_report, compare, keep, last_kept, render, sources_from

    report = asyncio.run(build_report(sources_from(store_url(args), args.var), node=args.node, show_secrets=args.show_secrets))
    kept = args.var / "reports"
    if args.keep and (before := last_kept(kept)) is not None:
        report.since = compare(report, before[1])
    text = render(report, args.format)
    if args.output:
        args.output.write_text(text)
        print(f"report written to {args.output} ({len(report.recommendations)} recommendation(s))")
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    if args.keep:
        print(f"report kept as {keep(report, kept)}", file=sys.stderr)
    return 1 if any(r.priority == 1 for r in report.recommendations) else 0


def _lookback(args):
    """`--since` as a span back from now (30m, 6h, 7d); None, having said why, when it is not one."""
    from datetime import timedelta

    from gpumedic.times import parse_lookback

    try:
        return timedelta(seconds=parse_lookback(args.since))
    except ValueError as exc:
        print(f"gpumedic: --since: {exc}", file=sys.stderr)
        return None


def _reliability_report(args) -> int:
    from gpumedic import reliability

    if (since := _lookback(args)) is None:
        return 2
    report = asyncio.run(reliability.build(store_url(args), since=since))
    text = reliability.render(report, args.format)
    if args.output:
        args.output.write_text(text)
        print(f"reliability report written to {args.output} ({len(report.hosts)} host(s), {len(report.providers)} provider(s))")
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 0


def cmd_drained(args) -> int:
    """Drained nodes from the store: the remediator's holds, one per incident."""
    from gpumedic.actions import drained_text

    print(asyncio.run(drained_text(store_url(args), node_id=args.node, as_json=args.json)))
    return 0


def cmd_workers(args) -> int:
    """The worker pool's table from the store (the autoscaler's latest round, kept by report-builder)."""
    from gpumedic.workers import workers_text

    print(asyncio.run(workers_text(store_url(args), status=args.status, as_json=args.json)))
    return 0


def cmd_cluster(args) -> int:
    """The cluster monitoring log from the store (leader-health's checks, kept by report-builder)."""
    from datetime import timedelta

    from gpumedic.clusterlog import log_text
    from gpumedic.times import parse_time
    from gpumedic_store.clusterlog import Goal

    if (args.goal_peers is None) != (args.goal_hours is None):
        print("gpumedic: --goal-peers and --goal-hours go together", file=sys.stderr)
        return 2
    try:
        since = timedelta(seconds=parse_time(args.since))
    except ValueError as exc:
        print(f"gpumedic: --since: {exc}", file=sys.stderr)
        return 2
    goal = Goal(args.goal_peers, args.goal_hours) if args.goal_peers is not None else None
    print(asyncio.run(log_text(store_url(args), cluster=args.cluster, since=since, goal=goal, rows=args.rows, as_json=args.json)))
    return 0


def cmd_cost(args) -> int:
    """The GPU time incidents cost, from the store (report-builder prices each incident)."""
    from gpumedic.cost import cost_text

    if (since := _lookback(args)) is None:
        return 2
    print(asyncio.run(cost_text(store_url(args), since=since, by=args.by, as_json=args.json)))
    return 0


def cmd_silence(args) -> int:
    """Silences go over the bus (as the `operator` user); the list is read from the store."""
    from datetime import UTC, datetime

    from pydantic import ValidationError

    from gpumedic import operator_bus, silences
    from gpumedic.times import parse_start, parse_time

    if args.action == "list":
        print(asyncio.run(silences.silences_text(store_url(args), include_past=args.all, as_json=args.json)))
        return 0
    try:
        settings = operator_bus.operator_settings(args.var)
        if args.action == "add":
            if not args.reason:
                raise operator_bus.OperatorError("say why with --reason (it is kept on every silenced incident)")
            year = 366 * 86400.0  # a silence's times may reach this far
            duration_s = parse_time(args.duration, limit_s=year)
            if duration_s <= 0:
                raise operator_bus.OperatorError("--for must be longer than 0s")
            starts_at = parse_start(args.starts, datetime.now(UTC), limit_s=year)
            if (args.every is None) != (args.repeat_until is None):
                raise operator_bus.OperatorError("a recurring window needs both --every and --repeat-until")
            every_s = parse_time(args.every, limit_s=year) if args.every is not None else None
            repeat_until = parse_start(args.repeat_until, starts_at, limit_s=year) if args.repeat_until is not None else None
            matchers = list(args.match)
            if silences.names_a_group(matchers):  # an inventory group: its nodes
                from gpumedic_nodes.inventory import InventoryError, load_inventory

                inventory = remediator_file("INVENTORY", args.var)
                try:
                    groups = {node: address.group for node, address in load_inventory(inventory).items()}
                except InventoryError as exc:
                    raise operator_bus.OperatorError(f"a group matcher needs the remediator's inventory: {exc}") from None
                matchers = silences.expand_groups(matchers, groups)
            try:
                event = silences.build(reason=args.reason, by=args.by, duration_s=duration_s, node_id=args.node, kind=args.kind,
                                       gpu_index=args.gpu, matchers=matchers, starts_at=starts_at, every_s=every_s,
                                       repeat_until=repeat_until)
            except ValidationError as exc:  # one line: the field and what is wrong with it
                error = exc.errors()[0]
                where = ".".join(str(part) for part in error["loc"]) or "the window"
                hint = "; several nodes: --match 'node=~REGEX'" if where == "node_id" else ""
                raise operator_bus.OperatorError(f"{where}: {error['msg'].removeprefix('Value error, ')}{hint}") from None
            try:
                store = store_url(args)
            except NoStore:
                if args.preview:
                    raise
                store = None  # no store to read here (compose without GPUMEDIC_STORE_URL): not checked
            if store is not None and (args.preview or not args.unseen):
                seen = asyncio.run(silences.preview(store, event))
                if args.preview:
                    print(silences.preview_text(event, seen))
                    return 0
                silences.check(event, seen)
            event = asyncio.run(silences.add(settings, event))
            print(f"added {silences.describe(event)}")
        else:
            if not args.silence_id:
                raise operator_bus.OperatorError("name the silence to lift: gpumedic silence remove ID")
            silence_id = asyncio.run(silences.whole_id(lambda: store_url(args), args.silence_id))
            event = asyncio.run(silences.remove(settings, silence_id=silence_id, by=args.by))
            print(f"silence {event.silence_id} lifted by {event.removed_by}")
    except (operator_bus.OperatorError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"gpumedic silence: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"gpumedic silence: cannot reach the bus: {exc}", file=sys.stderr)
        return 1
    return 0


command(
    "incidents", cmd_incidents, "list incidents, show one's timeline and trace, acknowledge one or mark it a false positive",
    click.argument("words", nargs=-1, metavar="[ID | ack ID | mark ID]"),
    click.option("--status", type=click.Choice(["open", "resolved", "escalated"]), help="only incidents in this state"),
    click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True),
    click.option("--false-positive", is_flag=True, help="with `mark`: the verdict"),
    click.option("--reason", help="with `mark`: why it was wrong; with `ack`: a note (default: looking into it)"),
    by_option(what="with `mark` and `ack`: who"),
    click.option("--false-positives", is_flag=True, help="the false-positive ledger per detector and kind"),
    var_option(), store_option(), json_option(),
    description="\b\n"
    "gpumedic incidents                          the latest incidents\n"
    "gpumedic incidents ID                       one incident: cause, evidence, timeline, trace\n"
    "gpumedic incidents ack ID [--reason NOTE]   say you are looking at it (the console and\n"
    "                                            Alertmanager show who, and since when)\n"
    "gpumedic incidents mark ID --false-positive --reason TEXT\n"
    "                                            record that it was wrong (the ledger counts it)\n"
    "gpumedic incidents --false-positives        per detector and kind: how often it was wrong",
)


command(
    "actions", cmd_actions, "the remediator's audit log: every decision with its reason, and each command an action ran",
    click.argument("action_id", required=False),
    click.option("--node", help="only this node"),
    click.option("--incident", help="only this incident (id or its start)"),
    click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True, help="at most this many"),
    var_option(), store_option(), json_option(),
    description="Every request the remediator decided on (run, refused with the rule that refused it, or observed), newest "
    "first. With an action id (a prefix will do): each command it ran on the node, with exit status, a digest of its "
    "output and its timing.",
)


command(
    "cluster", cmd_cluster, "the peer cluster's monitoring log: every check over time, and its summary",
    click.argument("what", type=click.Choice(["log"])),
    click.option("--cluster", help="only this cluster (default: every cluster checked)"),
    click.option("--since", default="6h", show_default=True, help="how far back, e.g. 30m, 6h"),
    click.option("--goal-peers", type=int, help="the goal: at least this many peers answering ..."),
    click.option("--goal-hours", type=float, help="... for this many hours in a row"),
    click.option("--rows", type=click.IntRange(min=1), default=30, show_default=True, help="the last this many checks are listed"),
    var_option(), store_option(), json_option(),
    description="leader-health's checks as kept in the store, with what the runbook computed by hand: peak and current "
    "peers, time with a leader, leader changes per hour, the longest stretch without a leader, the quorum margin, and "
    "whether a goal of N peers for H hours holds.",
)


command(
    "cost", cmd_cost, "what incidents cost: the GPU-hours they kept from work and their price, by kind, node, provider or day",
    click.option("--since", default="7d", show_default=True, help="how far back, e.g. 12h, 7d, 30d"),
    click.option("--by", type=click.Choice(["kind", "node", "provider", "day"]), default="kind", show_default=True, help="what to sum by"),
    var_option(), store_option(), json_option(),
    description="An incident costs the GPU time it kept from work: a GPU idle under a zombie job or a leftover process "
    "(from before it was detected), a lost GPU, a drained node's GPUs, a rented worker billed for nothing. Its price is the "
    "provider's for a rented worker, else the inventory's price_per_gpu_hour; report-builder works it out on every event "
    "of the incident. Open incidents count up to now.",
)


command(
    "drained", cmd_drained, "the nodes gpumedic drained, which incident holds each, and since when",
    click.option("--node", help="only this node"), var_option(), store_option(), json_option(),
    description="A node is drained (takes no new jobs) while an incident holds it: it comes back once every incident "
    "holding it is fixed and its GPUs were validated on the next samples.",
)


command(
    "workers", cmd_workers, "the rented workers: provider status, task database status, heartbeat age, host, $/h, task",
    click.option("--status", help="only workers with this status (the provider's or the task database's), e.g. spawning"),
    var_option(), store_option(), json_option(),
    description="Runbook 001's workers table, as of the autoscaler's latest round: each live worker the provider bills, beside "
    "what the task database says of it (its status, how long since its heartbeat, the task it has In Progress), and whether "
    "gpumedic counts it as capacity.",
)


command(
    "report", cmd_report, "the diagnostics report (configuration checks, open problems, recommendations), or `report reliability`",
    click.argument("what", type=click.Choice(["diagnostics", "reliability"]), default="diagnostics", required=False),
    click.option("--since", default="30d", show_default=True, help="with reliability: how far back, e.g. 7d, 30d"),
    click.option("--node", help="only this node's problems"),
    click.option("--format", type=click.Choice(["md", "json", "html"]), default="md", show_default=True,
                 help="markdown, JSON or a standalone HTML page"),
    click.option("--output", "-o", type=PATH, help="write it to this file instead of printing it"),
    click.option("--show-secrets", is_flag=True, help="do not mask passwords and tokens"),
    click.option("--keep", is_flag=True, help="keep this report in VAR/reports (JSON, owner-only) and say what changed since the last one kept"),
    var_option(), store_option(),
    description="Checks the remediator's SSH key and known_hosts against the inventory, the bus and the store, then lists "
    "every open or escalated incident by node and what to do, most urgent first (P1 now .. P4 note). Secrets are masked "
    "unless --show-secrets. With --keep, the report is kept (VAR/reports) and says what changed since the last one kept: "
    "recommendations new and gone, checks that moved, nodes with problems and drained. `gpumedic report reliability --since 30d`: per host and provider, incidents per 100 GPU-days by "
    "kind, mean time to detect and to repair, availability, goodput and the GPU time lost: evidence to send a provider.",
)


command(
    "silence", cmd_silence, "add, list or lift silences: maintenance windows and known issues",
    click.argument("action", type=click.Choice(["add", "list", "remove"])),
    click.argument("silence_id", required=False),
    click.option("--node", help="only this node"),
    click.option("--kind", type=click.Choice([k.value for k in IncidentKind]), metavar="KIND", help="only this incident kind"),
    click.option("--gpu", type=int, help="only this GPU index"),
    click.option("--match", multiple=True, metavar="MATCHER",
                 help="a condition as Alertmanager writes it on node, kind, gpu, cluster or group: node=~'gpu-0[34]', kind!=gpu_xid, "
                 "gpu=~'.+', cluster=selfplay, group=spot (the inventory group's nodes now) (repeatable; all must hold)"),
    click.option("--preview", is_flag=True, help="with `add`: show the nodes and the unresolved incidents it matches now, and add nothing"),
    click.option("--for", "duration", default="1h", show_default=True, help="how long, e.g. 30m, 4h"),
    click.option("--starts", default="now", show_default=True,
                 help="when it starts: now, a delay (30m, 2h) or a time with its zone (2026-12-01T02:00Z)"),
    click.option("--every", metavar="PERIOD", help="a recurring window: again every PERIOD (1h to 31d, e.g. 7d), for as long"),
    click.option("--repeat-until", metavar="WHEN", help="with --every: no window starts after this (a delay from the start, or a time)"),
    click.option("--reason", help="why (required for add)"),
    by_option(what="who"),
    click.option("--all", is_flag=True, help="with `list`: also silences that ended or were lifted"),
    click.option("--unseen", is_flag=True, help="with `add`: nodes the store has not heard of yet (else refused)"),
    var_option(), store_option(), json_option(),
    description="A silenced incident is still recorded, with its silence, but no action is requested for it. A silence "
    "matches every incident on its node (any node if none is given), of its kind and on its GPU, for which every --match "
    "holds (`=` and `!=` compare, `=~` and `!~` match a regular expression against the whole label). One that names nodes "
    "the store does not know is refused, with the nodes it knows.",
)
