"""The embedded stack and the service it runs, the store's schema, the node's first files, the policy and proto/."""

from __future__ import annotations

import asyncio
import importlib
import os
import sys
from pathlib import Path

import click

from gpumedic.cli.core import EXTENSIONS, PATH, cluster_option, command, fleet_options, replicas_option, run_until_done, store_option, store_url, var_option
from gpumedic.services import SERVICES


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
        stack = Stack(args.var, instances=args.replicas)
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


def cmd_migrate(args) -> int:
    from gpumedic_store import StoreSettings
    from gpumedic_store.migrate import upgrade

    url = store_url(args, reading=False)
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


command(
    "up", cmd_up, "start the embedded stack: nats-server, SQLite store, the six services, the console",
    *fleet_options(),
    click.option("--demo", is_flag=True, help="also start a simulated fleet and inject a zombie job"),
    click.option("--duration", type=float, help="stop after this many seconds (default: until Ctrl-C)"),
    cluster_option(),
    replicas_option(),
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


command("migrate", cmd_migrate, "create or upgrade the store's tables (SQLite or PostgreSQL)", var_option(), store_option())


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
