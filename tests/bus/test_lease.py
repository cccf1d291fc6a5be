"""The one-active lease on a real nats-server: one holder at a time, a standby takes over when the
holder stops (at once) or dies (within the TTL), a holder that was overtaken says so, an
instance restarted under its own id takes its key back at once, and a loop that runs in one
instance of a service at a time waits out a bus that does not answer instead of dying."""

from __future__ import annotations

import asyncio
import dataclasses
import time

import nats
import nats.js.errors
from nats.js.api import DiscardPolicy, StorageType, StreamConfig

from gpumedic_bus import NatsSettings, ServiceRuntime, provision
from gpumedic_bus.lease import Lease
from gpumedic_bus.streams import INCIDENT_STATE, LEASE_TTL_S, LEASES

TTL_S = 2.0
"""The timing tests' own bucket forgets a key this soon, so a death is seen within a test."""


async def _short_bucket(js):
    return await js.create_key_value(dataclasses.replace(LEASES, bucket="TEST_LEASES", ttl=TTL_S))


async def test_one_holder_and_a_standby_that_takes_over_at_a_clean_stop(js):
    kv = await _short_bucket(js)
    a, b = Lease(kv, "zombie-detector", "a", TTL_S), Lease(kv, "zombie-detector", "b", TTL_S)
    await asyncio.wait_for(a.acquire(), 5)
    waiting = asyncio.create_task(b.acquire())
    await asyncio.sleep(TTL_S / 2)
    assert a.held and not waiting.done() and not b.held  # b stands by
    started = time.monotonic()
    await a.release()
    await asyncio.wait_for(waiting, 5)
    assert b.held and not a.held
    assert time.monotonic() - started < TTL_S / 2  # at once, not a TTL later


async def test_a_dead_holder_is_replaced_within_the_ttl_and_learns_it_lost(js):
    kv = await _short_bucket(js)
    a, b = Lease(kv, "zombie-detector", "a", TTL_S), Lease(kv, "zombie-detector", "b", TTL_S)
    await a.acquire()
    lost: list[str] = []
    keeping = asyncio.create_task(a.keep(lost.append))
    await asyncio.sleep(TTL_S * 1.5)
    assert a.held and not lost  # renewed past the TTL
    keeping.cancel()  # a freezes: no renewal, no release (kill -9)
    started = time.monotonic()
    await asyncio.wait_for(b.acquire(), TTL_S * 4)
    assert time.monotonic() - started <= TTL_S * 3
    # a wakes up and tries to renew: it is told, and stops holding
    await asyncio.wait_for(a.keep(lost.append), TTL_S * 2)
    assert not a.held and len(lost) == 1 and "instance b holds it" in lost[0]


async def test_an_instance_restarted_under_its_own_id_takes_its_lease_back_at_once(js):
    kv = await _short_bucket(js)
    before = Lease(kv, "zombie-detector", "a", TTL_S)
    await before.acquire()  # then killed: the key stays until the TTL
    other = asyncio.create_task(Lease(kv, "zombie-detector", "b", TTL_S).acquire())
    restarted = Lease(kv, "zombie-detector", "a", TTL_S)
    started = time.monotonic()
    await asyncio.wait_for(restarted.acquire(), TTL_S / 2)
    assert restarted.held and time.monotonic() - started < TTL_S / 2
    assert not other.done()  # the key went from a to a: b still waits
    # the dead incarnation's revision is stale: were it alive after all, its renewal is refused
    lost: list[str] = []
    await asyncio.wait_for(before.keep(lost.append), TTL_S * 2)
    assert lost and "instance a holds it" in lost[0]
    other.cancel()


async def test_a_renewal_applied_whose_answer_was_lost_keeps_the_lease(js):
    """The bus restarts between the server applying a renewal and its answer: the holder's revision
    is then one behind. It is its own write, so the holder stays active (as a CI run showed, a
    detector that stopped here left a zombie undetected)."""
    kv = await _short_bucket(js)
    a = Lease(kv, "zombie-detector", "a", TTL_S)
    await a.acquire()
    await kv.update("zombie-detector", a._value, last=a.revision)  # applied; a never hears of it
    lost: list[str] = []
    keeping = asyncio.create_task(a.keep(lost.append))
    await asyncio.sleep(TTL_S * 1.5)
    assert a.held and not lost and not keeping.done()
    assert a.revision == (await kv.get("zombie-detector")).revision
    # another process under the same id (a restart) is not taken for this one
    other = Lease(kv, "zombie-detector", "a", TTL_S)
    await other.acquire()
    await asyncio.wait_for(keeping, TTL_S * 2)
    assert not a.held and lost and "instance a holds it" in lost[0]


async def test_a_lease_keeps_time_by_its_bucket_and_provision_brings_old_buckets_to_the_declared_settings(js, nats_url):
    # as an older release provisioned them: another TTL, and reads answered by any replica
    old = dataclasses.replace(LEASES, ttl=LEASE_TTL_S / 2, direct=True)
    await js.delete_key_value(LEASES.bucket)
    await js.create_key_value(old)
    await js.delete_key_value(INCIDENT_STATE.bucket)
    # as an older nats-py made a bucket: no time to live per key (a closed incident's mark keeps one)
    await js.add_stream(StreamConfig(name=f"KV_{INCIDENT_STATE.bucket}", subjects=[f"$KV.{INCIDENT_STATE.bucket}.>"], max_msgs_per_subject=1,
                                     allow_rollup_hdrs=True, deny_delete=True, allow_direct=True, discard=DiscardPolicy.NEW,
                                     storage=StorageType.FILE))
    assert not (await js.stream_info(f"KV_{INCIDENT_STATE.bucket}")).config.allow_msg_ttl
    nc = await nats.connect(nats_url)
    try:
        lease = await Lease.open(nc, "zombie-detector", "a")
        assert lease.ttl_s == old.ttl  # not the constant: renewing on its timing could outlive the key
        await provision(js, NatsSettings(url=nats_url))
        leases = (await (await js.key_value(LEASES.bucket)).status()).stream_info.config
        assert (leases.max_age, leases.allow_direct) == (LEASE_TTL_S, False)
        assert (await Lease.open(nc, "zombie-detector", "a")).ttl_s == LEASE_TTL_S
    finally:
        await nc.close()
    states = (await (await js.key_value(INCIDENT_STATE.bucket)).status()).stream_info.config
    assert not states.allow_direct  # the gate reads the latest state from the stream's leader
    assert states.allow_msg_ttl


async def test_a_one_instance_loop_runs_in_one_instance_and_waits_out_a_bus_that_does_not_answer(nats_settings, monkeypatch, caplog):
    real_open, misses = Lease.open, []

    async def electing(nc, key, instance):  # the lease bucket mid-election as the service becomes ready
        if len(misses) < 2:
            misses.append((key, instance))
            raise nats.js.errors.NoStreamResponseError
        return await real_open(nc, key, instance)

    monkeypatch.setattr(Lease, "open", staticmethod(electing))
    ran: list[str] = []
    apps = {}
    for name in ("a", "b"):
        runtime = ServiceRuntime("report-builder", nats_settings)

        async def write_history(name=name) -> None:
            while True:
                ran.append(name)
                await asyncio.sleep(0.05)

        runtime.background(write_history, one_instance="history")
        app = runtime.app()
        apps[name] = (app, asyncio.create_task(app.run()))
        await asyncio.wait_for(runtime.ready.wait(), 20)
    try:
        for _ in range(100):
            if ran:
                break
            await asyncio.sleep(0.1)
        await asyncio.sleep(1.0)
        first = set(ran)
        assert len(first) == 1, ran  # one instance checks; the other stands by
        assert len(misses) == 2 and {key for key, _ in misses} == {"report-builder.history"}
        waited = [r.getMessage() for r in caplog.records if "waits for its lease bucket" in r.getMessage()]
        assert len(waited) == len({instance for _, instance in misses})  # a line per instance, not per try
        assert all("the bus did not answer (no response from stream)" in line for line in waited)
        assert not [r for r in caplog.records if r.exc_info]
        active = first.pop()
        app, task = apps.pop(active)
        app.exit()
        await task
        ran.clear()
        for _ in range(50):  # a clean stop hands the lease over at once
            if ran:
                break
            await asyncio.sleep(0.1)
        assert set(ran) == set(apps), ran
    finally:
        for app, task in apps.values():
            app.exit()
            await task
