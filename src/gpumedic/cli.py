"""`gpumedic`: the front door. Start the embedded stack, run one service, read incidents."""

from __future__ import annotations

import argparse
import asyncio
import importlib
import os
import signal
import sys
from collections.abc import Coroutine
from pathlib import Path

from gpumedic.stack import SERVICES
from gpumedic_events import IncidentKind

DEFAULT_VAR = Path("var")

_DESCRIPTION = """\
gpumedic finds and fixes what goes wrong on rented GPU fleets: zombie jobs, GPUs held by
leftover processes, leaderless clusters, stuck workers. It samples every node, detects,
decides, acts over SSH through one safety gate, verifies, and records each incident with
its trace.

Start here:
  gpumedic demo              the whole stack on one machine with a simulated fleet and
                             one injected zombie job, shown from detection to fix
  gpumedic up                the embedded stack (bus, store, six services) until Ctrl-C
  gpumedic incidents         what happened; `gpumedic incidents ID` for one incident's
                             timeline and trace
"""


def _run(coro: Coroutine) -> int:
    """Run until done, Ctrl-C or SIGTERM; cleanup in the coroutine's `finally` always runs."""

    async def _main():
        task = asyncio.current_task()
        asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, task.cancel)
        return await coro

    try:
        return asyncio.run(_main()) or 0
    except (KeyboardInterrupt, asyncio.CancelledError):
        return 130
    except (RuntimeError, TimeoutError, OSError) as exc:  # a service or server that would not start
        print(f"gpumedic: {exc}", file=sys.stderr)
        return 1


def _store_url(args) -> str:
    if args.store:
        return args.store
    from gpumedic_store import StoreSettings

    return StoreSettings().url


def cmd_demo(args) -> int:
    from gpumedic.demo import run_demo

    return _run(
        run_demo(
            args.var, nodes=args.nodes, gpus=args.gpus, duration_s=args.duration,
            keep_running=args.keep_running, stop_after_s=args.duration,
        )
    )


def cmd_sim(args) -> int:
    import random

    from gpumedic.sim.scenario import Scenario, ScenarioError, load_scenario, parse_fault_option, resolve_scenario_path
    from gpumedic.simulate import run_simulation

    def plan(node_ids: list[str], gpus: int) -> Scenario:
        if args.scenario:
            scenario = load_scenario(
                resolve_scenario_path(args.scenario), node_ids=node_ids, gpus_per_node=gpus, seed=args.seed
            )
        else:
            scenario = Scenario(name="command line", description="", duration_s=None, faults=())
        rng = random.Random(args.seed + 1)
        extra = [parse_fault_option(text, node_ids=node_ids, gpus_per_node=gpus, rng=rng) for text in args.fault]
        return scenario.with_faults(extra)

    if args.nodes < 1 or args.gpus < 1 or args.interval <= 0:
        print("gpumedic sim: --nodes and --gpus must be at least 1, --interval positive", file=sys.stderr)
        return 2
    try:
        # check the scenario before anything starts: a typo should cost a second, not a stack start
        from gpumedic.sim.fleet import node_ids_for

        plan(node_ids_for(args.nodes), args.gpus)
    except ScenarioError as exc:
        print(f"gpumedic sim: {exc}", file=sys.stderr)
        return 2
    return _run(
        run_simulation(
            args.var,
            nodes=args.nodes,
            gpus=args.gpus,
            scenario=plan,
            duration_s=args.duration,
            interval_s=args.interval,
            json_path=args.json,
        )
    )


def cmd_up(args) -> int:
    if args.demo:
        from gpumedic.demo import run_demo

        story_s = 180.0 if args.duration is None else min(180.0, args.duration)
        return _run(
            run_demo(
                args.var, nodes=args.nodes, gpus=args.gpus, duration_s=story_s, keep_running=True, stop_after_s=args.duration
            )
        )
    from gpumedic.stack import Stack, remediator_files

    async def _up() -> int:
        stack = Stack(args.var)
        try:
            print(f"[1/3] starting the bus and the store under {args.var}/")
            stack.start_bus()
            await stack.provision()
            stack.migrate()
            stack.env = remediator_files(args.var)
            print("[2/3] starting the six services (the remediator in observe mode unless GPUMEDIC_REMEDIATOR_MODE=enforce)")
            stack.start_services()
            await stack.wait_ready()
            print(f"[3/3] running; logs in {stack.logs}/. Ctrl-C stops everything.")
            print(f"      console: {stack.console_url} (to act from it, log in with the token in {stack.console_token_file})")
            print(f"      bus: {stack.nats.url}   store: {stack.store_url}")
            print(f"      metrics: http://127.0.0.1:PORT/metrics, ports in {args.var}/prometheus-targets.json "
                  f"({', '.join(f'{s} {p}' for s, p in stack.metrics_ports.items())})")
            while True:
                await asyncio.sleep(1 if args.duration is None else args.duration)
                if args.duration is not None:
                    return 0
                stack.check_alive()
        finally:
            print("stopping services, then the bus")
            stack.stop()
            print("stopped; no process left behind")

    return _run(_up())


def cmd_run(args) -> int:
    module = importlib.import_module(f"{SERVICES[args.service]}.main")
    module.run()
    return 0


def cmd_incidents(args) -> int:
    from gpumedic.incidents import false_positives_text, incident_text, list_text, mark_false_positive_text

    url = _store_url(args)
    words = args.words
    if words and words[0] == "mark":
        if len(words) != 2 or not args.false_positive or not args.reason:
            print("gpumedic incidents: usage: gpumedic incidents mark ID --false-positive --reason TEXT [--by NAME]", file=sys.stderr)
            return 2
        done, text = asyncio.run(mark_false_positive_text(url, words[1], reason=args.reason, by=args.by))
        print(text, file=sys.stdout if done else sys.stderr)
        return 0 if done else 1
    if len(words) > 1:
        print(f"gpumedic incidents: one incident id at a time, not {' '.join(words)!r}", file=sys.stderr)
        return 2
    if args.false_positives:
        print(asyncio.run(false_positives_text(url, as_json=args.json)))
    elif words:
        print(asyncio.run(incident_text(url, words[0], as_json=args.json)))
    else:
        print(asyncio.run(list_text(url, status=args.status, limit=args.limit, as_json=args.json)))
    return 0


def cmd_actions(args) -> int:
    """The remediator's audit log: every decision, and what each action ran on its node."""
    from gpumedic.actions import action_text, list_text

    url = _store_url(args)
    if args.action_id:
        found, text = asyncio.run(action_text(url, args.action_id, as_json=args.json))
        print(text, file=sys.stdout if found else sys.stderr)
        return 0 if found else 1
    print(asyncio.run(list_text(url, node_id=args.node, incident=args.incident, limit=args.limit, as_json=args.json)))
    return 0


def cmd_report(args) -> int:
    """The diagnostics report; exit 1 when something needs a person now (a P1)."""
    from gpumedic.report import build_report, render, sources_from

    report = asyncio.run(build_report(sources_from(_store_url(args), args.var), node=args.node, show_secrets=args.show_secrets))
    text = render(report, args.format)
    if args.output:
        args.output.write_text(text)
        print(f"report written to {args.output} ({len(report.recommendations)} recommendation(s))")
    else:
        print(text, end="" if text.endswith("\n") else "\n")
    return 1 if any(r.priority == 1 for r in report.recommendations) else 0


def cmd_drained(args) -> int:
    """Drained nodes from the store: the remediator's holds, one per incident."""
    from gpumedic.actions import drained_text

    print(asyncio.run(drained_text(_store_url(args), node_id=args.node, as_json=args.json)))
    return 0


def cmd_cluster(args) -> int:
    """The cluster monitoring log from the store (leader-health's checks, kept by report-builder)."""
    from datetime import timedelta

    from gpumedic.clusterlog import log_text
    from gpumedic.sim.scenario import parse_time
    from report_builder.clusterlog import Goal

    if (args.goal_peers is None) != (args.goal_hours is None):
        print("gpumedic: --goal-peers and --goal-hours go together", file=sys.stderr)
        return 2
    try:
        since = timedelta(seconds=parse_time(args.since))
    except ValueError as exc:
        print(f"gpumedic: --since: {exc}", file=sys.stderr)
        return 2
    goal = Goal(args.goal_peers, args.goal_hours) if args.goal_peers is not None else None
    print(asyncio.run(log_text(_store_url(args), cluster=args.cluster, since=since, goal=goal, rows=args.rows, as_json=args.json)))
    return 0


def cmd_silence(args) -> int:
    """Silences go over the bus (as the `operator` user); the list is read from the store."""
    from gpumedic import silences
    from gpumedic.sim.scenario import parse_time

    if args.action == "list":
        print(asyncio.run(silences.list_text(_store_url(args), include_past=args.all, as_json=args.json)))
        return 0
    try:
        settings = silences.operator_settings(args.var)
        if args.action == "add":
            if not args.reason:
                raise silences.OperatorError("say why with --reason (it is kept on every silenced incident)")
            duration_s = parse_time(args.duration)
            if duration_s <= 0:
                raise silences.OperatorError("--for must be longer than 0s")
            event = asyncio.run(
                silences.add(
                    settings, reason=args.reason, by=args.by, duration_s=duration_s,
                    node_id=args.node, kind=args.kind, gpu_index=args.gpu,
                )
            )
            print(f"added {silences.describe(event)}")
        else:
            if not args.silence_id:
                raise silences.OperatorError("name the silence to lift: gpumedic silence remove ID")
            event = asyncio.run(silences.remove(settings, silence_id=args.silence_id, by=args.by))
            print(f"silence {event.silence_id} lifted by {event.removed_by}")
    except (silences.OperatorError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"gpumedic silence: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"gpumedic silence: cannot reach the bus: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_migrate(args) -> int:
    from gpumedic_store import StoreSettings
    from gpumedic_store.migrate import upgrade

    url = _store_url(args)
    upgrade(url)
    print(f"migrated {StoreSettings(url=url).safe_url} to the latest revision")
    return 0


def cmd_init(args) -> int:
    """Generate the secrets of a compose deployment (see gpumedic.deployment)."""
    from gpumedic.deployment import init_deployment
    from remediator.inventory import InventoryError, load_inventory

    nodes = list(args.node)
    try:
        if args.inventory:
            nodes += list(load_inventory(args.inventory))
        done = init_deployment(args.dir, nodes=nodes, nats_hosts=args.nats_host)
    except (OSError, ValueError, InventoryError) as exc:
        print(f"gpumedic init: {exc}", file=sys.stderr)
        return 2
    for line in done:
        print(f"  {line}")
    print("next: `docker compose up -d` (it provisions the bus and migrates the store first)")
    return 0


def cmd_inventory(args) -> int:
    """Try every inventory node read-only: a login, and which catalogue tools it has."""
    from remediator.health import check_inventory, check_report
    from remediator.inventory import InventoryError
    from remediator.settings import Settings

    overrides = {k: v for k, v in (("inventory", args.inventory), ("known_hosts", args.known_hosts), ("client_key", args.key)) if v}
    settings = Settings(**overrides)
    try:
        checks = asyncio.run(check_inventory(settings.executor(args.timeout), settings.inventory))
    except InventoryError as exc:
        print(f"gpumedic inventory: {exc}", file=sys.stderr)
        return 2
    print(check_report(checks))
    return 0 if all(c.ok for c in checks) else 1


def cmd_preflight(args) -> int:
    """Are a node's GPUs ready for the next job? Exit 0 ready, 1 not ready, 2 the check could not be made."""
    from gpumedic import preflight, silences
    from gpumedic_bus.topology import LAUNCHER
    from gpumedic_events import PreflightRequest

    try:
        request = PreflightRequest(node_id=args.node, gpus=preflight.parse_gpus(args.gpus), clean=args.clean, requested_by=args.by)
        settings = silences.operator_settings(args.var, LAUNCHER)
        report = asyncio.run(preflight.ask(settings, request, timeout_s=args.timeout))
    except (silences.OperatorError, preflight.NoAnswer, ValueError) as exc:  # ValidationError is a ValueError
        print(f"gpumedic preflight: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as exc:
        print(f"gpumedic preflight: cannot reach the bus: {exc}", file=sys.stderr)
        return 2
    print(report.model_dump_json(indent=2) if args.json else report.summary())
    if report.error and not report.gpus:
        return 2
    return 0 if report.ready else 1


def cmd_provision(args) -> int:
    """Provision the bus as its admin: `gpumedic-provision` under another name."""
    from gpumedic_bus.provision import main as provision_main

    provision_main()
    return 0


def cmd_breaker(args) -> int:
    """The remediator's fleet circuit breaker: it stays open until a person resets it here."""
    from datetime import UTC, datetime

    from gpumedic_store import create_engine, session_factory
    from gpumedic_store import breaker

    async def _breaker() -> str:
        engine = create_engine(_store_url(args))
        try:
            async with session_factory(engine)() as session:
                if args.action == "reset":
                    trips = await breaker.reset(session=session, by=args.by, now=datetime.now(UTC))
                    await session.commit()
                    return f"breaker reset by {args.by}" if trips else "the breaker was closed; nothing to reset"
                trip = await breaker.open_trip(session=session)
        finally:
            await engine.dispose()
        if args.json:
            from gpumedic.output import to_json

            return to_json({"open": trip is not None, "since": trip.tripped_at if trip else None, "reason": trip.reason if trip else ""})
        if trip is None:
            return "breaker closed: the remediator may act"
        return f"breaker OPEN since {trip.tripped_at:%Y-%m-%d %H:%M:%S}Z: {trip.reason}\nreset it with: gpumedic breaker reset --by NAME"

    print(asyncio.run(_breaker()))
    return 0


def cmd_policy(args) -> int:
    """Check a policy file before a service refuses to start on it, or show the one in force."""
    from gpumedic_incidents import PolicyError, PolicySettings, load_policy

    try:
        if args.action == "check":
            if args.file is None:
                print("gpumedic policy: usage: gpumedic policy check FILE", file=sys.stderr)
                return 2
            policy = load_policy(args.file)
            missing = policy.unconfigured()
            ladders = sum(1 for name in type(policy.kinds).model_fields if getattr(policy.kinds, name).ladder and name not in missing)
            waiting = f"; {len(missing)} more once you set {', '.join(f'{k}: {v}' for k, v in missing.items())}" if missing else ""
            print(f"{args.file}: valid; {ladders} kinds act on their own{waiting}; the rest escalate to a person")
            return 0
        settings = PolicySettings()
        policy = settings.load()
    except PolicyError as exc:
        print(f"gpumedic policy: {exc}", file=sys.stderr)
        return 2
    import yaml

    print(f"# in force: {settings.file or 'the shipped default'} (GPUMEDIC_POLICY_FILE)")
    print(yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False), end="")
    return 0


def cmd_proto(args) -> int:
    from gpumedic import proto

    return proto.main(["--check"] if args.check else [])


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="gpumedic", description=_DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    def json_option(p):
        p.add_argument("--json", action="store_true", help="print JSON instead of a table (for scripts and jq)")

    def fleet_options(p):
        p.add_argument("--nodes", type=int, default=4, help="simulated nodes (default 4)")
        p.add_argument("--gpus", type=int, default=2, help="GPUs per simulated node (default 2)")
        p.add_argument("--var", type=Path, default=DEFAULT_VAR, help="where the bus, store, logs and fleet files live (default ./var)")

    p = sub.add_parser("demo", help="the embedded stack on a simulated fleet, with one zombie job fixed end to end")
    fleet_options(p)
    p.add_argument("--duration", type=float, default=180.0, help="give up after this many seconds (default 180)")
    p.add_argument("--keep-running", action="store_true", help="keep the stack up after the story, until --duration or Ctrl-C")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser(
        "sim",
        help="the embedded stack on a simulated fleet with scripted faults, scored against ground truth",
        description="Start the embedded stack and a simulated fleet, inject the faults of a scenario "
        "(a YAML file, or a built-in one by name) and of --fault options on schedule, and score the "
        "incidents against each injection's answer key (precision, recall, time to incident), then show "
        "how each incident ended (fixed, cleared, escalated) and which escalations paged the simulated "
        "on-call webhook.",
    )
    p.add_argument("--nodes", type=int, default=20, help="simulated nodes (default 20)")
    p.add_argument("--gpus", type=int, default=8, help="GPUs per simulated node (default 8)")
    p.add_argument("--var", type=Path, default=DEFAULT_VAR, help="where the bus, store, logs and fleet files live (default ./var)")
    p.add_argument("--scenario", help="a scenario file, or a built-in scenario's name (e.g. faults)")
    p.add_argument(
        "--fault",
        action="append",
        default=[],
        metavar="FIELDS",
        help="one more fault, e.g. fault=zombie_job,at=10s,node=3,gpu=2 (repeatable)",
    )
    p.add_argument("--duration", type=float, default=None, help="seconds to run (default: the scenario's, else until detection had time)")
    p.add_argument("--interval", type=float, default=5.0, help="seconds between samples per node (default 5)")
    p.add_argument("--seed", type=int, default=0, help="seed for 'random' nodes and GPUs (default 0)")
    p.add_argument("--json", type=Path, default=None, help="also write the score as JSON to this file")
    p.set_defaults(func=cmd_sim)

    p = sub.add_parser("up", help="start the embedded stack: nats-server, SQLite store, the six services")
    fleet_options(p)
    p.add_argument("--demo", action="store_true", help="also start a simulated fleet and inject a zombie job")
    p.add_argument("--duration", type=float, default=None, help="stop after this many seconds (default: until Ctrl-C)")
    p.set_defaults(func=cmd_up)

    p = sub.add_parser("run", help="run one service in the foreground (settings from GPUMEDIC_* variables)")
    p.add_argument("service", choices=sorted(SERVICES), help="which service")
    p.set_defaults(func=cmd_run)

    p = sub.add_parser(
        "incidents",
        help="list incidents, show one's timeline and trace, or mark one a false positive",
        description="gpumedic incidents                          the latest incidents\n"
        "gpumedic incidents ID                       one incident: cause, evidence, timeline, trace\n"
        "gpumedic incidents mark ID --false-positive --reason TEXT\n"
        "                                            record that it was wrong (the ledger counts it)\n"
        "gpumedic incidents --false-positives        per detector and kind: how often it was wrong",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("words", nargs="*", metavar="ID | mark ID", help="an incident id (or its first characters), or `mark ID`")
    p.add_argument("--status", choices=["open", "resolved", "escalated"], help="only incidents in this state")
    p.add_argument("--limit", type=int, default=50)
    p.add_argument("--false-positive", action="store_true", help="with `mark`: the verdict")
    p.add_argument("--reason", help="with `mark`: why it was wrong")
    p.add_argument("--by", default=os.environ.get("USER", "operator"), help="with `mark`: who says so (default $USER)")
    p.add_argument("--false-positives", action="store_true", help="the false-positive ledger per detector and kind")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_incidents)

    p = sub.add_parser(
        "actions",
        help="the remediator's audit log: every decision with its reason, and each command an action ran",
        description="Every request the remediator decided on (run, refused with the rule that refused it, or "
        "observed), newest first. With an action id (a prefix will do): each command it ran on the node, "
        "with exit status, a digest of its output and its timing.",
    )
    p.add_argument("action_id", nargs="?", help="one action's id, or the start of it")
    p.add_argument("--node", help="only this node")
    p.add_argument("--incident", help="only this incident (id or its start)")
    p.add_argument("--limit", type=int, default=50, help="at most this many (default 50)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_actions)

    p = sub.add_parser(
        "cluster",
        help="the peer cluster's monitoring log: every check over time, and its summary",
        description="leader-health's checks as kept in the store, with what the runbook computed by hand: peak and "
        "current peers, time with a leader, leader changes per hour, the longest stretch without a leader, the "
        "quorum margin, and whether a goal of N peers for H hours holds.",
    )
    p.add_argument("what", choices=["log"], help="log: the checks and their summary")
    p.add_argument("--cluster", help="only this cluster (default: every cluster checked)")
    p.add_argument("--since", default="6h", help="how far back, e.g. 30m, 6h (default 6h)")
    p.add_argument("--goal-peers", type=int, help="the goal: at least this many peers answering ...")
    p.add_argument("--goal-hours", type=float, help="... for this many hours in a row")
    p.add_argument("--rows", type=int, default=30, help="the last this many checks are listed (default 30)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_cluster)

    p = sub.add_parser(
        "drained",
        help="the nodes gpumedic drained, which incident holds each, and since when",
        description="A node is drained (takes no new jobs) while an incident holds it: it comes back once every "
        "incident holding it is fixed and its GPUs were validated on the next samples.",
    )
    p.add_argument("--node", help="only this node")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_drained)

    p = sub.add_parser(
        "report",
        help="the diagnostics report: configuration checks, the fleet's open problems, prioritised recommendations",
        description="Checks the remediator's SSH key and known_hosts against the inventory, the bus and the store, "
        "then lists every open or escalated incident by node and what to do, most urgent first (P1 now .. P4 note). "
        "Secrets are masked unless --show-secrets.",
    )
    p.add_argument("--node", help="only this node's problems")
    p.add_argument("--format", choices=["md", "json", "html"], default="md", help="markdown (default), JSON or a standalone HTML page")
    p.add_argument("--output", "-o", type=Path, help="write it to this file instead of printing it")
    p.add_argument("--show-secrets", action="store_true", help="do not mask passwords and tokens")
    p.add_argument("--var", type=Path, default=DEFAULT_VAR, help="the embedded stack's directory (default ./var)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser(
        "silence",
        help="add, list or lift silences: maintenance windows and known issues",
        description="A silenced incident is still recorded, with its silence, but no action is requested for it. "
        "A silence matches every incident on its node (any node if none is given), of its kind and on its GPU.",
    )
    p.add_argument("action", choices=["add", "list", "remove"])
    p.add_argument("silence_id", nargs="?", help="with `remove`: the silence's id")
    p.add_argument("--node", help="only this node")
    p.add_argument("--kind", choices=[k.value for k in IncidentKind], metavar="KIND", help="only this incident kind")
    p.add_argument("--gpu", type=int, help="only this GPU index")
    p.add_argument("--for", dest="duration", default="1h", help="how long, e.g. 30m, 4h (default 1h)")
    p.add_argument("--reason", help="why (required for add)")
    p.add_argument("--by", default=os.environ.get("USER", "operator"), help="who (default $USER)")
    p.add_argument("--all", action="store_true", help="with `list`: also silences that ended or were lifted")
    p.add_argument("--var", type=Path, default=DEFAULT_VAR, help="the embedded stack's directory (default ./var)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_silence)

    p = sub.add_parser("migrate", help="create or upgrade the store's tables (SQLite or PostgreSQL)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    p.set_defaults(func=cmd_migrate)

    p = sub.add_parser(
        "init",
        help="generate a compose deployment's secrets: .env, NATS users, TLS, per-node credentials",
        description="Generate what compose needs instead of placeholders: real passwords in .env, "
        "a CA and the NATS server's certificate, the NATS users with their permissions, and one "
        "credentials file per GPU node. Existing secrets are kept; run it again to add nodes.",
    )
    p.add_argument("--dir", type=Path, default=Path("."), help="the directory with compose.yaml (default .)")
    p.add_argument("--node", action="append", default=[], metavar="ID", help="a GPU node that runs a node-sampler (repeatable)")
    p.add_argument("--inventory", type=Path, help="take the nodes from a remediator inventory file")
    p.add_argument(
        "--nats-host", action="append", default=[], metavar="NAME",
        help="a name or address GPU nodes reach NATS by; goes into the server certificate (repeatable)",
    )
    p.set_defaults(func=cmd_init)

    p = sub.add_parser(
        "inventory",
        help="check the remediator's inventory: log in to every node read-only and say what fails",
        description="For every node: an SSH login as the remediator makes it (the node's user, port, key and "
        "jump host, host keys checked), and which of the tools the catalogue calls it has. Nothing else runs. "
        "Exits 1 if any node fails, 2 if the inventory itself is wrong.",
    )
    p.add_argument("action", choices=["check"])
    p.add_argument("--inventory", type=Path, help="default: GPUMEDIC_REMEDIATOR_INVENTORY, else /etc/gpumedic/inventory.yaml")
    p.add_argument("--known-hosts", type=Path, help="default: GPUMEDIC_REMEDIATOR_KNOWN_HOSTS")
    p.add_argument("--key", type=Path, help="the client key; default: GPUMEDIC_REMEDIATOR_CLIENT_KEY")
    p.add_argument("--timeout", type=float, default=10.0, help="seconds for each login and command (default 10)")
    p.set_defaults(func=cmd_inventory)

    p = sub.add_parser(
        "preflight",
        help="before a job starts: are the node's GPUs free and healthy? (--clean removes leftovers through the gate)",
        description="Checks, read-only over the remediator's SSH, that each GPU answers, admits jobs, runs no compute "
        "process, is held open by no leftover and has little memory in use. With --clean, leftovers on an idle GPU "
        "are killed through the remediator's gate (breaker, protected nodes, caps, observe mode) and the GPUs are "
        "checked again. Exit 0: ready; 1: not ready (the reasons are printed); 2: the check could not be made.",
    )
    p.add_argument("--node", required=True, help="the node, as the inventory names it")
    p.add_argument("--gpus", help="GPU indexes, e.g. 0,1 (default: every GPU)")
    p.add_argument("--clean", action="store_true", help="kill leftovers on idle GPUs, through the gate, then check again")
    p.add_argument("--by", default=os.environ.get("USER", "launcher"), help="who asks (kept with a clean in the audit log)")
    p.add_argument("--timeout", type=float, default=60.0, help="seconds to wait for the answer (default 60)")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    p.add_argument("--var", type=Path, default=DEFAULT_VAR, help="the embedded stack's directory (default ./var)")
    p.set_defaults(func=cmd_preflight)

    p = sub.add_parser("provision", help="create the bus's streams, buckets and consumers (as the NATS admin, GPUMEDIC_NATS_*)")
    p.set_defaults(func=cmd_provision)

    p = sub.add_parser("breaker", help="show or reset the remediator's fleet circuit breaker")
    p.add_argument("action", choices=["status", "reset"], nargs="?", default="status")
    p.add_argument("--by", default=os.environ.get("USER", "operator"), help="who resets it (kept in the audit log)")
    p.add_argument("--store", help="store URL (default: GPUMEDIC_STORE_URL, else sqlite under ./var)")
    json_option(p)
    p.set_defaults(func=cmd_breaker)

    p = sub.add_parser(
        "policy",
        help="check a policy file, or show the policy in force (GPUMEDIC_POLICY_FILE, else the shipped one)",
        description="The policy says how each incident kind is detected, what is done about it and when a "
        "person takes over; every service that decides reads the same file.",
    )
    p.add_argument("action", choices=["check", "show"])
    p.add_argument("file", nargs="?", type=Path, help="with `check`: the policy file")
    p.set_defaults(func=cmd_policy)

    p = sub.add_parser("proto", help="regenerate proto/ from the event models (--check: fail if stale)")
    p.add_argument("--check", action="store_true")
    p.set_defaults(func=cmd_proto)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except Exception as exc:
        # A store that is down, or was never migrated, is the usual cause for the commands that read
        # it: say which store and what it said, masked, without a traceback.
        from sqlalchemy.exc import DBAPIError

        from gpumedic_store import StoreUnavailable
        from gpumedic_store.engine import unreadable
        from gpumedic_store.settings import mask_url

        if isinstance(exc, StoreUnavailable):
            print(f"gpumedic: {exc}", file=sys.stderr)
            return 2
        if isinstance(exc, DBAPIError) and getattr(args, "store", "unset") != "unset":
            print(f"gpumedic: the store at {mask_url(_store_url(args))} cannot be read: {unreadable(exc)}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
