"""Per-node work shared by partition among a service's instances, against a real nats-server: the
live instances' shares cover every partition and never overlap, one that joins gets its share, a
dead one's partitions are taken within the lease period (timed), and a clean stop hands its
partitions over at once. The bucket's TTL is shortened to 2 s here, so rounds take 0.5 s."""

from __future__ import annotations

import asyncio
import dataclasses
import math
import time

import nats

from gpumedic_bus.shares import Shares
from gpumedic_bus.streams import LEASES, PARTITIONS, partition_of

TTL_S = 2.0


class Fleet:
    """Instances of one piece of work, each on its own connection, watched for overlaps."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.running: dict[str, tuple[Shares, asyncio.Task, nats.NATS]] = {}
        self.overlaps: list[str] = []
        self._watch = asyncio.create_task(self._watch_overlaps())

    async def start(self, name: str) -> Shares:
        nc = await nats.connect(self.url)
        shares = Shares("remediator.ssh-health", name)
        self.running[name] = (shares, asyncio.create_task(shares.run(nc)), nc)
        return shares

    async def stop(self, name: str, *, dies: bool = False) -> None:
        """A clean stop gives its partitions back; one that dies (its connection gone at once, as
        with kill -9) leaves them to the bucket's TTL."""
        shares, task, nc = self.running.pop(name)
        if dies:
            await nc.close()
        task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 15)  # a share that outlives its stop fails here
        await nc.close()

    def held(self) -> dict[str, set[int]]:
        return {name: set(shares.held) for name, (shares, _, _) in self.running.items()}

    async def settled(self, within_s: float) -> float:
        """Seconds until the running instances hold every partition, each at most its share."""
        started = time.monotonic()
        while time.monotonic() - started < within_s:
            held = self.held()
            share = math.ceil(PARTITIONS / len(held))
            if set().union(*held.values()) == set(range(PARTITIONS)) and all(len(h) <= share for h in held.values()):
                return time.monotonic() - started
            await asyncio.sleep(0.05)
        raise AssertionError(f"not settled within {within_s}s: {self.held()}")

    async def _watch_overlaps(self) -> None:
        while True:
            held = self.held()
            for partition in range(PARTITIONS):
                holders = [name for name, h in held.items() if partition in h]
                if len(holders) > 1:
                    self.overlaps.append(f"partition {partition}: {holders}")
            await asyncio.sleep(0.01)

    async def close(self) -> None:
        self._watch.cancel()
        for name in list(self.running):
            await self.stop(name)


async def test_instances_share_every_partition_once_and_take_over_from_one_that_dies(js, nats_url):
    config = (await (await js.key_value(LEASES.bucket)).status()).stream_info.config
    await js.update_stream(dataclasses.replace(config, max_age=TTL_S, duplicate_window=TTL_S))
    fleet = Fleet(nats_url)
    try:
        for name in ("a", "b"):
            await fleet.start(name)
        await fleet.settled(within_s=5 * TTL_S)
        third = await fleet.start("c")  # one joins: the others give back what is over their share
        await asyncio.wait_for(third.settled.wait(), TTL_S)
        await fleet.settled(within_s=5 * TTL_S)
        assert all(len(h) >= PARTITIONS // 3 - 1 for h in fleet.held().values()), fleet.held()
        assert third.holds(next(f"node-{i}" for i in range(999) if partition_of(f"node-{i}") in third.held))

        victim = max(fleet.held(), key=lambda name: len(fleet.held()[name]))
        await fleet.stop(victim, dies=True)
        took_over_s = await fleet.settled(within_s=3 * TTL_S)
        # within the lease period: the bucket forgets the dead one's keys a TTL after their last
        # renewal, and a survivor's next round (a quarter of it later) takes them
        assert took_over_s <= 1.5 * TTL_S, took_over_s
        print(f"partitions of a dead instance taken over in {took_over_s:.2f}s (bucket TTL {TTL_S:g}s)")

        leaving = next(iter(fleet.held()))
        await fleet.stop(leaving)  # a clean stop gives its partitions back at once
        handed_over_s = await fleet.settled(within_s=3 * TTL_S)
        assert handed_over_s < TTL_S, handed_over_s
        assert fleet.overlaps == []
    finally:
        await fleet.close()
        await js.update_stream(config)


async def test_a_share_stops_when_its_cancellation_is_swallowed_under_a_request(nats_url):
    """Python 3.11's wait_for, under every nats-py request, may swallow a cancellation that lands as
    the answer does (it happened under `make test`'s load): the share must stop all the same."""
    nc = await nats.connect(nats_url)
    shares = Shares("remediator.ssh-health", "a")
    real_round, rounds = shares.round, []

    async def swallowing() -> None:
        await real_round()
        rounds.append(1)
        if len(rounds) == 2:
            asyncio.current_task().cancel()
            try:
                await asyncio.sleep(0)  # the cancellation lands here, and is swallowed as wait_for may
            except asyncio.CancelledError:
                pass

    shares.round = swallowing
    running = asyncio.create_task(shares.run(nc))
    try:
        await asyncio.wait_for(asyncio.gather(running, return_exceptions=True), 10)
        assert running.cancelled() and len(rounds) == 2 and shares.held == {}  # stopped, and gave its partitions back
    finally:
        running.cancel()
        await nc.close()
