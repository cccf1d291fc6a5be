"""The paced sample consumer against a real nats-server: it asks for batches on its pace, at once
again while they come back full, and acknowledges what it handled; a push consumer left by an
older release is made again as a pull one by provisioning."""

from __future__ import annotations

import asyncio
import json
import time
import uuid

import nats
from nats.js.api import AckPolicy, ConsumerConfig

from benchmarks import node_sample
from gpumedic_bus import NatsSettings, PacedConsumer, ServiceRuntime, provision
from gpumedic_bus.consume import BACKLOG_BATCHES, PACED_BATCH
from gpumedic_bus.follow import PacedReader
from gpumedic_bus.streams import SAMPLES, stream_of
from gpumedic_bus.topology import LIVE, PACED_READS, permissions_for
from gpumedic_bus.topology import durable as declared_durable
from gpumedic_events import NodeSampled

DURABLE = "zombie-detector-samples"


async def _publish(js, count: int) -> set[str]:
    samples = [node_sample(f"node-{i:05d}", event_id=uuid.uuid4()) for i in range(count)]
    await asyncio.gather(*(js.publish(s.subject, s.to_json()) for s in samples))
    return {str(s.event_id) for s in samples}


def _consumer(nats_settings, handled: list[str], every_s: float) -> PacedConsumer:
    runtime = ServiceRuntime("zombie-detector", nats_settings)

    async def handle(sample) -> None:
        handled.append(str(sample.event_id))

    return PacedConsumer(runtime.broker, declared_durable(DURABLE), handle, service="zombie-detector", metrics=runtime.metrics,
                         connect=lambda: nats.connect(nats_settings.url), every_s=every_s)


def test_what_a_service_reads_a_batch_at_a_time_it_reads_live_from_a_stream_that_allows_direct_gets():
    for service, events in PACED_READS.items():
        for event in events:
            assert event in LIVE[service], (service, event.__name__)
            assert stream_of(event).config().allow_direct, (service, stream_of(event).name)
            rules = permissions_for(service).publish
            assert f"$JS.API.DIRECT.GET.{stream_of(event).name}" in rules and f"$JS.API.STREAM.MSG.GET.{stream_of(event).name}" in rules


async def test_a_backlog_is_asked_for_at_once_as_many_as_wait_and_a_new_sample_on_the_next_turn(nats_settings, js):
    backlog = await _publish(js, 3 * PACED_BATCH + 17)
    handled: list[str] = []
    asked: list[int] = []
    watcher = await nats.connect(nats_settings.url)

    async def on_ask(msg) -> None:
        asked.append(json.loads(msg.data)["batch"])

    await watcher.subscribe(f"$JS.API.CONSUMER.MSG.NEXT.{SAMPLES.name}.{DURABLE}", cb=on_ask)  # a copy of each ask
    consumer = _consumer(nats_settings, handled, every_s=4.0)
    began = time.monotonic()
    await consumer.start()
    try:
        while len(handled) < len(backlog) and time.monotonic() - began < 30:
            await asyncio.sleep(0.02)
        took = time.monotonic() - began
        # Four batches: one pace's wait per batch would be 12 s and more; asked at once, the
        # backlog is in before the first turn's end.
        assert set(handled) == backlog and len(handled) == len(backlog)
        assert took < 4.0, f"the backlog took {took:.1f}s: each full batch waited for the pace"
        await asyncio.sleep(0.5)
        later = await _publish(js, 1)
        while not later <= set(handled) and time.monotonic() - began < 30:
            await asyncio.sleep(0.02)
        assert later <= set(handled)
        # The watcher's copy of the turn's ask travels on its own connection and may land after the
        # sample that answered it.
        while len(asked) < 3 and time.monotonic() - began < 30:
            await asyncio.sleep(0.02)
        # One batch first; its last sample said how many more waited: all of them asked for at once
        # (within BACKLOG_BATCHES batches), then one batch a turn.
        assert asked[:2] == [PACED_BATCH, 2 * PACED_BATCH + 17] and set(asked[2:]) == {PACED_BATCH}, asked
    finally:
        await consumer.stop()
        await watcher.close()
    info = await js.consumer_info(SAMPLES.name, DURABLE)
    assert info.num_ack_pending == 0 and info.num_pending == 0  # what it handled is acknowledged, up to its stop


async def test_a_push_consumer_of_an_older_release_is_made_again_as_pull_and_then_read(nats_settings, js):
    await js.delete_consumer(SAMPLES.name, DURABLE)
    await js.add_consumer(SAMPLES.name, ConsumerConfig(durable_name=DURABLE, filter_subject=SAMPLES.stored_filter(NodeSampled),
                                                       deliver_subject="_GPUMEDIC.deliver." + DURABLE, ack_policy=AckPolicy.ALL))
    handled: list[str] = []
    consumer = _consumer(nats_settings, handled, every_s=0.2)
    try:
        await consumer.start()
        raise AssertionError("a push consumer was bound as a paced one")
    except ValueError as exc:
        assert "push consumer of an older release: run gpumedic-provision" in str(exc)
    await consumer.stop()

    done = await provision(js, NatsSettings(url=nats_settings.url))
    assert f"consumer {DURABLE} on {SAMPLES.name} again, as a pull consumer" in done
    assert (await js.consumer_info(SAMPLES.name, DURABLE)).config.deliver_subject is None
    sent = await _publish(js, 3)
    consumer = _consumer(nats_settings, handled, every_s=0.2)
    await consumer.start()
    try:
        deadline = time.monotonic() + 10
        while not sent <= set(handled) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        await consumer.stop()
    assert sent <= set(handled)


async def test_a_paced_reader_hands_on_what_is_stored_after_its_start_in_order_a_backlog_at_once(nats_settings, js):
    before = await _publish(js, 5)  # stored before it starts: not its to read
    seen: list[tuple[str, bytes]] = []

    async def on_message(stored: str, body: bytes) -> None:
        seen.append((stored, body))

    nc = await nats.connect(nats_settings.url)
    reader = PacedReader(nc, SAMPLES.name, SAMPLES.stored_filter(NodeSampled), on_message, every_s=4.0)
    await reader.start()
    try:
        samples = [node_sample(f"node-{i:05d}", event_id=uuid.uuid4()) for i in range(3 * PACED_BATCH + 5)]
        for sample in samples:  # one by one: the stream's order is the publishing order
            await js.publish(sample.subject, sample.to_json())
        began = time.monotonic()
        while len(seen) < len(samples) and time.monotonic() - began < 30:
            await asyncio.sleep(0.02)
        took = time.monotonic() - began
    finally:
        await reader.close()
        await nc.close()
    ids = [str(NodeSampled.from_json(body, subject=SAMPLES.as_published(stored)).event_id) for stored, body in seen]
    assert ids == [str(s.event_id) for s in samples]  # each once, in order, none of those before
    assert not before & set(ids)
    assert all(SAMPLES.as_published(stored) == s.subject for (stored, _), s in zip(seen, samples, strict=True))
    # Up to a pace (4 s) for the next ask, then four batches: a pace apart they would take 12 s more;
    # each EOB said more waited, so each next batch was asked for at once.
    assert took < 8.0, f"the backlog took {took:.1f}s"


async def test_a_paced_reader_behind_asks_for_several_batches_at_once(nats_settings, js):
    """Far behind, each ask takes up to BACKLOG_BATCHES batches: a quarter of the round trips,
    each an idle wait on a busy machine. Every message still comes once, in order."""
    watcher = await nats.connect(nats_settings.url)
    asked: list[int] = []

    async def on_ask(msg) -> None:
        asked.append(json.loads(msg.data)["batch"])

    await watcher.subscribe(f"$JS.API.DIRECT.GET.{SAMPLES.name}", cb=on_ask)  # a copy of each ask the reader sends
    seen: list[bytes] = []

    async def on_message(stored: str, body: bytes) -> None:
        seen.append(body)

    nc = await nats.connect(nats_settings.url)
    reader = PacedReader(nc, SAMPLES.name, SAMPLES.stored_filter(NodeSampled), on_message, batch=10, every_s=2.0)
    await reader.start()
    try:
        samples = [node_sample(f"node-{i:05d}", event_id=uuid.uuid4()) for i in range(100)]
        for sample in samples:
            await js.publish(sample.subject, sample.to_json())
        began = time.monotonic()
        while len(seen) < len(samples) and time.monotonic() - began < 30:
            await asyncio.sleep(0.02)
    finally:
        await reader.close()
        await nc.close()
        await watcher.close()
    assert [str(NodeSampled.from_json(body).event_id) for body in seen] == [str(s.event_id) for s in samples]
    assert set(asked) <= set(range(10, BACKLOG_BATCHES * 10 + 1)), asked  # never less than one batch, never more than four
    assert max(asked) == BACKLOG_BATCHES * 10 > 10, asked
    assert len(asked) < 1 + 10, asked  # fewer than the first ask (empty) and one for each of ten batches
