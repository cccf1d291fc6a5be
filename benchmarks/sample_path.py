"""The sample path: node samples (one message per node, 8 GPUs each) drained from the samples
stream by zombie-detector's real consumer (its app from `create_app`: push consumer, validation
into the whole sample as msgspec reads it, the rules, ack) against raw nats-py reading the same
messages from the same server without decoding them. Rounds alternate so both see the same machine load; the
figure is the ratio of the medians. Goal: the detector at least half of raw nats-py. A third
figure is the detector's ceiling for any faster decoder: the same app with each body mapped to
its already-decoded event, so decoding costs nothing and the rules, dispatch and acks remain.
Last, what decoding one sample costs each consumer, against the whole event in pydantic: the views
zombie-detector, report-builder and the autoscaler read (`gpumedic_events.views`), in interleaved
rounds; and what the detector's rules cost a sample alone (its logic fed decoded samples, no bus).

Then a fleet's pace, not a backlog: samples published at `--rate` a second, as 10,000 nodes send
them, and the CPU each message costs a consumer to receive and decode (the autoscaler's view)
through a push subscription, as the sample consumers took them before, against the paced consumer
they use (`gpumedic_bus.PacedConsumer`: a batch asked for every fifth of a second). Each consumer
runs in a thread of its own with its own event loop and connection; its thread's CPU time is the
figure, in interleaved rounds."""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import statistics
import tempfile
import threading
import time
import timeit
from datetime import UTC, datetime, timedelta
from pathlib import Path

import nats
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from benchmarks import HEALTH_EVERY, node_sample
from gpumedic.natsd import NatsServer
from gpumedic_bus import NatsSettings, PacedConsumer, ServiceRuntime, provision
from gpumedic_bus.consume import PACED_EVERY_S
from gpumedic_bus.streams import SAMPLES
from gpumedic_bus.tasks import stop_tasks
from gpumedic_bus.topology import durable
from gpumedic_events import NodeSampled
from gpumedic_events.views import Sample, SampleFigures, SampleLoad
from gpumedic_incidents import Policy
from zombie_detector.main import create_app
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.settings import Settings

NODES = 200
GPUS = 8


async def _preload(js, count: int) -> int:
    await js.purge_stream(SAMPLES.name)
    bodies = [(s.subject, s.to_json()) for s in (node_sample(f"node-{n:04d}") for n in range(NODES))]
    health = [(s.subject, s.to_json()) for s in (node_sample(f"node-{n:04d}", health=True) for n in range(NODES))]
    pending = []
    for i in range(count):
        # one of each node's HEALTH_EVERY samples carries its health figures, the nodes out of step
        node, turn = i % NODES, i // NODES
        subject, body = (health if (turn + node) % HEALTH_EVERY == 0 else bodies)[node]
        pending.append(await js.publish_async(subject, body))
        if len(pending) >= 1000:
            await asyncio.gather(*pending)
            pending.clear()
    await asyncio.gather(*pending)
    return len(bodies[0][1])


async def _raw_pull(js, count: int, name: str) -> float:
    sub = await js.pull_subscribe(SAMPLES.stored_filter(NodeSampled), durable=name, stream=SAMPLES.name, config=ConsumerConfig(ack_policy=AckPolicy.NONE))
    seen = 0
    start = time.perf_counter()
    while seen < count:
        seen += len(await sub.fetch(256, timeout=5))
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return count / elapsed


async def _raw_subscribe(js, count: int, *, validate: bool = False) -> float:
    """nats-py's own push subscription; with `validate`, also read each body as the detector does
    (the floor under a consumer that validates what it receives)."""
    done = asyncio.Event()
    seen = 0
    start = 0.0

    async def _on(msg) -> None:
        nonlocal seen, start
        if seen == 0:
            start = time.perf_counter()
        if validate:
            NodeSampled.decode_as(Sample, msg.data, subject=SAMPLES.as_published(msg.subject))
        seen += 1
        if seen >= count:
            done.set()

    sub = await js.subscribe(SAMPLES.stored_filter(NodeSampled), stream=SAMPLES.name, cb=_on, ordered_consumer=True, deliver_policy=DeliverPolicy.ALL, pending_msgs_limit=-1)
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    await sub.unsubscribe()
    return count / elapsed


@contextlib.contextmanager
def _free_decoding():
    """NodeSampled.decode_as answering each subject's first decoded sample again (the preloaded
    stream repeats one sample per node): a decoder that costs nothing."""
    real = NodeSampled.decode_as.__func__  # Event's, which NodeSampled inherits
    decoded: dict[str, object] = {}

    def decode_as(cls, model, data, *, subject: str = ""):
        event = decoded.get(subject)
        if event is None:
            event = decoded[subject] = real(cls, model, data, subject=subject)
        return event

    NodeSampled.decode_as = classmethod(decode_as)
    try:
        yield
    finally:
        del NodeSampled.decode_as  # inherited again


async def _detector(js, url: str, count: int) -> float:
    """Start the detector's app on the preloaded stream; time from its first ack to its last."""
    await provision(js, NatsSettings(url=url))  # a fresh consumer at the stream's start, as provisioned
    app = create_app(Settings(nats=NatsSettings(url=url)))
    runner = asyncio.create_task(app.run())
    first_at = None
    first_floor = 0
    try:
        while True:
            try:
                info = await js.consumer_info(SAMPLES.name, "zombie-detector-samples")
            except Exception:
                await asyncio.sleep(0.01)
                continue
            floor = info.ack_floor.stream_seq or 0
            if floor and first_at is None:
                first_at, first_floor = time.perf_counter(), floor
            if floor >= count:
                return (count - first_floor) / (time.perf_counter() - first_at)
            await asyncio.sleep(0.01)
    finally:
        app.exit()
        await runner
        await js.delete_consumer(SAMPLES.name, "zombie-detector-samples")


def decode_costs(rounds: int, number: int = 2_000) -> dict[str, float]:
    """Microseconds to decode one 8-GPU sample (one in HEALTH_EVERY with health figures, as sent),
    whole in pydantic and through each view; the median of `rounds` interleaved rounds."""
    bodies = [node_sample(f"node-{n:04d}", health=n % HEALTH_EVERY == 0).to_json() for n in range(HEALTH_EVERY)]
    readers = {"NodeSampled (pydantic, whole)": NodeSampled, "Sample (zombie-detector)": Sample,
               "SampleFigures (report-builder)": SampleFigures, "SampleLoad (autoscaler)": SampleLoad}
    took: dict[str, list[float]] = {name: [] for name in readers}
    for _ in range(rounds):
        for name, model in readers.items():
            each = iter(bodies * (number // len(bodies) + 1))
            took[name].append(timeit.timeit(lambda model=model: NodeSampled.decode_as(model, next(each)), number=number) / number * 1e6)
    return {name: statistics.median(values) for name, values in took.items()}


def rules_cost(rounds: int, nodes: int = 2_000, interval_s: float = 5.0) -> float:
    """Microseconds a sample costs the detector's rules and book alone (its shipped policy, every node
    busy as `node_sample` makes it, the per-second tick included), the median of `rounds` rounds of
    two intervals each, after three intervals that let every rule see each node."""
    decoded = [[NodeSampled.decode_as(Sample, node_sample(f"node-{n:04d}", health=health).to_json()) for n in range(nodes)]
               for health in (False, True)]
    logic = NodeIncidents(Policy())
    start = datetime(2026, 1, 1, tzinfo=UTC)

    def intervals(first: int, count: int) -> None:
        for turn in range(first, first + count):
            for n in range(nodes):
                logic.on_event(decoded[(turn + n) % HEALTH_EVERY == 0][n], start + timedelta(seconds=(turn + n / nodes) * interval_s))
            for second in range(int(interval_s)):
                logic.on_tick(start + timedelta(seconds=turn * interval_s + second + 1))

    intervals(0, 3)
    took = []
    for r in range(rounds):
        began = time.perf_counter()
        intervals(3 + 2 * r, 2)
        took.append((time.perf_counter() - began) / (2 * nodes) * 1e6)
    return statistics.median(took)


async def _receive(url: str, paced: bool, warm_s: float, seconds: float) -> float:
    """CPU microseconds of this thread per sample received and decoded (SampleLoad) over `seconds`."""
    seen = 0

    async def count(_sample) -> None:
        nonlocal seen
        seen += 1

    if paced:
        runtime = ServiceRuntime("autoscaler", NatsSettings(url=url))
        consumer = PacedConsumer(runtime.broker, durable("autoscaler-samples"), count, service="autoscaler",
                                 metrics=runtime.metrics, connect=lambda: nats.connect(url), view=SampleLoad)
        await consumer.start()
        stop = consumer.stop
    else:
        nc = await nats.connect(url)

        async def on(msg) -> None:
            await count(NodeSampled.decode_as(SampleLoad, msg.data, subject=SAMPLES.as_published(msg.subject)))

        sub = await nc.jetstream().subscribe(SAMPLES.stored_filter(NodeSampled), stream=SAMPLES.name, cb=on, ordered_consumer=True,
                                             deliver_policy=DeliverPolicy.NEW, pending_msgs_limit=-1)

        async def stop() -> None:
            await sub.unsubscribe()
            await nc.close()

    try:
        await asyncio.sleep(warm_s)
        cpu, first = time.thread_time(), seen
        await asyncio.sleep(seconds)
        return (time.thread_time() - cpu) / max(1, seen - first) * 1e6
    finally:
        await stop()


async def trickle_costs(js, url: str, rate: int, rounds: int, seconds: float) -> dict[str, float]:
    """The median CPU per sample of each way of receiving, samples published at `rate` meanwhile."""
    bodies = [(s.subject, s.to_json()) for s in (node_sample(f"node-{n:05d}") for n in range(1000))]
    took: dict[str, list[float]] = {"push": [], "paced": []}

    async def publish() -> None:
        began, sent = time.perf_counter(), 0
        while True:
            due = began + sent / rate - time.perf_counter()
            if due > 0:
                await asyncio.sleep(due)
            subject, body = bodies[sent % len(bodies)]
            await js.publish(subject, body)
            sent += 1

    publisher = asyncio.create_task(publish())
    try:
        for _ in range(rounds):
            for way in took:
                result: list[float] = []
                thread = threading.Thread(target=lambda way=way: result.append(asyncio.run(_receive(url, way == "paced", 1.0, seconds))))
                thread.start()
                while thread.is_alive():
                    await asyncio.sleep(0.05)  # the publisher goes on meanwhile
                took[way].append(result[0])
    finally:
        # ended before the connection closes, or its last publish says it closed; cancelled again
        # until it ends, since Python 3.11 can swallow a cancel that lands as a publish's ack does
        await stop_tasks([publisher])
    return {way: statistics.median(values) for way, values in took.items()}


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--messages", type=int, default=20_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--rate", type=int, default=2_000, help="samples a second in the paced comparison (10,000 nodes at 5 s)")
    parser.add_argument("--seconds", type=float, default=5.0, help="each paced comparison round's measured time")
    args, _ = parser.parse_known_args(argv)
    import logging

    logging.basicConfig(level=logging.WARNING)
    for noisy in ("faststream", "zombie-detector"):  # start/stop lines would bury the figures
        logging.getLogger(noisy).setLevel(logging.WARNING)
    with tempfile.TemporaryDirectory() as tmp, NatsServer(Path(tmp)) as server:
        nc = await nats.connect(server.url)
        js = nc.jetstream()
        await provision(js, NatsSettings(url=server.url))
        size = await _preload(js, args.messages)
        raw_sub, raw_pull, validated, ours, free = [], [], [], [], []
        for r in range(args.rounds):
            raw_sub.append(await _raw_subscribe(js, args.messages))
            validated.append(await _raw_subscribe(js, args.messages, validate=True))
            raw_pull.append(await _raw_pull(js, args.messages, f"raw-pull-{r}"))
            ours.append(await _detector(js, server.url, args.messages))
            with _free_decoding():
                free.append(await _detector(js, server.url, args.messages))
        await js.purge_stream(SAMPLES.name)
        trickle = await trickle_costs(js, server.url, args.rate, args.rounds, args.seconds)
        await nc.close()
    best_raw = max(statistics.median(raw_sub), statistics.median(raw_pull))
    detector = statistics.median(ours)
    print(f"sample path: {args.messages} NodeSampled messages ({GPUS} GPUs, {size} B each, {NODES} nodes), "
          f"median of {args.rounds} interleaved rounds on one nats-server")
    print(f"  raw nats-py JetStream subscribe (no decode)   {statistics.median(raw_sub):>10,.0f} msg/s")
    print(f"  raw nats-py pull fetch, batch 256 (no decode)  {statistics.median(raw_pull):>10,.0f} msg/s")
    print(f"  raw nats-py subscribe + validation only        {statistics.median(validated):>10,.0f} msg/s")
    print(f"  zombie-detector consumer (validate+detect+ack){detector:>10,.0f} msg/s")
    print(f"  ratio detector / best raw                      {detector / best_raw:>10.2f}   (goal >= 0.50)")
    print(f"  ratio raw + validation / best raw              {statistics.median(validated) / best_raw:>10.2f}   "
          "(the most a consumer that validates each sample could give)")
    print(f"  ratio detector / raw + validation              {detector / statistics.median(validated):>10.2f}   (the cost of the detector beyond validating)")
    print(f"  detector with a decoder that costs nothing    {statistics.median(free):>10,.0f} msg/s")
    print(f"  ratio of that / best raw                       {statistics.median(free) / best_raw:>10.2f}   (the most any faster decoder could give)")
    costs = decode_costs(args.rounds)
    whole = costs["NodeSampled (pydantic, whole)"]
    for name, us in costs.items():
        print(f"  decoding one sample: {name:<31} {us:6.1f} us" + ("" if us == whole else f"   ({us / whole:.2f} of the whole)"))
    print(f"  the detector's rules alone, a sample            {rules_cost(args.rounds):6.1f} us   (its logic fed decoded samples, no bus)")
    print(f"  at {args.rate:,} samples/s, CPU to receive and decode one (autoscaler's view), median of {args.rounds} rounds:")
    print(f"    push subscription, as before                {trickle['push']:6.1f} us")
    print(f"    paced consumer (a batch every {PACED_EVERY_S:g} s)       {trickle['paced']:6.1f} us   "
          f"({trickle['paced'] / trickle['push']:.2f} of push)")
