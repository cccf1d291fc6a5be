"""The one-active lease on a real nats-server: one holder at a time, a standby takes over when the
holder stops (at once) or dies (within the TTL), and a holder that was overtaken says so."""

from __future__ import annotations

import asyncio
import time

from gpumedic_bus.lease import Lease
from gpumedic_bus.streams import LEASE_TTL_S, LEASES


async def _lease(js, instance: str) -> Lease:
    return Lease(await js.key_value(LEASES.bucket), "zombie-detector", instance, LEASE_TTL_S)


async def test_one_holder_and_a_standby_that_takes_over_at_a_clean_stop(js):
    a, b = await _lease(js, "a"), await _lease(js, "b")
    await asyncio.wait_for(a.acquire(), 5)
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(1.0)
    assert a.held and not waiting.done() and not b.held  # b stands by
    started = time.monotonic()
    await a.release()
    await asyncio.wait_for(waiting, 5)
    assert b.held and not a.held
    assert time.monotonic() - started < LEASE_TTL_S / 2  # at once, not a TTL later


async def test_a_dead_holder_is_replaced_within_the_ttl_and_learns_it_lost(js):
    a, b = await _lease(js, "a"), await _lease(js, "b")
    await a.acquire()
    lost: list[str] = []
    keeping = asyncio.create_task(a.keep(lost.append))
    await asyncio.sleep(LEASE_TTL_S / 2)
    assert a.held and not lost  # renewed past half the TTL
    keeping.cancel()  # a freezes: no renewal, no release (kill -9)
    started = time.monotonic()
    await asyncio.wait_for(b.acquire(), LEASE_TTL_S * 3)
    assert time.monotonic() - started <= LEASE_TTL_S * 2.5
    # a wakes up and tries to renew: it is told, and stops holding
    await asyncio.wait_for(a.keep(lost.append), LEASE_TTL_S)
    assert not a.held and len(lost) == 1 and "instance b holds it" in lost[0]
