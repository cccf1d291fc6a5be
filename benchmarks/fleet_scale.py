"""The sample path at fleet scale, through the whole embedded stack: `--scale-nodes` (10,000) nodes
of 8 GPUs each sample every `--scale-interval` (5) seconds for `--scale-duration` (60) s, replayed into the
samples stream as the simulated fleet's user from `--scale-publishers` processes (by default one
per 2,000 samples a second, each a share of the nodes with their bodies encoded once), while the
five control-plane services run as their own processes (nats-server with TLS, SQLite, the
remediator observing). Meanwhile `--scale-zombies` (20) nodes, one every few seconds, turn into
zombie jobs (GPU 0 held at 0 % while the node claims its jobs).

Printed: the detection latency past the threshold (from the publish of the first sample that is
`idle_for_s` past the zombie's first idle sample, to the observer's receipt of its
`IncidentOpened`), p50/p99; each service's CPU (share of one core over the replay) and resident
memory (now and peak); the samples dropped: published minus what each sample consumer handled,
once the stream is drained; the incidents no fault explains (anything but the zombies' own); and
each sample consumer's capacity: the samples it handled a second, its CPU per sample (until
drained), and from that the nodes one process of it carries and the processes 50,000 nodes need.
Goals: none dropped, p99 under 1 s, no incident unexplained, detector under 200 MB.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import math
import multiprocessing
import os
import re
import tempfile
import time
import urllib.request
import uuid
from collections import Counter
from collections.abc import Mapping
from datetime import UTC, datetime
from pathlib import Path

import asyncssh

from benchmarks import HEALTH_EVERY, node_sample, percentile
from gpumedic.stack import Stack
from gpumedic_bus import NatsSettings, connect
from gpumedic_bus.topology import OBSERVER, SIM_FLEET
from gpumedic_events import IncidentOpened, NodeSampled
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, Kinds, ZombiePolicy, dump_policy

GPUS = 8
IDLE_FOR_S_PER_INTERVAL = 2.5
"""The zombie threshold in sample intervals: not a whole number, so the sample that crosses it is
plainly one sample (the third), not whichever of two lands a millisecond either side of it."""
CONTROL_PLANE = ["zombie-detector", "leader-health", "autoscaler", "remediator", "report-builder"]
SAMPLE_CONSUMERS = ["zombie-detector", "autoscaler", "report-builder"]
_ID = "00000000-0000-4000-8000-00000000cafe"
_AT = "2000-01-01T00:00:00Z"
_TICK = os.sysconf("SC_CLK_TCK")


def _sample(node: str, *, zombie: bool = False, health: bool = False) -> NodeSampled:
    """With a placeholder id and time, which `Replay` writes fresh into every message."""
    return node_sample(
        node, gpus=GPUS, zombie=zombie, health=health, event_id=uuid.UUID(_ID), occurred_at=datetime.fromisoformat(_AT)
    )


class Replay:
    """Every node's sample once per interval, spread evenly over it, each with a fresh id and time
    (the bodies are encoded once: only those two fields are written per message). The nodes of
    `zombies_at` turn into zombie jobs that many seconds into the run."""

    def __init__(self, nodes: list[str], interval_s: float, *, zombies_at: Mapping[str, float] | None = None) -> None:
        self.interval_s = interval_s
        self.due = sorted((at, node) for node, at in (zombies_at or {}).items())
        """(seconds into the run, node) of the zombies still to turn."""
        self.bodies = {n: (s.subject, s.to_json()) for n, s in ((n, _sample(n)) for n in nodes)}
        self.health = {n: (s.subject, s.to_json()) for n, s in ((n, _sample(n, health=True)) for n in nodes)}
        """Each node's sample with its health figures: every HEALTH_EVERY-th of its samples."""
        self.order = list(nodes)
        self.published = 0
        self.zombie_publishes: dict[str, list[float]] = {}
        """For each zombie node, when each of its zombie samples was published (monotonic)."""

    def make_zombie(self, node: str) -> None:
        sample = _sample(node, zombie=True)
        self.bodies[node] = (sample.subject, sample.to_json())
        self.zombie_publishes[node] = []

    async def run(self, nc, duration_s: float) -> None:
        gap = self.interval_s / len(self.order)
        start = time.perf_counter()
        i = 0
        while time.perf_counter() - start < duration_s:
            while self.due and self.due[0][0] <= time.perf_counter() - start:
                self.make_zombie(self.due.pop(0)[1])
            node = self.order[i % len(self.order)]
            # one of each node's HEALTH_EVERY samples carries its health figures, the nodes out of step
            with_health = (i // len(self.order) + i % len(self.order)) % HEALTH_EVERY == 0 and node not in self.zombie_publishes
            subject, body = (self.health if with_health else self.bodies)[node]
            now = datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")
            await nc.publish(subject, body.replace(_ID.encode(), str(uuid.uuid4()).encode(), 1).replace(_AT.encode(), now.encode(), 1))
            if node in self.zombie_publishes:
                self.zombie_publishes[node].append(time.monotonic())
            i += 1
            self.published += 1
            if i % 200 == 0:
                await nc.flush()
            delay = start + i * gap - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await nc.flush()


def pin(pid: int, cores: set[int]) -> None:
    """Every thread of process `pid` (nats-server's too) on `cores`."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(ProcessLookupError):
            os.sched_setaffinity(int(task.name), cores)


def offer(settings: NatsSettings, nodes: list[str], interval_s: float, duration_s: float, *, zombies_at: Mapping[str, float],
          delay_s: float = 0.0, cores: set[int] | None = None) -> tuple[int, dict[str, list[float]]]:
    """One publisher process (optionally on `cores`): every node's sample once an interval, from
    `delay_s` on; what it published, and when each zombie sample went out (monotonic, which every
    process on the machine shares)."""
    if cores is not None:
        pin(os.getpid(), cores)

    async def run() -> tuple[int, dict[str, list[float]]]:
        nc = await connect(settings, "gpumedic-bench-publisher")
        try:
            replay = Replay(nodes, interval_s, zombies_at={n: max(0.0, at - delay_s) for n, at in zombies_at.items()})
            await asyncio.sleep(delay_s)
            await replay.run(nc, duration_s)
            return replay.published, replay.zombie_publishes
        finally:
            await nc.close()

    return asyncio.run(run())


async def offer_from_processes(settings: NatsSettings, shares: list[tuple[list[str], float]], interval_s: float, duration_s: float, *,
                               zombies_at: Mapping[str, float], cores: set[int] | None = None) -> tuple[int, dict[str, list[float]]]:
    """Samples from one publisher process per share (its nodes, and how late it starts): one Python
    publisher offers only a few thousand samples a second. What all published, and when each
    zombie sample went out."""
    loop = asyncio.get_running_loop()
    with multiprocessing.get_context("spawn").Pool(len(shares)) as pool:
        offers = []
        for nodes, delay_s in shares:
            mine = set(nodes)
            theirs = {n: at for n, at in zombies_at.items() if n in mine}
            offers.append(loop.run_in_executor(None, pool.apply, offer, (settings, nodes, interval_s, duration_s),
                                               {"zombies_at": theirs, "delay_s": delay_s, "cores": cores}))
        done = await asyncio.gather(*offers)
    zombie_publishes: dict[str, list[float]] = {}
    for _, times in done:
        for node, at in times.items():
            zombie_publishes.setdefault(node, []).extend(at)
    return sum(published for published, _ in done), zombie_publishes


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def _memory_mib(pid: int) -> tuple[float, float]:
    status = Path(f"/proc/{pid}/status").read_text()
    rss, peak = (int(re.search(rf"^{k}:\s+(\d+) kB", status, re.M).group(1)) / 1024 for k in ("VmRSS", "VmHWM"))
    return rss, peak


def _handled(port: int) -> int:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        text = reply.read().decode()
    return int(sum(float(m.group(1)) for m in re.finditer(r'^gpumedic_events_handled_total\{event="NodeSampled",outcome="(?:ok|invalid|failed|skipped)"\} (\S+)', text, re.M)))


@contextlib.asynccontextmanager
async def embedded_stack(idle_for_s: float, replicas: Mapping[str, int] | None = None):
    """The embedded stack with the control plane as its own processes (nats-server with TLS, SQLite,
    the remediator observing, zombies found after `idle_for_s`; `replicas`: processes per service):
    yields it, a connection as the simulated fleet's user and one as the observer."""
    with tempfile.TemporaryDirectory(prefix="gpumedic-scale-") as tmp:
        var = Path(tmp)
        stack = Stack(var, say=lambda *_: None, instances=dict(replicas or {}))
        policy_file = var / "policy.yaml"
        dump_policy(Policy(fleet=FleetPolicy(hold_s=2), kinds=Kinds(zombie_job=ZombiePolicy(idle_for_s=idle_for_s))), policy_file)
        (var / "inventory.yaml").write_text("nodes: {}\n")
        (var / "known_hosts").write_text("")
        key = asyncssh.generate_private_key("ssh-ed25519")
        (var / "client_key").write_bytes(key.export_private_key())
        (var / "client_key").chmod(0o600)
        stack.env = {
            "GPUMEDIC_POLICY_FILE": str(policy_file),
            "GPUMEDIC_REMEDIATOR_MODE": "observe",
            "GPUMEDIC_REMEDIATOR_INVENTORY": str(var / "inventory.yaml"),
            "GPUMEDIC_REMEDIATOR_KNOWN_HOSTS": str(var / "known_hosts"),
            "GPUMEDIC_REMEDIATOR_CLIENT_KEY": str(var / "client_key"),
            "GPUMEDIC_LOG_LEVEL": "WARNING",
        }
        connections = []
        try:
            stack.start_bus(sim_fleet=True)
            await stack.provision()
            stack.migrate()
            stack.start_services(CONTROL_PLANE)
            await stack.wait_ready()
            fleet, observer = await stack.connect(SIM_FLEET), await stack.connect(OBSERVER)
            connections += [fleet, observer]
            yield stack, fleet, observer
        finally:
            for nc in connections:
                with contextlib.suppress(Exception):
                    await nc.close()
            stack.stop()


def process_names(stack: Stack, services: list[str]) -> list[str]:
    """Each process of `services`: the service's name, then `<service>-2` and on for its replicas."""
    return [service if n == 1 else f"{service}-{n}" for service in services for n in range(1, stack.instances.get(service, 1) + 1)]


def handled_counts(stack: Stack) -> dict[str, int]:
    """The samples each process of a sample consumer has handled so far."""
    return {name: _handled(stack.metrics_ports[name]) for name in process_names(stack, SAMPLE_CONSUMERS)}


def processes(stack: Stack) -> dict[str, int]:
    """The pid of each control-plane process and of the nats-server."""
    return {**{name: stack.processes[name].pid for name in process_names(stack, CONTROL_PLANE)}, "nats-server": stack.servers[0].pid}


def print_services(cpu: dict[str, float], memory: dict[str, tuple[float, float]]) -> None:
    for service in cpu:
        rss, peak = memory[service]
        print(f"  {service:<24} CPU {cpu[service] * 100:5.1f}% of a core   RSS {rss:6.0f} MiB (peak {peak:.0f})"
              + ("   (goal < 200 MiB)" if service == "zombie-detector" else ""))


PUBLISHER_RATE = 2_000
"""Samples a second one publisher process is asked to offer (one Python publisher offers 2,700 to
3,900 here, and less beside the stack on a small machine)."""
TARGET_NODES = 50_000
"""The fleet the capacity line sizes for, at the same interval."""
CORE_SHARE = 0.7
"""How much of a core one consumer process may use steadily: the rest is headroom for bursts."""


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="benchmarks.fleet_scale")
    parser.add_argument("--scale-nodes", dest="nodes", type=int, default=10_000)
    parser.add_argument("--scale-interval", dest="interval", type=float, default=5.0)
    parser.add_argument("--scale-duration", dest="duration", type=float, default=60.0)
    parser.add_argument("--scale-zombies", dest="zombies", type=int, default=20)
    parser.add_argument("--scale-publishers", dest="publishers", type=int, default=0,
                        help=f"publisher processes (0: one per {PUBLISHER_RATE:,} samples/s)")
    parser.add_argument("--scale-replicas", dest="replicas", action="append", default=[], metavar="SERVICE=N",
                        help="processes of a service (zombie-detector=3: three detector cells, one of them deciding)")
    args, _ = parser.parse_known_args(argv)
    replicas = {service: int(count) for service, count in (r.split("=", 1) for r in args.replicas)}
    nodes = [f"node-{i:05d}" for i in range(args.nodes)]
    rate = args.nodes / args.interval
    publishers = args.publishers or max(1, math.ceil(rate / PUBLISHER_RATE))
    # the zombies turn one by one over the first half, so each has time to be detected while the load runs
    spacing = (args.duration / 2) / max(1, args.zombies)
    zombies_at = {nodes[(i * 7919) % len(nodes)]: (i + 1) * spacing for i in range(args.zombies)}
    idle_for_s = IDLE_FOR_S_PER_INTERVAL * args.interval

    async with embedded_stack(idle_for_s, replicas) as (stack, _fleet, observer):
        opened: dict[str, float] = {}
        unexplained: list[IncidentOpened] = []

        async def on_opened(msg) -> None:
            event = IncidentOpened.from_json(msg.data, subject=msg.subject)
            if event.kind == "zombie_job" and event.node_id in zombies_at:
                opened.setdefault(event.node_id, time.monotonic())
            else:
                unexplained.append(event)

        await observer.subscribe(IncidentOpened.subject_filter(), cb=on_opened)
        pids = processes(stack)
        before = {s: _cpu_s(p) for s, p in pids.items()}
        started = time.monotonic()
        shares = [(nodes[k::publishers], 0.0) for k in range(publishers)]
        published, zombie_publishes = await offer_from_processes(stack.nats_settings(SIM_FLEET), shares, args.interval, args.duration,
                                                                 zombies_at=zombies_at)
        elapsed = time.monotonic() - started
        cpu = {s: (_cpu_s(p) - before[s]) / elapsed for s, p in pids.items()}
        memory = {s: _memory_mib(p) for s, p in pids.items()}

        # drained: every consumer's count stops moving (or reaches what was published)
        handled: dict[str, int] = {}
        for _ in range(60):
            now = handled_counts(stack)
            if now == handled or all(v >= published * _reads(name, replicas) for name, v in now.items()):
                handled = now
                break
            handled = now
            await asyncio.sleep(1)
        drained = time.monotonic() - started
        cpu_s = {name: _cpu_s(pids[name]) - before[name] for name in handled}  # the drain's work too
        await asyncio.sleep(idle_for_s)  # the last zombies' incidents

    latencies = []
    missed = []
    for node, times in zombie_publishes.items():
        due = next((t for t in sorted(times) if t >= min(times) + idle_for_s), None)
        if due is None:
            continue  # turned too late to cross the threshold within the run
        if node not in opened:
            missed.append(node)
            continue
        latencies.append(max(0.0, opened[node] - due))
    size = len(Replay(nodes[:1], args.interval).bodies[nodes[0]][1])
    print(f"fleet scale: {args.nodes:,} nodes x {GPUS} GPUs every {args.interval:g}s ({rate:,.0f} samples/s, "
          f"{size:,} B each) for {args.duration:g}s through the embedded stack, from {publishers} publisher process(es)"
          + (f"; replicas {', '.join(f'{s} x{n}' for s, n in replicas.items())}" if replicas else ""))
    print(f"  samples published                          {published:>10,}   ({published / elapsed:,.0f}/s)")
    for service in SAMPLE_CONSUMERS:
        names = [name for name in handled if _service(name) == service]
        count = sum(handled[name] for name in names)
        dropped = published * _reads(service, replicas) - count
        print(f"  {service + ' handled':<42} {count:>10,}   dropped {dropped:,}"
              + ("   (each sample twice: by its partition's cell and by the decider)" if _reads(service, replicas) == 2 else ""))
    if latencies:
        print(f"  detection past the threshold ({len(latencies)} zombies)   p50 {percentile(latencies, 0.5) * 1000:6.0f} ms"
              f"   p99 {percentile(latencies, 0.99) * 1000:6.0f} ms   (goal p99 < 1000 ms)")
    print(f"  zombies not detected                       {len(missed):>10}")
    kinds = Counter(e.kind.value for e in unexplained)
    print(f"  incidents no fault explains                {len(unexplained):>10}   (goal 0)"
          + (f"   {', '.join(f'{k} {n}' for k, n in kinds.most_common())}" if kinds else ""))
    print_services(cpu, memory)
    print_capacity(handled, cpu_s, drained, args.interval)
    if _reads("zombie-detector", replicas) == 2:
        print_cells(handled, cpu_s, published, args.interval)


def _service(name: str) -> str:
    return next(s for s in CONTROL_PLANE if name == s or re.fullmatch(rf"{re.escape(s)}-\d+", name))


def _reads(name: str, replicas: Mapping[str, int]) -> int:
    """How many times the processes of `name`'s service handle each sample between them: the
    detector's cells and its decider each once when it has replicas."""
    return 2 if _service(name) == "zombie-detector" and replicas.get("zombie-detector", 1) > 1 else 1


def print_cells(handled: dict[str, int], cpu_s: dict[str, float], published: int, interval_s: float) -> None:
    """The detector's replicas together: CPU per sample of the fleet (each read by a cell and by
    the decider), and the replicas TARGET_NODES nodes would need at CORE_SHARE of a core each."""
    names = [name for name in handled if _service(name) == "zombie-detector"]
    per_sample = sum(cpu_s[name] for name in names) / published
    target = TARGET_NODES / interval_s
    print(f"  zombie-detector, {len(names)} replicas together: {per_sample * 1e6:.0f} us of CPU a fleet sample; "
          f"{TARGET_NODES:,} nodes need {math.ceil(target * per_sample / CORE_SHARE)} replicas' worth of cores")


def print_capacity(handled: dict[str, int], cpu_s: dict[str, float], seconds: float, interval_s: float) -> None:
    """Each sample consumer's measured rate and CPU per sample, and the processes of it that
    TARGET_NODES nodes at the same interval would need at CORE_SHARE of a core each."""
    target = TARGET_NODES / interval_s
    print(f"  {'capacity':<24} {'handled/s':>10} {'CPU/sample':>11} {'nodes/process':>14}   processes for {TARGET_NODES:,} nodes")
    for service, count in handled.items():
        if not count:
            continue
        per_sample = cpu_s[service] / count
        per_process = CORE_SHARE / per_sample  # samples a second at CORE_SHARE of a core
        print(f"  {service:<24} {count / seconds:>10,.0f} {per_sample * 1e6:>8.0f} us {per_process * interval_s:>14,.0f}"
              f"   {math.ceil(target / per_process):>3}")
