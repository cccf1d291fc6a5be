"""One active instance of a service at a time, however many run: a lease in the KV bucket
`GPUMEDIC_LEASES`, one key per service.

The detectors (zombie-detector, leader-health, the autoscaler) keep what they decide from in
memory: idle streaks, probe histories, the pool's view. Two active instances would each open the
same incident and ask for the same action. So each of their instances first takes its service's
key with a create (compare-and-set: only one create of a key succeeds), and renews it every
`ttl_s / 4`; the others wait, connected, as standbys. The bucket forgets a key `ttl_s` after its
last write, so when the active instance dies (kill -9, a lost node) a standby takes over within
about `ttl_s`; one that stops cleanly deletes its key and a standby takes over at once. An
instance restarted under its own id (`GPUMEDIC_INSTANCE_ID`, which the embedded stack's
supervisor keeps across restarts) takes its own key back at once: the process that held it is
the one its supervisor found dead.

The holder gives up (and its process stops, to come back as a standby) when it has not renewed
for `LOST_AFTER` of the TTL, before the bucket can hand the key to another instance: two
instances never act at once, at the price of a stop when the bus is away for that long.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
import time
import uuid
from collections.abc import Awaitable, Callable

from nats.aio.client import Client as NATS
from nats.js.errors import KeyNotFoundError, KeyWrongLastSequenceError
from nats.js.kv import KeyValue

from gpumedic_bus.streams import LEASE_TTL_S, LEASES

log = logging.getLogger(__name__)

LOST_AFTER = 0.6
"""The share of the TTL without a renewal after which the holder stops acting."""
REQUEST_TIMEOUT_S = 2.0
"""A lease's bus requests answer in milliseconds; one that does not (a leader election) is asked
again sooner than nats-py's 5 s default, so a start or a renewal is not held up by the wait."""


class Lease:
    def __init__(self, kv: KeyValue, service: str, instance: str, ttl_s: float) -> None:
        self._kv = kv
        self.service = service
        self.instance = instance
        self.ttl_s = ttl_s
        self.revision: int | None = None
        self._renewed = 0.0
        # `incarnation` tells this process's own writes from those of an earlier process under the
        # same instance id: a renewal whose answer was lost (the bus restarted meanwhile) is ours
        self._value = json.dumps({"instance": instance, "host": socket.gethostname(), "incarnation": uuid.uuid4().hex}).encode()

    @classmethod
    async def open(cls, nc: NATS, service: str, instance: str) -> Lease:
        """The lease on `service`'s key, with the bucket's own TTL (a bucket provisioned by an older
        release may have another; timing off the constant instead could outlive the key)."""
        kv = await nc.jetstream(timeout=REQUEST_TIMEOUT_S).key_value(LEASES.bucket)
        return cls(kv, service, instance, (await kv.status()).ttl or LEASE_TTL_S)

    @property
    def held(self) -> bool:
        return self.revision is not None

    async def acquire(self) -> None:
        """Return once this instance holds the lease; wait as a standby until then."""
        said = ""
        while True:
            try:
                self.revision = await self._kv.create(self.service, self._value)
                self._renewed = time.monotonic()
                log.info("%s: active (lease taken by instance %s)", self.service, self.instance)
                return
            except KeyWrongLastSequenceError:
                if await self._take_back():
                    return
                holder = await self._holder()
                if holder != said:
                    log.info("%s: standby; instance %s is active (takes over within %gs of it stopping)", self.service, holder, self.ttl_s)
                    said = holder
            except Exception as exc:  # the bus is away: keep waiting, say so once
                reason = f"cannot reach the lease bucket ({type(exc).__name__})"
                if reason != said:
                    log.warning("%s: standby; %s", self.service, reason)
                    said = reason
            await asyncio.sleep(self.ttl_s / 8)

    async def _take_back(self) -> bool:
        """Take the key over when it names this very instance (it was restarted): a compare-and-set
        on the revision read, so a key that changed meanwhile is left alone."""
        try:
            entry = await self._kv.get(self.service)
            if str(json.loads(entry.value or b"{}").get("instance")) != self.instance:
                return False
            self.revision = await self._kv.update(self.service, self._value, last=entry.revision)
        except Exception:  # noqa: BLE001 (gone, changed or unreachable: acquire as usual)
            return False
        self._renewed = time.monotonic()
        log.info("%s: active (instance %s took its own lease back after a restart)", self.service, self.instance)
        return True

    async def keep(self, on_lost: Callable[[str], Awaitable[None] | None]) -> None:
        """Renew until cancelled; call `on_lost(why)` once, and return, when the lease is lost."""
        while True:
            await asyncio.sleep(self.ttl_s / 4)
            try:
                self.revision = await self._kv.update(self.service, self._value, last=self.revision)
                self._renewed = time.monotonic()
                continue
            except KeyWrongLastSequenceError:
                if await self._own_write_applied():
                    continue
                why = f"instance {await self._holder()} holds it now"
            except Exception as exc:  # noqa: BLE001 (the bus is away: keep trying while the lease may still be ours)
                if time.monotonic() - self._renewed < LOST_AFTER * self.ttl_s:
                    continue
                why = f"not renewed for {time.monotonic() - self._renewed:.1f}s ({type(exc).__name__})"
            self.revision = None
            log.error("%s: lease lost: %s; this instance stops acting", self.service, why)
            outcome = on_lost(why)
            if outcome is not None:
                await outcome
            return

    async def _own_write_applied(self) -> bool:
        """Whether the key holds this very process's value: a renewal the server applied but whose
        answer was lost (a bus restart or a timeout). Then its revision is adopted and the lease kept."""
        try:
            entry = await self._kv.get(self.service)
        except Exception:  # noqa: BLE001 (gone or unreachable: the lease is lost as the caller says)
            return False
        if entry.value != self._value:
            return False
        self.revision = entry.revision  # `_renewed` stays: the write's own time is not known
        log.info("%s: a renewal's answer was lost, but the renewal was applied; still active", self.service)
        return True

    async def release(self) -> None:
        """Give the lease up at once (a clean stop), if this instance holds it."""
        if self.revision is None:
            return
        revision, self.revision = self.revision, None
        with contextlib.suppress(Exception):
            await self._kv.delete(self.service, last=revision)
            log.info("%s: lease released", self.service)

    async def _holder(self) -> str:
        try:
            entry = await self._kv.get(self.service)
            return str(json.loads(entry.value or b"{}").get("instance", "?"))
        except (KeyNotFoundError, ValueError):
            return "(none)"
        except Exception:  # noqa: BLE001 (only for a log line)
            return "?"
