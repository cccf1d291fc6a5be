"""leader-health's probe round: every peer of a cluster through TCP, /health and /status, at the
service's concurrency, for 200 and 1,000 peers, side by side with its floor (one bare TCP connect
per peer at the same concurrency) in interleaved rounds.

The peers are the simulated fleet's status endpoints (the same asyncio HTTP server `gpumedic sim`
runs), all on loopback in this process, so the figure is the probe's own cost; the goal is a
round well within the service's interval (`GPUMEDIC_LEADER_INTERVAL_S`, 30 s by default).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time

from gpumedic_sim.machine.cluster import PeerCluster
from gpumedic_sim.machine.state import NodeState
from gpumedic_sim.machine.status import StatusEndpoint
from leader_health.probe import probe_all
from leader_health.settings import Settings


class _Answered(StatusEndpoint):
    """A peer's endpoint answering its document as of the start: the simulated cluster works out
    each answer from every member (1,000 x 1,000 per round here), which would be measured as the
    probe's cost."""

    def __init__(self, node: NodeState) -> None:
        super().__init__(node)
        self._document = super().document()

    def document(self) -> dict:
        return self._document


async def _floor(ports: list[int], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def connect(port: int) -> None:
        async with gate:
            _, writer = await asyncio.open_connection("127.0.0.1", port)
            writer.close()

    await asyncio.gather(*(connect(port) for port in ports))


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--probe-peers", type=int, nargs="+", default=[200, 1000])
    parser.add_argument("--probe-rounds", type=int, default=3)
    args, _ = parser.parse_known_args(argv)
    defaults = Settings()
    print(
        f"probe round: TCP + /health + /status of every peer, {defaults.probe_concurrency} at once "
        f"(the service's default), against a bare TCP connect per peer; medians of {args.probe_rounds} rounds"
    )
    for count in args.probe_peers:
        nodes = [NodeState(f"peer-{i:04d}", 1) for i in range(count)]
        cluster = PeerCluster([n.node_id for n in nodes])  # healthy, led by peer-0000
        for node in nodes:
            node.cluster = cluster
        endpoints = [_Answered(node) for node in nodes]
        ports = [await endpoint.start() for endpoint in endpoints]
        urls = [f"http://127.0.0.1:{port}/status" for port in ports]
        rounds, floors = [], []
        try:
            for _ in range(args.probe_rounds):
                started = time.perf_counter()
                await _floor(ports, defaults.probe_concurrency)
                floors.append(time.perf_counter() - started)
                started = time.perf_counter()
                answers = await probe_all(
                    urls,
                    connect_timeout_s=defaults.connect_timeout_s,
                    http_timeout_s=defaults.http_timeout_s,
                    concurrency=defaults.probe_concurrency,
                )
                rounds.append(time.perf_counter() - started)
                bad = [a for a in answers if a.state != "ok"]
                if bad:
                    raise RuntimeError(f"{len(bad)} of {count} peers did not answer: {bad[0].state} {bad[0].detail}")
        finally:
            for endpoint in endpoints:
                await endpoint.stop()
        whole, floor = statistics.median(rounds), statistics.median(floors)
        print(
            f"  {count:>5} peers: round {whole * 1000:7.1f} ms (floor {floor * 1000:6.1f} ms, {whole / floor:4.1f}x); "
            f"{whole / defaults.interval_s:.2%} of the {defaults.interval_s:g} s interval"
        )
