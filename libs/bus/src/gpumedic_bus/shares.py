"""Per-node work shared among a service's live instances by partition, each partition a lease.

Work done node by node that need not happen in one place (the remediator's SSH round) is split
by the node's partition (`streams.partition_of`, the token NATS stores each sample under). Every
instance writes its presence (`<name>.member.<instance>`) to the bucket `GPUMEDIC_LEASES` each
round (`ttl / 4`), and holds at most its share of the `PARTITIONS` partitions, ceil(P / live
instances), each a key (`<name>.p<k>`) taken with a create (one create of a key succeeds) and
renewed with a compare-and-set. An instance gives back what it holds over its share, so one that
joins gets its share by the next rounds; a partition whose holder died is free once the bucket
forgets its key (the TTL) and another instance takes it in its next round. An instance that has
not renewed for `LOST_AFTER` of the TTL stops holding anything before the bucket could hand it
on, so no partition is worked on by two instances at once, and a clean stop gives all back at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpumedic_bus.lease import LOST_AFTER, REQUEST_TIMEOUT_S
from gpumedic_bus.streams import LEASE_TTL_S, LEASES, PARTITIONS, partition_of

log = logging.getLogger(__name__)

GIVE_BACK_WITHIN_S = 2.0
"""How long an instance finishes a partition before it gives it back (well within the lease TTL)."""


class Shares:
    def __init__(self, name: str, instance: str, *, partitions: int = PARTITIONS,
                 before_giving_back: Callable[[int], Awaitable[None]] | None = None) -> None:
        """`before_giving_back(partition)`: what this instance finishes of a partition before it
        lets another take it (a detector cell writes its rules' memory); given `GIVE_BACK_WITHIN_S`."""
        self.name = name
        self._before_giving_back = before_giving_back
        self.instance = instance
        self.partitions = partitions
        self.held: dict[int, int] = {}
        """The partitions this instance holds now, with their keys' revisions."""
        self.settled = asyncio.Event()
        """Set once a round went through: what this instance holds is its share (or all it could take)."""
        self.ttl_s = LEASE_TTL_S
        self._kv: KeyValue | None = None
        self._js = None
        self._renewed = time.monotonic()
        self._value = json.dumps({"instance": instance, "host": socket.gethostname(), "incarnation": uuid.uuid4().hex}).encode()
        start = partition_of(instance, partitions)  # instances try the free partitions in different orders
        self._order = [(start + i) % partitions for i in range(partitions)]

    def holds(self, node_id: str) -> bool:
        """Whether this instance works on `node_id` now."""
        return partition_of(node_id, self.partitions) in self.held

    def _key(self, partition: int) -> str:
        return f"{self.name}.p{partition:02d}"

    @property
    def _member(self) -> str:
        return f"{self.name}.member.{self.instance}"

    async def run(self, nc: NATS) -> None:
        """Hold this instance's share until cancelled, then give it all back."""
        self._js = nc.jetstream(timeout=REQUEST_TIMEOUT_S)
        while self._kv is None:  # started as the service becomes ready, maybe as the bus goes away: wait for it
            try:
                kv = await self._js.key_value(LEASES.bucket)
                self.ttl_s = (await kv.status()).ttl or LEASE_TTL_S  # the bucket's own TTL, as `Lease`
                self._kv = kv
            except Exception as exc:  # noqa: BLE001
                log.warning("%s: waits for its lease bucket: %s", self.name, type(exc).__name__)
                await asyncio.sleep(1.0)
        try:
            while True:
                try:
                    await self.round()
                except Exception as exc:  # noqa: BLE001 (the bus is away: hold on while it may still be ours)
                    self._let_go_if_stale(exc)
                else:
                    self.settled.set()
                if asyncio.current_task().cancelling():
                    # Python 3.11's wait_for (under nats-py's requests) can swallow a cancellation that
                    # lands as its answer does; a stopped service's share must not be renewed on.
                    raise asyncio.CancelledError
                await asyncio.sleep(self.ttl_s / 4)
        finally:
            await self.release()

    async def round(self) -> None:
        """Say this instance is here, renew what it holds, give back what is over its share, take
        free partitions up to it."""
        await self._kv.put(self._member, self._value)
        for partition, revision in list(self.held.items()):
            try:
                self.held[partition] = await self._kv.update(self._key(partition), self._value, last=revision)
            except KeyWrongLastSequenceError:
                if not await self._own_write_applied(partition):
                    del self.held[partition]
                    log.warning("%s: partition %d was taken by another instance; this one no longer works on it", self.name, partition)
        self._renewed = time.monotonic()
        share = math.ceil(self.partitions / await self._members())
        for partition in sorted(self.held, reverse=True)[: max(0, len(self.held) - share)]:
            await self._give_back(partition)
        for partition in self._order:
            if len(self.held) >= share:
                break
            if partition in self.held:
                continue
            try:
                self.held[partition] = await self._kv.create(self._key(partition), self._value)
            except KeyWrongLastSequenceError:  # another instance holds it, or this one did before the bus went away
                await self._own_write_applied(partition)

    async def release(self) -> None:
        """Give back everything at once (a clean stop), and say this instance is gone."""
        for partition in list(self.held):
            await self._give_back(partition)
        if self._kv is not None:
            with contextlib.suppress(Exception):
                await self._kv.delete(self._member)

    async def _give_back(self, partition: int) -> None:
        if self._before_giving_back is not None:
            try:
                await asyncio.wait_for(self._before_giving_back(partition), GIVE_BACK_WITHIN_S)
            except Exception as exc:  # noqa: BLE001 (the next holder learns a little again; the partition still moves)
                log.warning("%s: partition %d given back unfinished (%s)", self.name, partition, type(exc).__name__)
        revision = self.held.pop(partition)  # no longer worked on here before another may take it
        with contextlib.suppress(Exception):  # unreachable: the bucket forgets it within the TTL
            await self._kv.delete(self._key(partition), last=revision)

    async def _members(self) -> int:
        """The live instances (this one included): presence keys written within the TTL and not
        deleted by a clean stop."""
        info = await self._js.stream_info(f"KV_{LEASES.bucket}", subjects_filter=f"$KV.{LEASES.bucket}.{self.name}.member.*")
        live = 0
        for subject in (info.state.subjects or {}):
            with contextlib.suppress(KeyNotFoundError):  # deleted: that instance stopped
                await self._kv.get(subject.removeprefix(f"$KV.{LEASES.bucket}."))
                live += 1
        return max(1, live)

    async def _own_write_applied(self, partition: int) -> bool:
        """Whether the key holds this very process's value (a renewal the server applied but whose
        answer was lost, or a key this instance let go of while the bus was away): then it is held."""
        with contextlib.suppress(Exception):
            entry = await self._kv.get(self._key(partition))
            if entry.value == self._value:
                self.held[partition] = entry.revision
                return True
        return False

    def _let_go_if_stale(self, exc: BaseException) -> None:
        if self.held and time.monotonic() - self._renewed >= LOST_AFTER * self.ttl_s:
            log.error("%s: partitions %s not renewed for %.1fs (%s); this instance no longer works on them", self.name,
                      sorted(self.held), time.monotonic() - self._renewed, type(exc).__name__)
            self.held.clear()
