"""The simulated fleet's commands in the `gpumedic` CLI: `demo`, `sim`, `chaos`, `fleet` and
`up --demo`. The CLI finds them through this package's entry point (`gpumedic.commands`), so the
operator's CLI never imports the simulated fleet, and the fleet never goes where it is not installed.
"""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import click

from gpumedic.cli import DEFAULT_VAR, EXTENSIONS, PATH, cluster_option, command, fleet_options, replicas_option, run_until_done

THROWAWAY = ".gpumedic-throwaway"
"""Marks a directory that a demo or a simulation made for itself, and empties at its next start."""


class NotThrowaway(Exception):
    """The directory holds what no demo or simulation made: it is not emptied."""


def start_afresh(var_dir: Path, what: str) -> str | None:
    """Empty `var_dir` for a run that must tell the same story every time: what an earlier run left
    there (its incidents, the actions spent on a node, a node drained as a repeat offender) would
    change the story. Only a directory such a run made (marked) is emptied; the line that says so
    is returned, or None when there was nothing to clear."""
    said = None
    if var_dir.is_dir() and any(var_dir.iterdir()):
        if not (var_dir / THROWAWAY).exists():
            raise NotThrowaway(
                f"{var_dir}/ holds files no demo or simulation made (a stack of yours?), and a {what} empties its directory "
                f"at every start: give it a directory of its own with --var"
            )
        shutil.rmtree(var_dir)
        said = f"      a fresh start: what the last run left under {var_dir}/ is cleared, so the {what} starts the same every time"
    var_dir.mkdir(parents=True, exist_ok=True)
    (var_dir / THROWAWAY).write_text(f"made by gpumedic {what}: emptied at its next start\n")
    return said


def _afresh(var_dir: Path, what: str, command_name: str) -> bool:
    try:
        said = start_afresh(var_dir, what)
    except NotThrowaway as exc:
        print(f"gpumedic {command_name}: {exc}", file=sys.stderr)
        return False
    if said:
        print(said)
    return True


def cmd_demo(args) -> int:
    from gpumedic_sim.runs.demo import run_demo

    if not _afresh(args.var, "demo", "demo"):
        return 2
    return run_until_done(
        run_demo(
            args.var, nodes=args.nodes, gpus=args.gpus, duration_s=args.duration,
            keep_running=args.keep_running, stop_after_s=args.duration, cluster=args.cluster, replicas=args.replicas,
        )
    )


def cmd_chaos(args) -> int:
    from gpumedic_sim.runs.chaos import run_chaos

    if not _afresh(args.var, "chaos run", "chaos"):  # a cluster's old JetStream state and store would spoil the audit
        return 2

    async def run() -> int:
        result = await run_chaos(
            args.var, nodes=args.nodes, gpus=args.gpus, incidents=args.incidents, rate_per_s=args.rate,
            kill_every_s=args.kill_every, bounce_every_s=args.bounce_every, bounce_signal=args.bounce_with,
            resume_within_s=args.resume_within,
        )
        print(result.render(args.resume_within))
        ok = result.ok(args.resume_within)
        print("chaos: " + ("zero lost, zero doubled, every zombie fixed, nothing run twice, nothing missing" if ok else "FAILED (see the counts above)"))
        return 0 if ok else 1

    return run_until_done(run())


def cmd_fleet(args) -> int:
    from gpumedic_sim.runs.serve import FleetSetupError, serve_fleet
    from gpumedic_bus.service import CannotStart

    try:
        return run_until_done(
            serve_fleet(
                args.dir, nodes=args.nodes, gpus=args.gpus, listen=args.listen, host=args.host or args.listen,
                client_key_file=args.client_key, credentials=args.credentials, interval_s=args.interval,
                zombie_after_s=args.zombie_after, metrics_port=args.metrics_port,
            )
        )
    except (FleetSetupError, CannotStart) as exc:
        print(f"gpumedic fleet: {exc}", file=sys.stderr)
        return 2


def kinds_text() -> str:
    """What a scenario may script, one kind a line: its fields besides at, fault and node (with their
    defaults), what it does, and the incidents it must draw."""
    from gpumedic_sim.faults import FAULTS

    lines = []
    for kind, entry in FAULTS.items():
        fields = ", ".join([*(["gpu"] if entry.gpu else []), *(f"{name} (={value})" for name, value in entry.params.items())]) or "-"
        draws = ", ".join(sorted(entry.expect)) or "no incident"
        lines.append(f"{kind.value:<19} {fields:<26} {entry.description} [{draws}]")
    return "\n".join(lines)


def cmd_sim(args) -> int:
    import random

    if args.kinds:
        print(kinds_text())
        return 0

    from gpumedic_sim.runs.scenario import Scenario, ScenarioError, load_scenario, parse_fault_option, resolve_scenario_path
    from gpumedic_sim.runs.simulate import run_simulation
    from gpumedic_sim.machine.busy import Busy

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

    try:
        # check the scenario before anything starts: a typo should cost a second, not a stack start
        from gpumedic_sim.fleet.nodes import node_ids_for

        plan(node_ids_for(args.nodes), args.gpus)
    except ScenarioError as exc:
        print(f"gpumedic sim: {exc}", file=sys.stderr)
        return 2
    if not _afresh(args.var, "simulation", "sim"):
        return 2
    return run_until_done(
        run_simulation(
            args.var,
            nodes=args.nodes,
            gpus=args.gpus,
            scenario=plan,
            duration_s=args.duration,
            interval_s=args.interval,
            json_path=args.json,
            busy=Busy(seed=args.seed) if args.busy else None,
        )
    )


def cmd_up_demo(args) -> int:
    """`gpumedic up --demo`: the demo's story, then the stack keeps running until --duration or Ctrl-C."""
    from gpumedic_sim.runs.demo import run_demo

    story_s = 180.0 if args.duration is None else min(180.0, args.duration)
    var = args.var / "demo"
    if not _afresh(var, "demo", "up --demo"):
        return 2
    return run_until_done(
        run_demo(
            var, nodes=args.nodes, gpus=args.gpus, duration_s=story_s, keep_running=True, stop_after_s=args.duration,
            cluster=args.cluster, replicas=args.replicas,
        )
    )


def register() -> None:
    """Add the commands to `gpumedic` (called by the CLI for the `gpumedic.commands` entry point)."""
    command(
        "demo", cmd_demo, "the embedded stack on a simulated fleet, with one zombie job fixed end to end",
        *fleet_options(var=DEFAULT_VAR / "demo", throwaway=True),
        click.option("--duration", type=float, default=180.0, show_default=True, help="give up after this many seconds"),
        click.option("--keep-running", is_flag=True, help="keep the stack up after the story, until --duration or Ctrl-C"),
        cluster_option(),
        replicas_option(),
    )
    command(
        "sim", cmd_sim, "the embedded stack on a simulated fleet with scripted faults, scored against ground truth",
        *fleet_options(nodes=20, gpus=8, var=DEFAULT_VAR / "sim", throwaway=True),
        click.option("--scenario", help="a scenario file, or a built-in scenario's name (e.g. faults)"),
        click.option("--kinds", is_flag=True, help="list the faults and benign behaviours a scenario may script, and exit"),
        click.option("--fault", multiple=True, metavar="FIELDS", help="one more fault, e.g. fault=zombie_job,at=10s,node=3,gpu=2 (repeatable)"),
        click.option("--duration", type=float, help="seconds to run (default: the scenario's, else until detection had time)"),
        click.option("--interval", type=click.FloatRange(min=0, min_open=True), default=5.0, show_default=True,
                     help="seconds between samples per node"),
        click.option("--seed", type=int, default=0, show_default=True, help="seed for 'random' nodes and GPUs"),
        click.option("--json", type=PATH, help="also write the score as JSON to this file"),
        click.option("--busy", is_flag=True, help="every node busy the way a training node is: its job keeps the CPUs at 100 %, so its "
                     "sampler wakes late (ticks missed), its samples go out in bursts and its CPU pressure shows"),
        description="Start the embedded stack and a simulated fleet, inject the faults of a scenario (a YAML file, or a "
        "built-in one by name) and of --fault options on schedule, and score the incidents against each injection's answer "
        "key (precision, recall, time to incident), then show how each incident ended (fixed, cleared, escalated) and which "
        "escalations paged the simulated on-call webhook.",
    )
    command(
        "chaos", cmd_chaos, "zombie jobs fixed on a 3-server NATS cluster while services and servers are killed; audited for lost and doubled",
        click.option("--nodes", type=click.IntRange(min=2), default=60, show_default=True, help="simulated nodes"),
        click.option("--gpus", type=click.IntRange(min=1), default=2, show_default=True, help="GPUs per simulated node"),
        click.option("--incidents", type=click.IntRange(min=1), default=1000, show_default=True, help="zombie jobs to inject"),
        click.option("--rate", type=click.FloatRange(min=0.1), default=6.0, show_default=True, help="zombies injected per second"),
        click.option("--kill-every", type=click.FloatRange(min=0.5), default=4.0, show_default=True, help="SIGKILL a random service every so many seconds"),
        click.option("--bounce-every", type=click.FloatRange(min=0), default=5.0, show_default=True, help="restart one of the three nats-servers every so many seconds (0: never)"),
        click.option("--bounce-with", type=click.Choice(["term", "kill"]), default="term", show_default=True,
                     help="how a server is bounced: term (a restart: it hands its leaderships over first) or kill (a crash: they wait out an election)"),
        click.option("--resume-within", type=click.FloatRange(min=1), default=10.0, show_default=True, help="seconds a killed service may take to be ready again"),
        click.option("--var", type=PATH, default=DEFAULT_VAR / "chaos", show_default=True, help="where the run's bus, store and logs live"),
    )
    command(
        "fleet", cmd_fleet, "a simulated fleet on the network for a control plane that runs elsewhere (compose's demo)",
        click.option("--nodes", type=click.IntRange(min=1), default=4, show_default=True, help="simulated nodes"),
        click.option("--gpus", type=click.IntRange(min=1), default=2, show_default=True, help="GPUs per simulated node"),
        click.option("--dir", type=PATH, required=True, help="where inventory.yaml and known_hosts for the remediator go"),
        click.option("--listen", default="127.0.0.1", show_default=True, help="the address the nodes' SSH and status servers bind to"),
        click.option("--host", help="the name the control plane reaches the nodes by (default: --listen)"),
        click.option("--client-key", type=PATH, required=True, help="the remediator's private SSH key: the nodes accept its public half"),
        click.option("--credentials", type=PATH, required=True, help="the directory of per-node NATS logins that `gpumedic init` wrote (NODE.env)"),
        click.option("--interval", type=click.FloatRange(min=0.1), default=5.0, show_default=True, help="seconds between a node's samples"),
        click.option("--zombie-after", type=click.FloatRange(min=0), help="inject one zombie job this many seconds after sampling starts"),
        click.option("--metrics-port", type=click.IntRange(min=1, max=65535),
                     help="serve every node's GPU series on /metrics here, as node-samplers do (dcgm-exporter's names, Hostname the node id)"),
        description="Simulated nodes that run the real node-sampler code over simulated NVML and /proc, answer SSH "
        "(accepting the remediator's key) and log in to NATS each as its own user, as real nodes would.",
    )
    EXTENSIONS["up --demo"] = cmd_up_demo
