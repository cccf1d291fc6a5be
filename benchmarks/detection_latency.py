"""Detection latency at fleet scale: from a fault event on the bus to its incident.

A fleet of `--nodes` (1,000) nodes with 8 GPUs each samples every `--interval` seconds into the
samples stream (the load a real fleet puts on zombie-detector). Meanwhile, one at a time, a
hardware XID (48, a double-bit ECC error) is published for a GPU that has none yet, and two
things are timed from the publish: when a plain nats-py subscriber on the XID's subject receives
it (the bus's own hop, the floor), and when zombie-detector's `IncidentOpened` for that GPU
arrives (validate, the XID rule, the incident book, the KV write the remediator's gate reads,
publish). Both are measured on the same events in the same run; the figure is their ratio.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import statistics
import tempfile
import time
from pathlib import Path

import nats

from benchmarks import node_sample, percentile
from gpumedic.natsd import NatsServer
from gpumedic_bus import NatsSettings, provision
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import GpuXidReported, IncidentOpened
from zombie_detector.main import create_app
from zombie_detector.settings import Settings

GPUS = 8


async def _fleet_load(js, nodes: list[str], interval_s: float) -> None:
    """Every node's sample once per interval, spread evenly over it, until stopped."""
    bodies = [(s.subject, s.to_json()) for s in map(node_sample, nodes)]
    gap = interval_s / len(bodies)
    start = time.perf_counter()
    i = 0
    while True:
        subject, body = bodies[i % len(bodies)]
        await js.publish(subject, body)
        i += 1
        delay = start + i * gap - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--faults", type=int, default=200)
    parser.add_argument("--interval", type=float, default=5.0)
    args, _ = parser.parse_known_args(argv)
    logging.basicConfig(level=logging.WARNING)
    for noisy in ("faststream", "zombie-detector", "zombie_detector"):
        logging.getLogger(noisy).setLevel(logging.ERROR)  # one line per incident would bury the figures

    nodes = [f"node-{n:04d}" for n in range(args.nodes)]
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp)) as server:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await provision(js, NatsSettings(url=server.url))
        app = create_app(Settings(nats=NatsSettings(url=server.url)))
        runner = asyncio.create_task(app.run())
        load = asyncio.create_task(_fleet_load(js, nodes, args.interval))
        sent: dict[tuple[str, int], float] = {}
        hop: dict[tuple[str, int], float] = {}
        opened: dict[tuple[str, int], float] = {}
        arrived = asyncio.Event()

        async def on_xid(msg) -> None:
            event = GpuXidReported.from_json(msg.data, subject=msg.subject)
            hop.setdefault((event.node_id, event.gpu_index), time.perf_counter())

        async def on_opened(msg) -> None:
            event = IncidentOpened.from_json(msg.data, subject=msg.subject)
            opened.setdefault((event.node_id, event.gpu_index), time.perf_counter())
            arrived.set()

        await nc.subscribe(GpuXidReported.subject_filter(), cb=on_xid)
        await nc.subscribe(IncidentOpened.subject_filter(), cb=on_opened)
        try:
            await asyncio.sleep(args.interval * 1.5)  # every node has sampled; the detector is warm
            for i in range(args.faults):
                # spread over the fleet, one GPU each: never a share that makes a fleet incident
                key = (nodes[(i * 7919) % len(nodes)], i % GPUS)
                event = GpuXidReported(source="node-sampler", node_id=key[0], gpu_index=key[1], xid=48)
                arrived.clear()
                sent[key] = time.perf_counter()
                await js.publish(event.subject, event.to_json())
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(10):
                        while key not in opened:
                            await arrived.wait()
                            arrived.clear()
        finally:
            await stop_tasks([load])
            app.exit()
            await asyncio.wait({runner}, timeout=15)
            await nc.close()

    keys = [k for k in sent if k in hop and k in opened]
    raw = [(hop[k] - sent[k]) * 1000 for k in keys]
    detect = [(opened[k] - sent[k]) * 1000 for k in keys]
    print(
        f"detection latency: {len(keys)} of {args.faults} hardware XIDs to their incident, while {args.nodes} nodes "
        f"x {GPUS} GPUs sample every {args.interval:g}s ({args.nodes / args.interval:,.0f} samples/s), one nats-server"
    )
    print(f"  {'':44} {'p50':>8} {'p99':>8}")
    print(f"  {'the bus hop (publish -> plain subscriber)':44} {percentile(raw, 0.5):7.2f}ms {percentile(raw, 0.99):7.2f}ms")
    print(f"  {'fault event -> IncidentOpened':44} {percentile(detect, 0.5):7.2f}ms {percentile(detect, 0.99):7.2f}ms")
    print(f"  {'ratio detector / bus hop':44} {statistics.median(detect) / statistics.median(raw):8.1f}x")
    if len(keys) < args.faults:
        print(f"  {args.faults - len(keys)} XIDs got no incident within 10 s")


if __name__ == "__main__":
    import sys

    asyncio.run(main(sys.argv[1:]))
