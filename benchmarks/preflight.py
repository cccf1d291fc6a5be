"""Pre-flight's cost to a job launcher: the whole `gpumedic preflight` request over the bus, side by side
with its floor, one SSH login and one command to the same node.

A simulated node with `--preflight-gpus` (8) idle GPUs answers over real SSH; the remediator service
runs in-process on a real nats-server with a migrated SQLite store. Both are measured `--preflight-runs`
times in the same run, alternating, so the figure is their ratio: what checking every GPU costs over
the login a launch script would pay anyway.
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

from benchmarks import percentile
from gpumedic.natsd import NatsServer
from gpumedic.preflight import ask
from gpumedic_bus import NatsSettings, provision
from gpumedic_events import PreflightRequest
from gpumedic_sim import SimFleet
from gpumedic_store import upgrade
from remediator.main import create_app, executor_of
from remediator.settings import Settings


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--preflight-gpus", type=int, default=8)
    parser.add_argument("--preflight-runs", type=int, default=50)
    args, _ = parser.parse_known_args(argv)
    for noisy in ("faststream", "remediator", "remediator.preflight", "asyncssh"):
        logging.getLogger(noisy).setLevel(logging.ERROR)

    with tempfile.TemporaryDirectory(prefix="gpumedic-bench-preflight-") as tmp, NatsServer(Path(tmp) / "nats") as server:
        fleet = SimFleet(1, args.preflight_gpus, Path(tmp) / "fleet")
        await fleet.start()
        node = next(iter(fleet.nodes.values()))
        for gpu in range(args.preflight_gpus):
            node.finish_job(gpu)  # an idle node, as before a job starts: every GPU is checked in full
        store = f"sqlite+aiosqlite:///{tmp}/gpumedic.db"
        upgrade(store)
        bus = NatsSettings(url=server.url)
        nc = await nats.connect(server.url)
        await provision(nc.jetstream(), bus)
        await nc.close()
        settings = Settings(
            nats=bus, store={"url": store}, inventory=fleet.inventory_path, known_hosts=fleet.known_hosts_path,
            client_key=fleet.client_key_path, ssh_check_interval_s=0,
        )
        app = create_app(settings)
        runner = asyncio.create_task(app.run())
        executor = executor_of(settings)
        floor, whole = [], []
        request = PreflightRequest(node_id=node.node_id)
        try:
            await asyncio.wait_for(app.runtime.ready.wait(), 30)
            await ask(bus, request, timeout_s=30)  # warm up
            for _ in range(args.preflight_runs):
                started = time.perf_counter()
                await executor.run(node.node_id, "which nvidia-smi")
                floor.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                report = await ask(bus, request, timeout_s=30)
                whole.append((time.perf_counter() - started) * 1000)
                if not report.ready:
                    raise RuntimeError(f"the idle node is not ready: {report.summary()}")
        finally:
            app.exit()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(runner, 15)
            await fleet.stop()

    print(f"pre-flight: `gpumedic preflight` on an idle {args.preflight_gpus}-GPU simulated node, {args.preflight_runs} runs (real bus, real SSH)")
    print(f"  {'':44} {'p50':>8} {'p99':>8}")
    print(f"  {'one SSH login + one command (the floor)':44} {percentile(floor, 0.5):7.1f}ms {percentile(floor, 0.99):7.1f}ms")
    print(f"  {'pre-flight request -> report':44} {percentile(whole, 0.5):7.1f}ms {percentile(whole, 0.99):7.1f}ms")
    print(f"  {'ratio pre-flight / floor':44} {statistics.median(whole) / statistics.median(floor):8.1f}x")


if __name__ == "__main__":
    import sys

    asyncio.run(main(sys.argv[1:]))
