"""`gpumedic`: the front door. Start the embedded stack, run one service, read incidents."""

from __future__ import annotations

import asyncio
import contextlib
import functools
import importlib
import os
import signal
import sys
import time
from collections.abc import Callable, Coroutine
from importlib.metadata import entry_points
from pathlib import Path
from types import SimpleNamespace

import click

from gpumedic.remediator_paths import remediator_file
from gpumedic.services import SERVICES
from gpumedic_events import ACKNOWLEDGED_NOTE, IncidentKind

DEFAULT_VAR = Path("var")
EXTENSIONS: dict[str, Callable[[SimpleNamespace], int]] = {}
"""Handlers that installed packages add to the built-in commands (the simulated fleet's `up --demo`)."""
COMMANDS_GROUP = "gpumedic.commands"
"""The entry-point group through which an installed package adds commands (gpumedic-sim: demo, sim,
chaos, fleet): each entry point names a function that calls `command` for each."""

_DESCRIPTION = """\
gpumedic finds and fixes what goes wrong on rented GPU fleets: zombie jobs, GPUs held by
leftover processes, leaderless clusters, stuck workers. It samples every node, detects,
decides, acts over SSH through one safety gate, verifies, and records each incident with
its trace.

\b
Start here:
  gpumedic demo              the whole stack on one machine with a simulated fleet and
                             one injected zombie job, shown from detection to fix
  gpumedic up                the embedded stack (bus, store, six services) until Ctrl-C
  gpumedic incidents         what happened; `gpumedic incidents ID` for one incident's
                             timeline and trace
"""


def run_until_done(coro: Coroutine) -> int:
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


class NoStore(Exception):
    """A reading command found no store where it looked; the message says where and what to do."""


def _store_url(args, *, reading: bool = True) -> str:
    """Where every command finds the store: --store, else GPUMEDIC_STORE_URL, else the embedded
    stack's under --var. A command that reads never creates one: a SQLite file that is not there
    is NoStore (only `migrate` makes one)."""
    from sqlalchemy.engine import make_url
    from sqlalchemy.exc import ArgumentError

    from gpumedic_store.settings import async_url, mask_url

    var = getattr(args, "var", None) or DEFAULT_VAR
    given = getattr(args, "store", None)
    named = os.environ.get("GPUMEDIC_STORE_URL", "").strip()
    url = async_url(given or named or f"sqlite+aiosqlite:///{var / 'gpumedic.db'}")
    try:
        parsed = make_url(url)
    except ArgumentError:
        raise NoStore(f"{mask_url(url)!r} is not a store URL (sqlite:///PATH or postgresql://USER@HOST/DB)") from None
    if reading:
        if parsed.get_backend_name() == "sqlite" and parsed.database not in (None, "", ":memory:") and not Path(parsed.database).exists():
            where = ("the store --store names" if given else "the store GPUMEDIC_STORE_URL names" if named
                     else f"no stack has run under {var}/")
            raise NoStore(f"no store at {mask_url(url)} ({where}): start one with `gpumedic up --var DIR` and pass that --var, "
                          f"or name the store with --store URL or GPUMEDIC_STORE_URL")
    return url


def cmd_up(args) -> int:
    if args.listen != "127.0.0.1" and (args.demo or not args.nats_host or args.cluster > 1):
        why = ("the demo's fleet runs on this machine: it needs no --listen" if args.demo
               else "a NATS cluster listens on loopback only: for nodes elsewhere run one server, or compose" if args.cluster > 1
               else "say by which name or address the nodes reach this machine: --nats-host NAME (it goes into the server certificate)")
        print(f"gpumedic up: --listen {args.listen}: {why}", file=sys.stderr)
        return 2
    if args.demo:
        if "up --demo" not in EXTENSIONS:
            print("gpumedic up --demo: the simulated fleet is not installed (the gpumedic-sim package)", file=sys.stderr)
            return 2
        return EXTENSIONS["up --demo"](args)
    from gpumedic.stack import Stack, remediator_files

    async def _up() -> int:
        stack = Stack(args.var)
        try:
            print(f"[1/3] starting the bus and the store under {args.var}/")
            stack.env = remediator_files(args.var)
            port = args.nats_port or (4222 if args.listen != "127.0.0.1" else None)  # nodes elsewhere need a port that stays
            stack.start_bus(cluster=args.cluster, nodes=_inventory_nodes(
                {**os.environ, **stack.env}["GPUMEDIC_REMEDIATOR_INVENTORY"]), listen=args.listen, port=port, reached_as=args.nats_host)
            await stack.provision()
            stack.migrate()
            # This machine's own sampler runs even without a GPU: a node's silence is measured against
            # the freshest sample from any node, and with one enrolled node this is the other one.
            print("[2/3] starting the six services (the remediator in observe mode unless GPUMEDIC_REMEDIATOR_MODE=enforce)")
            stack.start_services()
            await stack.wait_ready()
            stack.start_supervising()  # a nats-server or service that dies is restarted, with a line saying so
            print(f"[3/3] running; logs in {stack.logs}/. Ctrl-C stops everything.")
            print(f"      console: {stack.console_url} (to act from it, log in with the token in {stack.console_token_file})")
            print(f"      bus: {stack.nats.url}   store: {stack.store_url}")
            print(f"      metrics: http://127.0.0.1:PORT/metrics, ports in {args.var}/prometheus-targets.json "
                  f"({', '.join(f'{s} {p}' for s, p in stack.metrics_ports.items())})")
            if args.duration is None:
                await asyncio.Event().wait()  # until Ctrl-C or SIGTERM
            await asyncio.sleep(args.duration)
            return 0
        finally:
            print("stopping services, then the bus")
            stack.stop()
            print("stopped; no process left behind")

    return run_until_done(_up())


def _inventory_nodes(inventory: str) -> list[str]:
    """The inventory's nodes, each given a NATS user by the embedded stack; none if it cannot be read (said once)."""
    from gpumedic_nodes.inventory import InventoryError, load_inventory

    try:
        return list(load_inventory(Path(inventory)))
    except InventoryError as exc:
        print(f"      no node credentials made: {exc}")
        return []


def cmd_run(args) -> int:
    module = importlib.import_module(f"{SERVICES[args.service]}.main")
    module.run()
    return 0


def cmd_incidents(args) -> int:
    from gpumedic import operator_bus
    from gpumedic.incidents import false_positives_text, incident_text, incidents_text, mark_text

    url = _store_url(args)
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

    url = _store_url(args)
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
    from gpumedic.report import build_report, render, sources_from

    report = asyncio.run(build_report(sources_from(_store_url(args), args.var), node=args.node, show_secrets=args.show_secrets))
    text = render(report, args.format)
    if args.output:
        args.output.write_text(text)
        print(f"report written to {args.output} ({len(report.recommendations)} recommendation(s))")
    else:
        print(text, end="" if text.endswith("\n") else "\n")
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
    report = asyncio.run(reliability.build(_store_url(args), since=since))
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

    print(asyncio.run(drained_text(_store_url(args), node_id=args.node, as_json=args.json)))
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
    print(asyncio.run(log_text(_store_url(args), cluster=args.cluster, since=since, goal=goal, rows=args.rows, as_json=args.json)))
    return 0


def cmd_cost(args) -> int:
    """The GPU time incidents cost, from the store (report-builder prices each incident)."""
    from gpumedic.cost import cost_text

    if (since := _lookback(args)) is None:
        return 2
    print(asyncio.run(cost_text(_store_url(args), since=since, by=args.by, as_json=args.json)))
    return 0


def cmd_silence(args) -> int:
    """Silences go over the bus (as the `operator` user); the list is read from the store."""
    from datetime import UTC, datetime

    from pydantic import ValidationError

    from gpumedic import operator_bus, silences
    from gpumedic.times import parse_start, parse_time

    if args.action == "list":
        print(asyncio.run(silences.silences_text(_store_url(args), include_past=args.all, as_json=args.json)))
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
                store = _store_url(args)
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
            silence_id = asyncio.run(silences.whole_id(lambda: _store_url(args), args.silence_id))
            event = asyncio.run(silences.remove(settings, silence_id=silence_id, by=args.by))
            print(f"silence {event.silence_id} lifted by {event.removed_by}")
    except (operator_bus.OperatorError, ValueError) as exc:  # pydantic's ValidationError is a ValueError
        print(f"gpumedic silence: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"gpumedic silence: cannot reach the bus: {exc}", file=sys.stderr)
        return 1
    return 0


def cmd_migrate(args) -> int:
    from gpumedic_store import StoreSettings
    from gpumedic_store.migrate import upgrade

    url = _store_url(args, reading=False)
    upgrade(url)
    print(f"migrated {StoreSettings(url=url).safe_url} to the latest revision")
    return 0


def cmd_init(args) -> int:
    """Generate the secrets of a compose deployment (see gpumedic.deployment)."""
    from gpumedic.deployment import init_deployment
    from gpumedic_nodes.inventory import InventoryError, load_inventory

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


def cmd_enroll(args, *, remove: bool = False) -> int:
    """Put node-sampler on the chosen nodes over SSH (see gpumedic.enroll), check it, or remove it."""
    from rich.progress import Progress

    from gpumedic import enroll
    from gpumedic.inventory_sync import set_node_setting
    from gpumedic.output import printable
    from gpumedic_nodes.inventory import InventoryError, load_inventory
    from gpumedic_nodes.ssh import SshExecutor

    name = "unenroll" if remove else "enroll"
    inventory = remediator_file("INVENTORY", args.var, args.inventory)
    try:
        known = load_inventory(inventory)
    except InventoryError as exc:
        looked = "" if args.inventory or inventory.exists() else (
            f" (no --inventory, no GPUMEDIC_REMEDIATOR_INVENTORY, and no inventory of an embedded stack under {args.var}/ssh or "
            f"{args.var}/demo/ssh: name it with --inventory, or --var where `gpumedic up` keeps its files)")
        print(f"gpumedic {name}: {exc}{looked}", file=sys.stderr)
        return 2
    nodes = sorted(known) if args.all else sorted(
        {*args.node, *(n for n, a in known.items() if a.group in args.group)})
    unknown = [n for n in args.node if n not in known] + [f"group {g}" for g in args.group if not any(a.group == g for a in known.values())]
    if unknown or not nodes:
        what = f"not in {inventory}: {', '.join(unknown)}" if unknown else "name the nodes: --node N, --group G or --all"
        print(f"gpumedic {name}: {what}", file=sys.stderr)
        return 2
    executor = SshExecutor(
        inventory=inventory, known_hosts=remediator_file("KNOWN_HOSTS", args.var, args.known_hosts),
        client_key=remediator_file("CLIENT_KEY", args.var, args.key), connect_timeout_s=args.timeout,
        command_timeout_s=args.timeout,
    )
    if remove:
        work = enroll.unenroll_node
    elif getattr(args, "check", False):
        work = enroll.check_node
    else:
        secrets = args.secrets or next((d for d in (Path("deploy/secrets"), args.var / "secrets") if (d / "nodes").is_dir()), Path("deploy/secrets"))
        artifacts = enroll.Artifacts(cache=args.var / "enroll", given=args.artifact)
        credentials = enroll.Credentials(secrets, nats_url=args.nats_url)

        async def work(session):
            return await enroll.enroll_node(session, artifacts, credentials, upgrade=args.upgrade)

    with Progress(transient=True, disable=not sys.stderr.isatty()) as progress:
        task = progress.add_task(f"{name} {len(nodes)} node(s)", total=len(nodes))
        outcomes = asyncio.run(enroll.for_each_node(executor, nodes, work, concurrency=args.concurrency,
                                                    advance=lambda outcome: progress.advance(task)))
    said = outcomes
    wait_s = getattr(args, "wait", 0) if not remove and not getattr(args, "check", False) else 0
    if wait_s and (placed := [o.node_id for o in outcomes if o.ok]):
        said = [o if not o.ok else enroll.seen_or_not(o, seen) for o, seen in
                zip(outcomes, _first_samples(args.var, placed, wait_s, [o.node_id for o in outcomes]), strict=True)]
    width = max(len(n) for n in nodes)
    for outcome in said:
        shown = "\n".join(printable(part) for part in outcome.line.split("\n"))  # a node's words, never its terminal codes
        print(f"{outcome.node_id:<{width}}  {'ok  ' if outcome.ok else 'FAIL'}  {shown}")
    if not getattr(args, "check", False):  # the remediator restarts a node's services through what enroll started them under
        defaults = {"service_manager": "systemd", "gpumedic_dir": None}  # what a node's entry without the key means
        for outcome in (o for o in outcomes if o.ok):
            supervised = outcome.manager == "supervisor" and not remove
            wanted = {"service_manager": "supervisor" if supervised else None, "gpumedic_dir": outcome.directory if supervised else None}
            for key, value in wanted.items():
                if getattr(known[outcome.node_id], key) == (value or defaults[key]):
                    continue
                try:
                    set_node_setting(inventory, outcome.node_id, key, value)
                    print(f"{inventory}: {outcome.node_id} {key}: {value or '(the default)'}")
                except InventoryError as exc:
                    print(f"gpumedic {name}: {exc}; set {key}: {value} for {outcome.node_id} by hand", file=sys.stderr)
    failed = sum(not o.ok for o in said)
    print(f"{len(said)} node(s): {len(said) - failed} ok, {failed} failed")
    return 1 if failed else 0


def _first_samples(var: Path, placed: list[str], wait_s: float, order: list[str]) -> list[float | str | None]:
    """For each node of `order`: seconds until its first sample reached the bus, a reason none was
    waited for, or None (none within `wait_s`). Only the nodes `placed` are waited for."""
    from gpumedic import operator_bus
    from gpumedic_bus import connect
    from gpumedic_events import NodeSampled

    try:
        settings = operator_bus.operator_settings(var)
    except operator_bus.OperatorError as exc:
        return [f"not waited for: {exc}" if n in placed else None for n in order]

    async def wait() -> dict[str, float]:
        seen: dict[str, float] = {}
        started = time.monotonic()
        everyone = asyncio.Event()
        nc = await connect(settings, "gpumedic-enroll", allow_reconnect=False, max_reconnect_attempts=0)
        try:
            async def on_sample(msg) -> None:
                node = msg.subject.rsplit(".", 1)[-1]
                seen.setdefault(node, time.monotonic() - started)
                if set(placed) <= seen.keys():
                    everyone.set()

            for node in placed:
                await nc.subscribe(NodeSampled.subject_for(node), cb=on_sample)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(everyone.wait(), wait_s)
        finally:
            await nc.close()
        return seen

    try:
        seen = asyncio.run(wait())
    except (OSError, TimeoutError, RuntimeError) as exc:  # the bus itself
        return [f"not waited for: the bus did not answer ({exc})" if n in placed else None for n in order]
    return [seen.get(n) for n in order]


def cmd_inventory(args) -> int:
    """`check`: try every inventory node read-only (a login, the catalogue's tools). `sync`: write
    the provider's pods into the inventory (see gpumedic.inventory_sync)."""
    from gpumedic_nodes.inventory import InventoryError

    inventory = remediator_file("INVENTORY", args.var, args.inventory)
    try:
        if args.action == "sync":
            return _inventory_sync(args, inventory)
        from gpumedic_nodes.check import check_inventory, check_report
        from gpumedic_nodes.ssh import SshExecutor

        executor = SshExecutor(
            inventory=inventory, known_hosts=remediator_file("KNOWN_HOSTS", args.var, args.known_hosts),
            client_key=remediator_file("CLIENT_KEY", args.var, args.key), connect_timeout_s=args.timeout, command_timeout_s=args.timeout,
        )
        checks = asyncio.run(check_inventory(executor, inventory))
    except InventoryError as exc:
        print(f"gpumedic inventory: {exc}", file=sys.stderr)
        return 2
    print(check_report(checks))
    return 0 if all(c.ok for c in checks) else 1


def _inventory_sync(args, inventory: Path) -> int:
    import json

    from pydantic import TypeAdapter, ValidationError

    from gpumedic.inventory_sync import sync
    from gpumedic_providers.base import ProviderError
    from gpumedic_providers.config import ProviderConfig, open_provider
    from gpumedic_webhook import read_token

    configured = os.environ.get("GPUMEDIC_REMEDIATOR_PROVIDER", "").strip()
    try:
        fields = json.loads(configured) if configured else {"kind": args.provider, "image": "-"}
        if args.api_key_file:
            fields["api_key_file"] = str(args.api_key_file)
        if args.base_url:
            fields["base_url"] = args.base_url
        config = TypeAdapter(ProviderConfig).validate_python(fields)
        provider = open_provider(config, read_token(config.api_key_file, "--api-key-file"))
    except (ValueError, ValidationError) as exc:  # bad JSON, a field, or the key file
        print(f"gpumedic inventory sync: the provider cannot be used: {str(exc).splitlines()[0]} "
              "(set GPUMEDIC_REMEDIATOR_PROVIDER, or give --api-key-file)", file=sys.stderr)
        return 2

    async def run():
        try:
            return await sync(inventory, provider, kind=config.kind, group=args.group or config.kind, user=args.user, dry_run=args.dry_run)
        finally:
            await provider.close()

    try:
        report = asyncio.run(run())
    except ProviderError as exc:
        print(f"gpumedic inventory sync: {exc}", file=sys.stderr)
        return 1
    for line in report.lines():
        print(line)
    if args.dry_run and report.changed:
        print(f"(dry run: {inventory} is unchanged)")
    return 0


def cmd_preflight(args) -> int:
    """Are a node's GPUs ready for the next job? Exit 0 ready, 1 not ready, 2 the check could not be made."""
    from gpumedic import operator_bus, preflight
    from gpumedic_bus.topology import LAUNCHER
    from gpumedic_events import PreflightRequest

    try:
        request = PreflightRequest(
            node_id=args.node, gpus=preflight.parse_gpus(args.gpus), clean=args.clean, deep=args.deep, requested_by=args.by
        )
        settings = operator_bus.operator_settings(args.var, LAUNCHER)
        report = asyncio.run(preflight.ask(settings, request, timeout_s=args.timeout))
        # --wait: the runbook's "wait until the GPU is free" (a job ending, a leftover reaped), asked again every --every
        deadline = time.monotonic() + args.wait
        while not report.ready and not (report.error and not report.gpus) and time.monotonic() + args.every <= deadline:
            why = "; ".join(f"GPU {g.index}: {'; '.join(g.problems)}" for g in report.gpus if not g.ready) or report.error
            print(f"not ready yet ({why}); asking again in {args.every:g}s", file=sys.stderr)
            time.sleep(args.every)
            report = asyncio.run(preflight.ask(settings, request, timeout_s=args.timeout))
    except (operator_bus.OperatorError, preflight.NoAnswer, ValueError) as exc:  # ValidationError is a ValueError
        print(f"gpumedic preflight: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as exc:
        print(f"gpumedic preflight: cannot reach the bus: {exc}", file=sys.stderr)
        return 2
    code = 2 if report.error and not report.gpus else 0 if report.ready else 1
    print(report.model_dump_json(indent=2) if args.json else report.summary(), file=sys.stderr if code == 2 and not args.json else sys.stdout)
    return code


def cmd_provision(args) -> int:
    """Provision the bus as its admin: `gpumedic-provision` under another name."""
    from gpumedic_bus.provision import main as provision_main

    provision_main()
    return 0


def cmd_breaker(args) -> int:
    """The remediator's fleet circuit breaker: it stays open until a person resets it here."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _breaker() -> str:
        async with views.store_session(_store_url(args)) as session:
            if args.action == "reset":
                trips = await breaker.reset(session=session, by=args.by, now=datetime.now(UTC))
                await session.commit()
                return f"breaker reset by {args.by}" if trips else "the breaker was closed; nothing to reset"
            trip = await breaker.open_trip(session=session)
        if args.json:
            from gpumedic.output import to_json

            return to_json({"open": trip is not None, "since": trip.tripped_at if trip else None, "reason": trip.reason if trip else ""})
        if trip is None:
            return "breaker closed: the remediator may act"
        return f"breaker OPEN since {trip.tripped_at:%Y-%m-%d %H:%M:%S}Z: {trip.reason}\nreset it with: gpumedic breaker reset --by NAME"

    print(asyncio.run(_breaker()))
    return 0


def cmd_pause(args) -> int:
    """Stop every action fleet-wide (the breaker opened by a person); detection goes on."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _pause() -> tuple[str, int]:
        async with views.store_session(_store_url(args)) as session:
            trip, new = await breaker.pause(session=session, reason=args.reason, by=args.by, now=datetime.now(UTC))
            await session.commit()
        if not new:
            return f"the breaker is already open since {trip.tripped_at:%Y-%m-%d %H:%M:%S}Z: {trip.reason}; no action runs", 1
        return (f"remediation paused by {args.by} ({args.reason}): no action runs on any node until `gpumedic resume --by NAME`; "
                "incidents are still opened and escalated"), 0

    said, code = asyncio.run(_pause())
    print(said)
    return code


def cmd_resume(args) -> int:
    """End a pause (or any open breaker): the remediator may act again."""
    from datetime import UTC, datetime

    from gpumedic_store import breaker, views

    async def _resume() -> str:
        async with views.store_session(_store_url(args)) as session:
            trips = await breaker.reset(session=session, by=args.by, now=datetime.now(UTC))
            await session.commit()
        if not trips:
            return "nothing was paused; the remediator may act"
        return f"resumed by {args.by}: the remediator may act again (it was: {'; '.join(t.reason for t in trips)})"

    print(asyncio.run(_resume()))
    return 0


def cmd_dead_letters(args) -> int:
    """What the services refused, from the dead-letter stream (as the NATS admin); replay chosen ones."""
    from gpumedic import deadletters, operator_bus
    from gpumedic_bus.topology import ADMIN

    try:
        settings = operator_bus.operator_settings(args.var, ADMIN)
        if args.action == "list":
            print(asyncio.run(deadletters.dead_letters_text(settings, service=args.service, limit=args.limit, as_json=args.json)))
            return 0
        if not args.seq:
            print("gpumedic dead-letters: name the dead letters to replay by their SEQ (see `gpumedic dead-letters list`)", file=sys.stderr)
            return 2
        ok, lines = asyncio.run(deadletters.replay(settings, list(args.seq), store_url=_store_url(args), by=args.by))
    except (operator_bus.OperatorError, NoStore) as exc:
        print(f"gpumedic dead-letters: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError, RuntimeError) as exc:
        print(f"gpumedic dead-letters: cannot reach the bus: {exc}", file=sys.stderr)
        return 2
    print("\n".join(lines))
    return 0 if ok else 1


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

    return proto.main(out=args.out, check=args.check, accept_breaking=args.accept_breaking)


# --- the commands' arguments (click) ------------------------------------------------------------

STORE_HELP = "store URL (default: GPUMEDIC_STORE_URL, else the embedded stack's under --var)"
VAR_HELP = "the embedded stack's directory (default ./var)"
PATH = click.Path(path_type=Path)


@click.group(help=_DESCRIPTION, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 110})
def cli() -> None:
    """The front door: one sub-command per job."""


def command(name: str, handler: Callable[[SimpleNamespace], int], help: str, *options, description: str | None = None):
    """Register `handler(args)` as `gpumedic NAME` with `options` (click decorators, top first);
    its return value is the exit status."""

    def callback(**values) -> int:
        args = SimpleNamespace(**values)
        try:
            return handler(args)
        except Exception as exc:
            code = _store_failure(exc, args)
            if code is None:
                raise
            return code

    for option in reversed(options):
        callback = option(callback)
    cli.command(name, help=description or help, short_help=help)(callback)


def _json():
    return click.option("--json", is_flag=True, help="print JSON instead of a table (for scripts and jq)")


def _store():
    return click.option("--store", help=STORE_HELP)


def _var():
    return click.option("--var", type=PATH, default=DEFAULT_VAR, show_default=True, help=VAR_HELP)


def fleet_options(nodes: int = 4, gpus: int = 2, var: Path = DEFAULT_VAR, throwaway: bool = False):
    where = "where the bus, store, logs and fleet files live"
    return (
        click.option("--nodes", type=click.IntRange(min=1), default=nodes, show_default=True, help="simulated nodes"),
        click.option("--gpus", type=click.IntRange(min=1), default=gpus, show_default=True, help="GPUs per simulated node"),
        click.option("--var", type=PATH, default=var, show_default=True,
                     help=where + (": emptied at each start, so each run tells the same story" if throwaway else
                                   " (with --demo, the demo's story runs in VAR/demo, emptied at each start)")),
    )


def cluster_option():
    return click.option("--cluster", type=click.IntRange(1, 5), default=1, show_default=True,
                        help="nats-servers in one JetStream cluster on loopback, streams replicated on up to 3 (3 survives one loss)")


def _by(default: str = "operator", what: str = "who (kept in the audit)"):
    return click.option("--by", default=os.environ.get("USER", default), show_default="$USER", help=what)


command(
    "up", cmd_up, "start the embedded stack: nats-server, SQLite store, the six services, the console",
    *fleet_options(),
    click.option("--demo", is_flag=True, help="also start a simulated fleet and inject a zombie job"),
    click.option("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)"),
    cluster_option(),
    click.option("--listen", default="127.0.0.1", show_default=True, metavar="ADDR",
                 help="where nats-server listens: 0.0.0.0 or an address of this machine lets rented nodes elsewhere reach it"),
    click.option("--nats-port", type=click.IntRange(min=1, max=65535), metavar="PORT",
                 help="nats-server's port (default: 4222 with --listen, else a free one)"),
    click.option("--nats-host", multiple=True, metavar="NAME",
                 help="with --listen: a name or address the nodes reach this machine by; goes into the server certificate "
                 "(repeatable; the first goes into the nodes' credentials)"),
)
command(
    "run", cmd_run, "run one service in the foreground (settings from GPUMEDIC_* variables)",
    click.argument("service", type=click.Choice(sorted(SERVICES))),
)
command(
    "incidents", cmd_incidents, "list incidents, show one's timeline and trace, acknowledge one or mark it a false positive",
    click.argument("words", nargs=-1, metavar="[ID | ack ID | mark ID]"),
    click.option("--status", type=click.Choice(["open", "resolved", "escalated"]), help="only incidents in this state"),
    click.option("--limit", type=click.IntRange(min=1), default=50, show_default=True),
    click.option("--false-positive", is_flag=True, help="with `mark`: the verdict"),
    click.option("--reason", help="with `mark`: why it was wrong; with `ack`: a note (default: looking into it)"),
    _by(what="with `mark` and `ack`: who"),
    click.option("--false-positives", is_flag=True, help="the false-positive ledger per detector and kind"),
    _var(), _store(), _json(),
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
    _var(), _store(), _json(),
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
    _var(), _store(), _json(),
    description="leader-health's checks as kept in the store, with what the runbook computed by hand: peak and current "
    "peers, time with a leader, leader changes per hour, the longest stretch without a leader, the quorum margin, and "
    "whether a goal of N peers for H hours holds.",
)
command(
    "cost", cmd_cost, "what incidents cost: the GPU-hours they kept from work and their price, by kind, node, provider or day",
    click.option("--since", default="7d", show_default=True, help="how far back, e.g. 12h, 7d, 30d"),
    click.option("--by", type=click.Choice(["kind", "node", "provider", "day"]), default="kind", show_default=True, help="what to sum by"),
    _var(), _store(), _json(),
    description="An incident costs the GPU time it kept from work: a GPU idle under a zombie job or a leftover process "
    "(from before it was detected), a lost GPU, a drained node's GPUs, a rented worker billed for nothing. Its price is the "
    "provider's for a rented worker, else the inventory's price_per_gpu_hour; report-builder works it out on every event "
    "of the incident. Open incidents count up to now.",
)
command(
    "drained", cmd_drained, "the nodes gpumedic drained, which incident holds each, and since when",
    click.option("--node", help="only this node"), _var(), _store(), _json(),
    description="A node is drained (takes no new jobs) while an incident holds it: it comes back once every incident "
    "holding it is fixed and its GPUs were validated on the next samples.",
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
    _var(), _store(),
    description="Checks the remediator's SSH key and known_hosts against the inventory, the bus and the store, then lists "
    "every open or escalated incident by node and what to do, most urgent first (P1 now .. P4 note). Secrets are masked "
    "unless --show-secrets. `gpumedic report reliability --since 30d`: per host and provider, incidents per 100 GPU-days by "
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
    _by(what="who"),
    click.option("--all", is_flag=True, help="with `list`: also silences that ended or were lifted"),
    click.option("--unseen", is_flag=True, help="with `add`: nodes the store has not heard of yet (else refused)"),
    _var(), _store(), _json(),
    description="A silenced incident is still recorded, with its silence, but no action is requested for it. A silence "
    "matches every incident on its node (any node if none is given), of its kind and on its GPU, for which every --match "
    "holds (`=` and `!=` compare, `=~` and `!~` match a regular expression against the whole label). One that names nodes "
    "the store does not know is refused, with the nodes it knows.",
)
command("migrate", cmd_migrate, "create or upgrade the store's tables (SQLite or PostgreSQL)", _var(), _store())
command(
    "init", cmd_init, "generate a compose deployment's secrets: .env, NATS users, TLS, per-node credentials, the console's token",
    click.option("--dir", type=PATH, default=Path("."), show_default=True, help="the directory with compose.yaml"),
    click.option("--node", multiple=True, metavar="ID", help="a GPU node that runs a node-sampler (repeatable)"),
    click.option("--inventory", type=PATH, help="take the nodes from a remediator inventory file"),
    click.option("--nats-host", multiple=True, metavar="NAME",
                 help="a name or address GPU nodes reach NATS by; goes into the server certificate (repeatable)"),
    description="Generate what compose needs instead of placeholders: real passwords in .env, a CA and the NATS server's "
    "certificate, the NATS users with their permissions, one credentials file per GPU node, and the web console's token. "
    "Existing secrets are kept; run it again to add nodes.",
)
command(
    "inventory", cmd_inventory, "check the remediator's inventory read-only, or sync the provider's pods into it",
    click.argument("action", type=click.Choice(["check", "sync"])),
    click.option("--inventory", type=PATH, help="default: GPUMEDIC_REMEDIATOR_INVENTORY, else the embedded stack's, else /etc/gpumedic/inventory.yaml"),
    click.option("--known-hosts", type=PATH, help="default: GPUMEDIC_REMEDIATOR_KNOWN_HOSTS, else as --inventory"),
    click.option("--key", type=PATH, help="the client key; default: GPUMEDIC_REMEDIATOR_CLIENT_KEY, else as --inventory"),
    click.option("--timeout", type=float, default=10.0, show_default=True, help="check: seconds for each login and command"),
    click.option("--provider", type=click.Choice(["runpod"]), default="runpod", show_default=True,
                 help="sync: the provider, when GPUMEDIC_REMEDIATOR_PROVIDER does not name one"),
    click.option("--api-key-file", type=PATH, help="sync: a file holding the provider's API key (default: the remediator's)"),
    click.option("--base-url", help="sync: the provider API's URL (default: the provider's own)"),
    click.option("--group", help="sync: the inventory group of the pods (default: the provider's name)"),
    click.option("--user", default="root", show_default=True, help="sync: the SSH user of a new group (RunPod pods: root)"),
    click.option("--dry-run", is_flag=True, help="sync: say what would change, write nothing"),
    _var(),
    description="\b\n"
    "gpumedic inventory check   for every node, an SSH login as the remediator makes it (user, port, key, jump host,\n"
    "                           host keys checked) and which catalogue tools it has; nothing else runs. Exits 1 if a\n"
    "                           node fails, 2 if the inventory itself is wrong.\n"
    "gpumedic inventory sync    write the provider's running pods into the inventory (host, SSH port, group; labels\n"
    "                           pod and synced). Entries it did not write are never touched; a pod that is gone is\n"
    "                           marked gone, not dropped. Comments stay.",
)
_ENROLL_TARGETS = (
    click.option("--node", multiple=True, metavar="ID", help="a node of the inventory (repeatable)"),
    click.option("--group", multiple=True, metavar="G", help="every node of an inventory group (repeatable)"),
    click.option("--all", is_flag=True, help="every node of the inventory"),
    click.option("--inventory", type=PATH, help="default: GPUMEDIC_REMEDIATOR_INVENTORY, else the embedded stack's, else /etc/gpumedic/inventory.yaml"),
    click.option("--known-hosts", type=PATH, help="default: GPUMEDIC_REMEDIATOR_KNOWN_HOSTS, else as --inventory"),
    click.option("--key", type=PATH, help="the client key; default: GPUMEDIC_REMEDIATOR_CLIENT_KEY, else as --inventory"),
    click.option("--timeout", type=float, default=30.0, show_default=True, help="seconds for each login and command"),
    click.option("--concurrency", type=click.IntRange(1, 256), default=16, show_default=True, help="nodes at once"),
    _var(),
)
command(
    "enroll", cmd_enroll, "put node-sampler on nodes over SSH, under systemd or (pods) a supervisor it carries; --check, --upgrade",
    *_ENROLL_TARGETS,
    click.option("--check", is_flag=True, help="only say per node what runs, which version, under what, since when, what it cannot see"),
    click.option("--upgrade", is_flag=True, help="replace an older version (one restart of the sampler)"),
    click.option("--secrets", type=PATH, help="nodes/NODE.env and tls/ca.pem: default deploy/secrets (gpumedic init), else VAR/secrets"),
    click.option("--nats-url", help="the NATS address the nodes reach, when not the one in their env file (tls://HOST:4222)"),
    click.option("--artifact", type=PATH, help="a node artifact built before (default: built here for each node's platform, kept in VAR/enroll)"),
    click.option("--wait", type=click.FloatRange(min=0), default=60.0, show_default=True,
                 help="seconds to wait for each node's first sample on the bus (0: do not wait); none in time is a failure"),
    description="Over the remediator's SSH (the inventory's user, port, key and jump host; host keys checked), puts one artifact "
    "on each node, built here from uv.lock for the node's CPU, python3 (3.11+) and glibc: node-sampler, what it imports and a "
    "supervisor, under /workspace/.gpumedic (a pod's volume, kept across its restarts) or ~/.gpumedic of the login user, with "
    "the node's own NATS credentials and the CA (mode 0600). Root on a "
    "systemd host: a systemd unit; otherwise (rented pods) the carried supervisord, and the inventory records "
    "service_manager: supervisor so the remediator restarts it through that. Idempotent. Exit 1 if a node failed.",
)
command(
    "unenroll", lambda args: cmd_enroll(args, remove=True), "stop node-sampler on nodes and remove everything enroll put there",
    *_ENROLL_TARGETS,
)
command(
    "preflight", cmd_preflight, "before a job starts: are the node's GPUs free and healthy? (--clean removes leftovers through the gate)",
    click.option("--node", required=True, help="the node, as the inventory names it"),
    click.option("--gpus", help="GPU indexes, e.g. 0,1 (default: every GPU)"),
    click.option("--clean", is_flag=True, help="kill leftovers on idle GPUs, through the gate, then check again"),
    click.option("--deep", is_flag=True, help="then DCGM's diagnostics (dcgmi diag -r 1) where the node has DCGM; give --timeout room"),
    _by(default="launcher", what="who asks (kept with a clean in the audit log)"),
    click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds to wait for the answer (--deep: a few minutes)"),
    click.option("--json", is_flag=True, help="print the report as JSON"),
    click.option("--wait", type=click.FloatRange(min=0), default=0.0, show_default=True,
                 help="seconds to keep asking until the GPUs are ready (a job ending, a leftover reaped); 0: ask once"),
    click.option("--every", type=click.FloatRange(min=1), default=5.0, show_default=True, help="with --wait: seconds between checks"),
    _var(),
    description="Checks, read-only over the remediator's SSH, that each GPU answers, admits jobs, runs no compute process, "
    "is held open by no leftover and has little memory in use. With --clean, leftovers on an idle GPU are killed through "
    "the remediator's gate (breaker, protected nodes, caps, observe mode) and the GPUs are checked again. With --deep, "
    "DCGM's diagnostics run once every GPU checked is free (a node without DCGM says so; a failed test is not ready). With "
    "--wait, it asks again every --every seconds until ready or the wait is over. Exit 0: ready; "
    "1: not ready (the reasons are printed); 2: the check could not be made.",
)
command("provision", cmd_provision, "create the bus's streams, buckets and consumers (as the NATS admin, GPUMEDIC_NATS_*)")
command(
    "breaker", cmd_breaker, "show or reset the remediator's fleet circuit breaker",
    click.argument("action", type=click.Choice(["status", "reset"]), default="status", required=False),
    _by(what="who resets it (kept in the audit log)"), _var(), _store(), _json(),
)
command(
    "pause", cmd_pause, "stop every action fleet-wide, with a reason (a driver upgrade); detection goes on",
    click.option("--reason", required=True, help="why, shown on every console page, in `gpumedic report` and with every refusal"),
    _by(what="who pauses (kept in the audit log)"), _var(), _store(),
    description="Opens the remediator's fleet circuit breaker on purpose: every action request is refused (recorded as blocked, "
    "its incident goes to a person) until `gpumedic resume`. The console shows it on every page, `gpumedic report` as a P1, "
    "and the remediator's gpumedic_breaker_open metric is 1. Exit 1 when the breaker was already open (kept as it was).",
)
command(
    "resume", cmd_resume, "end a pause: the remediator may act again (as `breaker reset`)",
    _by(what="who resumes (kept in the audit log)"), _var(), _store(),
)
command(
    "dead-letters", cmd_dead_letters, "list what the services refused, and why; replay chosen ones once the cause is fixed",
    click.argument("action", type=click.Choice(["list", "replay"]), default="list", required=False),
    click.argument("seq", type=click.IntRange(min=1), nargs=-1),
    click.option("--service", type=click.Choice(list(SERVICES)), help="only what this service refused"),
    click.option("--limit", type=click.IntRange(1, 1000), default=50, show_default=True, help="newest first, at most this many"),
    _by(what="who replays (kept in the store with each replay)"), _var(), _store(), _json(),
    description="Every message a service could not process (it did not decode, or its handler kept failing) is kept in "
    "the dead-letter stream with the reason and its payload. `replay SEQ...` delivers the original of chosen ones again, "
    "once the cause is fixed: only to a subject the refusing service's own consumer reads, only into that consumer's "
    "stream, only when the stream still holds the original the record describes (it is what is published), and each at "
    "most once (recorded in the store: who, when, what it became). Every consumer of that subject takes it as a "
    "redelivery. Reads and publishes as the NATS admin. Exit 0: done; 1: some not replayed; 2: the bus or the store "
    "could not be reached.",
)
command(
    "policy", cmd_policy, "check a policy file, or show the policy in force (GPUMEDIC_POLICY_FILE, else the shipped one)",
    click.argument("action", type=click.Choice(["check", "show"])),
    click.argument("file", type=PATH, required=False),
    description="The policy says how each incident kind is detected, what is done about it and when a person takes over; "
    "every service that decides reads the same file.",
)
command(
    "proto", cmd_proto, "regenerate proto/ from the event models (--check: fail if stale)",
    click.option("--check", is_flag=True, help="write nothing; exit 1 if proto/ is stale or a change breaks v1 compatibility"),
    click.option("--accept-breaking", is_flag=True, help="also overwrite the v1 compatibility baseline (in practice: cut a v2)"),
    click.option("--out", type=PATH, help="the proto/ folder (default: the repository root's)"),
)


def _store_failure(exc: Exception, args) -> int | None:
    """A store that is down, or was never migrated, is the usual cause of a read command's failure:
    say which store (masked) and what it said, in one line, without a traceback. None: another failure."""
    from sqlalchemy.exc import DBAPIError

    from gpumedic_store import StoreUnavailable
    from gpumedic_store.engine import unreadable
    from gpumedic_store.settings import mask_url

    if isinstance(exc, StoreUnavailable | NoStore):
        print(f"gpumedic: {exc}", file=sys.stderr)
        return 2
    if isinstance(exc, DBAPIError) and hasattr(args, "store"):
        print(f"gpumedic: the store at {mask_url(_store_url(args))} cannot be read: {unreadable(exc)}", file=sys.stderr)
        return 2
    return None


@functools.cache
def _load_extensions() -> None:
    """Let installed packages add their commands, once."""
    for entry in entry_points(group=COMMANDS_GROUP):
        entry.load()()


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit status. Bad arguments exit 2 with one line that says what was wrong."""
    _load_extensions()
    try:
        return cli.main(args=argv, prog_name="gpumedic", standalone_mode=False) or 0
    except click.exceptions.Exit as exc:  # --help
        return exc.exit_code
    except click.UsageError as exc:
        command = exc.ctx.command_path if exc.ctx else "gpumedic"
        print(f"{command}: {exc.format_message()} (see {command} --help)", file=sys.stderr)
        return exc.exit_code
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Abort:
        return 130


if __name__ == "__main__":
    sys.exit(main())
