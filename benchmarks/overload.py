"""Overload: `--overload-factor` (3) times the samples of `--overload-nodes` (10,000) nodes every
`--overload-interval` (5) s for `--overload-duration` (60) s, through the embedded stack as
`fleet_scale` runs it; then the fleet's normal rate until the stack has caught up (at most
`--overload-recover` (240) s). Each node is sampled `factor` times an interval, by as many
publisher processes (one Python publisher cannot offer that much on its own). On a small machine
the publishers cannot offer three times what the services handle when all share its cores, so
the control plane's services together get `--overload-stack-cpu` (0.5) of a core (a cgroup's CPU
quota, as a container limit would give them) and nats-server and the publishers the rest; where
no cgroup can be made, the services run on the first half of the cores instead. The printed
ratio says how far past what the slowest sample consumer handled the offer went, as a reconnect
storm or a fleet-wide fault would. From the start `--overload-zombies` (4) nodes are zombie jobs.

What a control plane that falls behind must do: say so once (one `control_plane_behind` incident
naming the services behind, resolved when every one has caught up) and never act on what it did not
see. Printed: the rate offered and the samples each consumer handled; the control-plane
incidents opened and resolved; the node incidents no fault explains and the actions asked for
on nodes that are no zombie (goal 0 each); when after the load dropped each zombie was found and
the last control-plane incident resolved; each service's CPU and memory over the overload.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import time
from collections import Counter
from pathlib import Path

from benchmarks.fleet_scale import (
    CONTROL_PLANE,
    IDLE_FOR_S_PER_INTERVAL,
    Replay,
    _cpu_s,
    _memory_mib,
    embedded_stack,
    handled_counts,
    offer_from_processes,
    pin,
    print_services,
    processes,
)
from gpumedic_bus.topology import CONTROL_PLANE_NODE, SIM_FLEET
from gpumedic_events import ActionRequested, IncidentOpened, IncidentResolved, IncidentUpdated

BEHIND = "control_plane_behind"


CGROUP_V1 = Path("/sys/fs/cgroup/cpu")
CGROUP_V2 = Path("/sys/fs/cgroup")


@contextlib.contextmanager
def _cpu_quota(pids: list[int], cores: float):
    """`pids` (each with its threads) share `cores` of CPU time in a cgroup of their own; yields
    a line saying how, or None where no cgroup could be made (not root, no CPU controller)."""
    period = 100_000
    v2 = (CGROUP_V2 / "cgroup.controllers").exists()
    group = (CGROUP_V2 if v2 else CGROUP_V1) / f"gpumedic-overload-{os.getpid()}"
    try:
        group.mkdir()
        if v2:
            (group / "cpu.max").write_text(f"{int(cores * period)} {period}")
        else:
            (group / "cpu.cfs_period_us").write_text(str(period))
            (group / "cpu.cfs_quota_us").write_text(str(int(cores * period)))
        for pid in pids:
            for task in Path(f"/proc/{pid}/task").iterdir():
                with contextlib.suppress(ProcessLookupError):
                    (group / ("cgroup.threads" if v2 else "tasks")).write_text(task.name)
    except OSError as exc:
        with contextlib.suppress(OSError):
            group.rmdir()
        print(f"(no cgroup for the services' CPU quota: {exc}; pinning them to half the cores instead)")
        yield None
        return
    try:
        yield f"the services sharing {cores:g} of a core (cgroup {group})"
    finally:
        parent = group.parent / ("cgroup.procs" if v2 else "tasks")
        for task in (group / ("cgroup.procs" if v2 else "tasks")).read_text().split():
            with contextlib.suppress(OSError):
                parent.write_text(task)
        with contextlib.suppress(OSError):
            group.rmdir()


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.overload")
    parser.add_argument("--overload-nodes", dest="nodes", type=int, default=4_000)
    parser.add_argument("--overload-interval", dest="interval", type=float, default=5.0)
    parser.add_argument("--overload-factor", dest="factor", type=int, default=4)
    parser.add_argument("--overload-duration", dest="duration", type=float, default=60.0)
    parser.add_argument("--overload-zombies", dest="zombies", type=int, default=4)
    parser.add_argument("--overload-recover", dest="recover", type=float, default=240.0)
    parser.add_argument("--overload-stack-cpu", dest="stack_cpu", type=float, default=0.5)
    args, _ = parser.parse_known_args(argv)
    nodes = [f"node-{i:05d}" for i in range(args.nodes)]
    zombies = [nodes[(i * 7919) % len(nodes)] for i in range(args.zombies)]
    idle_for_s = IDLE_FOR_S_PER_INTERVAL * args.interval

    async with embedded_stack(idle_for_s) as (stack, fleet, observer):
        found: dict[str, float] = {}
        behind: dict[str, str] = {}
        """Each control-plane incident opened: its id and latest summary."""
        resolved: dict[str, float] = {}
        unexplained: list[IncidentOpened] = []
        unseen_actions: list[ActionRequested] = []

        async def on_event(msg) -> None:
            if msg.subject.startswith(IncidentOpened.subject_prefix + "."):
                event = IncidentOpened.from_json(msg.data, subject=msg.subject)
                if event.node_id == CONTROL_PLANE_NODE:
                    behind[str(event.incident_id)] = f"{event.kind.value}: {event.summary}"
                elif event.kind == "zombie_job" and event.node_id in zombies:
                    found.setdefault(event.node_id, time.monotonic())
                else:
                    unexplained.append(event)
            elif msg.subject.startswith(IncidentUpdated.subject_prefix + "."):
                event = IncidentUpdated.from_json(msg.data, subject=msg.subject)
                if str(event.incident_id) in behind:  # another service fell behind meanwhile
                    behind[str(event.incident_id)] = f"{event.kind.value}: {event.summary}"
            elif msg.subject.startswith(IncidentResolved.subject_prefix + "."):
                event = IncidentResolved.from_json(msg.data, subject=msg.subject)
                if event.node_id == CONTROL_PLANE_NODE:
                    resolved[str(event.incident_id)] = time.monotonic()
            else:
                event = ActionRequested.from_json(msg.data, subject=msg.subject)
                if event.node_id not in zombies:
                    unseen_actions.append(event)

        for event_type in (IncidentOpened, IncidentUpdated, IncidentResolved, ActionRequested):
            await observer.subscribe(event_type.subject_filter(), cb=on_event)
        pids = processes(stack)
        before = {s: _cpu_s(p) for s, p in pids.items()}
        quota = contextlib.ExitStack()
        placed = quota.enter_context(_cpu_quota([pids[s] for s in CONTROL_PLANE], args.stack_cpu))
        publisher_cores = set(os.sched_getaffinity(0))
        if placed is None:
            cores = sorted(publisher_cores)
            stack_cores, publisher_cores = set(cores[: max(1, len(cores) // 2)]), set(cores[len(cores) // 2:])
            for service in CONTROL_PLANE:
                pin(pids[service], stack_cores)
            for server in stack.servers:
                pin(server.pid, publisher_cores)
            placed = f"the services on cores {sorted(stack_cores)}, nats-server and the publishers on {sorted(publisher_cores)}"

        started = time.monotonic()
        # each process offers the whole fleet, a fraction of an interval after the one before
        shares = [(nodes, i * args.interval / args.factor) for i in range(args.factor)]
        offered, _ = await offer_from_processes(stack.nats_settings(SIM_FLEET), shares, args.interval, args.duration,
                                                zombies_at=dict.fromkeys(zombies, 0.0), cores=publisher_cores)
        dropped_at = time.monotonic()
        elapsed = dropped_at - started
        cpu = {s: (_cpu_s(p) - before[s]) / elapsed for s, p in pids.items()}
        memory = {s: _memory_mib(p) for s, p in pids.items()}
        handled_in_load = handled_counts(stack)

        # The fleet's own rate again, until every zombie is found and every control-plane
        # incident resolved (or the time is up).
        replay = Replay(nodes, args.interval)
        for node in zombies:
            replay.make_zombie(node)
        normal = asyncio.create_task(replay.run(fleet, args.recover))
        while time.monotonic() - dropped_at < args.recover and not (len(found) == len(zombies) and set(behind) <= set(resolved)):
            await asyncio.sleep(1)
        caught_up = time.monotonic()
        normal.cancel()
        handled_after = handled_counts(stack)
        quota.close()

    slowest = min(handled_in_load.values()) / args.duration
    print(f"overload: {args.factor} x the samples of {args.nodes:,} nodes every {args.interval:g}s for {args.duration:g}s "
          f"({offered / args.duration:,.0f} samples/s offered, against {args.nodes / args.interval:,.0f} at the fleet's rate), "
          f"then the fleet's rate; {placed}")
    print(f"  offered / handled by the slowest consumer  {offered / args.duration / max(slowest, 1):>9.1f}x   "
          f"({slowest:,.0f} samples/s handled while the load ran)")
    print(f"  samples offered in the overload            {offered:>10,}")
    for service, count in handled_in_load.items():
        print(f"  {service + ' handled by its end':<42} {count:>10,}   in all by the end {handled_after[service]:,}")
    print(f"  control-plane incidents opened             {len(behind):>10}   resolved {len(set(behind) & set(resolved))}")
    for incident_id, summary in behind.items():
        at = f"resolved {resolved[incident_id] - dropped_at:.0f}s after the load dropped" if incident_id in resolved else "still open"
        print(f"    {summary} ({at})")
    kinds = Counter(e.kind.value for e in unexplained)
    print(f"  node incidents no fault explains           {len(unexplained):>10}   (goal 0)"
          + (f"   {', '.join(f'{k} {n}' for k, n in kinds.most_common())}" if kinds else ""))
    print(f"  actions asked for on nodes not at fault    {len(unseen_actions):>10}   (goal 0)")
    last = max(found.values(), default=dropped_at) - dropped_at
    print(f"  zombies found                              {len(found):>10} of {len(zombies)}"
          + (f"   the last {last:.0f}s after the load dropped" if last > 0 else "   all while the load ran" if found else ""))
    print(f"  caught up                                  {caught_up - dropped_at:>9.0f}s after the load dropped"
          + ("" if caught_up - dropped_at < args.recover else "   (not within the time: see what is still open)"))
    print_services(cpu, memory)
