"""The fleet's nodes: the inventory, enrolling node-sampler, pre-flight checks and provisioning the bus's users."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from gpumedic.cli.core import PATH, by_option, command, var_option
from gpumedic.remediator_paths import remediator_file


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
            node_id=args.node, gpus=preflight.parse_gpus(args.gpus), clean=args.clean, reset=args.reset, deep=args.deep,
            requested_by=args.by,
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
    except (operator_bus.OperatorError, ValueError) as exc:  # NoAnswer is an OperatorError, ValidationError a ValueError
        print(f"gpumedic preflight: {exc}", file=sys.stderr)
        return 2
    except (OSError, TimeoutError) as exc:
        print(f"gpumedic preflight: cannot reach the bus: {exc}", file=sys.stderr)
        return 2
    code = 2 if report.error and not report.gpus else 0 if report.ready else 1
    print(report.model_dump_json(indent=2) if args.json else report.summary(), file=sys.stderr if code == 2 and not args.json else sys.stdout)
    return code


def _ask_remediator(command: str, build: Callable[[], Any], report_type: type, args) -> Any:
    """The remediator's report on the request `build` makes, asked over the bus as the operator;
    None once it said why there is none (a bad request, no bus, no answer)."""
    from gpumedic import operator_bus

    try:
        request = build()
        reply = asyncio.run(operator_bus.ask(operator_bus.operator_settings(args.var), request.SUBJECT, request.to_json(),
                                             timeout_s=args.timeout))
        return report_type.from_json(reply)
    except (operator_bus.OperatorError, ValueError) as exc:  # NoAnswer is an OperatorError, ValidationError a ValueError
        print(f"gpumedic {command}: {exc}", file=sys.stderr)
    except (OSError, TimeoutError) as exc:
        print(f"gpumedic {command}: cannot reach the bus: {exc}", file=sys.stderr)
    return None


def cmd_rollout(args) -> int:
    """One operation on many nodes through the gate, batch by batch. Exit 0 done, 1 stopped or a node failed, 2 nothing ran."""
    from gpumedic_events import RolloutReport, RolloutRequest

    report = _ask_remediator("rollout", lambda: RolloutRequest(
        operation=args.operation.replace("-", "_"), unit=args.unit, nodes=tuple(args.nodes), workers=tuple(args.workers),
        batch=args.batch, dry_run=args.dry_run, requested_by=args.by,
    ), RolloutReport, args)
    if report is None:
        return 2
    code = 2 if report.error else 0 if report.ok else 1
    print(report.model_dump_json(indent=2) if args.json else report.summary(), file=sys.stderr if code == 2 and not args.json else sys.stdout)
    return code


def cmd_logs(args) -> int:
    """A node's log the policy names, read by the remediator. Exit 0 read, 2 not."""
    from gpumedic_events import LogReport, LogRequest

    report = _ask_remediator("logs", lambda: LogRequest(node_id=args.node, log=args.log, lines=args.lines, requested_by=args.by),
                             LogReport, args)
    if report is None:
        return 2
    if report.error:
        print(f"gpumedic logs: {report.error}", file=sys.stderr)
        return 2
    if args.json:
        print(report.model_dump_json(indent=2))
    else:
        print(f"{report.node_id}:{report.path}, its last {len(report.lines)} line(s)", file=sys.stderr)
        if report.left_out:
            print(f"({report.left_out} earlier line(s) left out to fit one message: ask for fewer with --lines)", file=sys.stderr)
        print("\n".join(report.lines))
    return 0


def cmd_provision(args) -> int:
    """Provision the bus as its admin: `gpumedic-provision` under another name."""
    from gpumedic_bus.provision import main as provision_main

    provision_main()
    return 0


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
    var_option(),
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
    var_option(),
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
    click.option("--reset", is_flag=True, help="reset a GPU nothing uses or holds that still has memory in use, through the gate"),
    click.option("--deep", is_flag=True, help="then DCGM's diagnostics (dcgmi diag -r 1) where the node has DCGM; give --timeout room"),
    by_option(default="launcher", what="who asks (kept with a clean in the audit log)"),
    click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds to wait for the answer (--deep: a few minutes)"),
    click.option("--json", is_flag=True, help="print the report as JSON"),
    click.option("--wait", type=click.FloatRange(min=0), default=0.0, show_default=True,
                 help="seconds to keep asking until the GPUs are ready (a job ending, a leftover reaped); 0: ask once"),
    click.option("--every", type=click.FloatRange(min=1), default=5.0, show_default=True, help="with --wait: seconds between checks"),
    var_option(),
    description="Checks, read-only over the remediator's SSH, that each GPU answers, admits jobs, runs no compute process, "
    "is held open by no leftover and has little memory in use. With --clean, leftovers on an idle GPU are killed through "
    "the remediator's gate (breaker, protected nodes, caps, observe mode) and the GPUs are checked again. With --reset, a GPU "
    "that nothing uses or holds but that keeps memory in use (a container restart's leftover driver state) is reset through the "
    "same gate, its node checked again first; without it, such a GPU is offered the reset. With --deep, "
    "DCGM's diagnostics run once every GPU checked is free (a node without DCGM says so; a failed test is not ready). With "
    "--wait, it asks again every --every seconds until ready or the wait is over. Exit 0: ready; "
    "1: not ready (the reasons are printed); 2: the check could not be made.",
)


command(
    "logs", cmd_logs, "a node's log the policy names, read over the remediator's SSH (runbook 001's fetch_worker_logs)",
    click.argument("node"),
    click.argument("log"),
    click.option("--lines", type=click.IntRange(1, 1000), default=200, show_default=True, help="the last this many lines"),
    by_option(what="who asks (in the remediator's log)"),
    click.option("--timeout", type=float, default=60.0, show_default=True, help="seconds to wait for the answer"),
    click.option("--json", is_flag=True, help="print the report as JSON"),
    var_option(),
    description="LOG is a name in the policy's logs.files (e.g. worker: {path: /workspace/logs/worker.log}): a person names "
    "a log, never a path, and needs no SSH key of their own. Read-only: the last MiB of the file, of which the last --lines "
    "lines are printed, control characters out and what looks like a secret masked. Exit 0: read; 2: not (why is printed).",
)


command(
    "rollout", cmd_rollout, "one operation on many nodes, batch by batch, through the gate (a rolling restart, a drain before maintenance)",
    click.argument("operation", type=click.Choice(["restart-unit", "drain-node", "undrain-node", "terminate-worker"])),
    click.option("--unit", help="restart-unit: the unit, on the policy's actions.restart_unit.units (e.g. the peer daemon's)"),
    click.option("--nodes", multiple=True, help="which nodes: NODE, group:NAME or label:KEY=VALUE (repeat for more)"),
    click.option("--workers", multiple=True, help="terminate-worker: the provider's worker ids, or all (runbook 001's emergency stop)"),
    click.option("--batch", type=click.IntRange(1, 1000), default=1, show_default=True, help="nodes acted on at once"),
    click.option("--dry-run", is_flag=True, help="list the batches, the commands and where the gate would refuse; run nothing"),
    by_option(what="who asks (kept with each action in the audit log)"),
    click.option("--timeout", type=float, default=1800.0, show_default=True, help="seconds to wait for the whole rollout"),
    click.option("--json", is_flag=True, help="print the report as JSON"),
    var_option(),
    description="The remediator takes the inventory's nodes the selectors name, in node-id order (terminate-worker: the provider's "
    "live workers --workers names, all of them for runbook 001's emergency stop; what they ran is requeued where the policy "
    "has requeue_tasks), BATCH at a time. Each node's "
    "action goes through its gate (protected nodes, the unit's allow-list, one action per node, the per-node cap, observe mode, "
    "the breaker) and into the audit log under the rollout's id (gpumedic actions); each is verified as the catalogue verifies "
    "it (a restarted unit active, and healthy where its entry has a health_url). The next batch starts only once every node of "
    "this one succeeded: after a batch with a failure it stops and says which nodes were not reached. It also stops before a "
    "batch that would take the breaker past its limit, rather than trip it. --dry-run runs nothing. Exit 0: every batch "
    "succeeded; 1: it stopped, or a node's action did not succeed; 2: nothing ran (the reason is printed).",
)


command("provision", cmd_provision, "create the bus's streams, buckets and consumers (as the NATS admin, GPUMEDIC_NATS_*)")
