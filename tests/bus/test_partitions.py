"""The partitioned streams (samples, node events) against a real nats-server: the partition it
stores each node under is the one `partition_of` computes, a consumer of one partition gets exactly
its nodes, each in order, and provisioning gives a stream made before partitions its transform in
place, with what it stored before still read by its consumers and replays."""

from __future__ import annotations

import asyncio
import dataclasses
from pathlib import Path

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gpumedic_bus import NatsSettings, ServiceRuntime, provision
from gpumedic_bus.streams import NODE_EVENTS, PARTITIONS, SAMPLES, partition_of
from gpumedic_bus.topology import DURABLES
from gpumedic_events import GpuXidReported, NodeDrained, NodeSampled

EXAMPLES = Path(__file__).parents[2] / "proto" / "examples"

NODES = [f"gpu-node-{i:04d}" for i in range(400)] + ["a", "node_1", "x-y-z", "N0DE-UPPER", "ip-10-0-3-17"]


async def _publish(js, nodes: list[str], rounds: int = 1) -> None:
    for n in range(rounds):
        for node in nodes:
            await js.publish(NodeSampled.subject_for(node), f"{node} {n}".encode(), stream=SAMPLES.name)


async def test_the_server_stores_each_node_under_the_partition_we_compute(js):
    await _publish(js, NODES)
    first = (await js.stream_info(SAMPLES.name)).state.first_seq
    for i, node in enumerate(NODES):
        stored = await js.get_msg(SAMPLES.name, seq=first + i)
        assert stored.subject == f"{NodeSampled.subject_for(node)}.{partition_of(node)}"
        assert SAMPLES.as_published(stored.subject) == NodeSampled.subject_for(node)
    assert {partition_of(n) for n in NODES} == set(range(PARTITIONS))  # 405 ids reach every partition


async def test_a_consumer_of_one_partition_gets_its_nodes_only_each_in_order(js):
    await _publish(js, NODES, rounds=3)
    mine = [n for n in NODES if partition_of(n) == 3]
    sub = await js.pull_subscribe(SAMPLES.partition_filter(NodeSampled, 3), stream=SAMPLES.name,
                                  config=ConsumerConfig(ack_policy=AckPolicy.NONE, deliver_policy=DeliverPolicy.ALL))
    got: list[bytes] = []
    while len(got) < 3 * len(mine):
        got += [m.data for m in await sub.fetch(256, timeout=2)]
    assert sorted(got) == sorted(f"{node} {n}".encode() for node in mine for n in range(3))
    for node in mine:  # in the order each was published
        assert [g for g in got if g.split()[0] == node.encode()] == [f"{node} {n}".encode() for n in range(3)]
    # and a last-message lookup finds one node's newest, whatever its partition
    last = await js.get_last_msg(SAMPLES.name, SAMPLES.stored_subject(NodeSampled, mine[0]))
    assert last.data == f"{mine[0]} 2".encode()


async def test_provisioning_gives_a_stream_made_before_partitions_its_transform(js, nats_url):
    await js.update_stream(dataclasses.replace(SAMPLES.config(), subject_transform=None))
    assert (await js.stream_info(SAMPLES.name)).config.subject_transform is None
    await provision(js, NatsSettings(url=nats_url))
    transform = (await js.stream_info(SAMPLES.name)).config.subject_transform
    assert transform is not None and f"partition({PARTITIONS},3)" in transform.dest
    await _publish(js, ["after-provision"])
    last = await js.get_last_msg(SAMPLES.name, SAMPLES.stored_subject(NodeSampled, "after-provision"))
    assert last.subject.endswith(f".{partition_of('after-provision')}")


@pytest.mark.parametrize("bad", [-1, PARTITIONS])
def test_a_partition_out_of_range_is_refused_saying_which(bad):
    with pytest.raises(ValueError, match=rf"{SAMPLES.name} has no partition {bad}"):
        SAMPLES.partition_filter(NodeSampled, bad)


def _example(event_type, node: str):
    return event_type.model_validate_json((EXAMPLES / f"{event_type.__name__}.json").read_text()).model_copy(update={"node_id": node})


async def test_node_events_stored_before_partitions_are_still_read_by_consumers_and_replays(js, nats_url, nats_settings):
    # A node-events stream of the release before: no transform, two facts stored under their old subjects.
    await js.update_stream(dataclasses.replace(NODE_EVENTS.config(), subject_transform=None))
    old_xid, old_drain = _example(GpuXidReported, "old-node"), _example(NodeDrained, "old-node")
    for event in (old_xid, old_drain):
        await js.publish(event.subject, event.to_json(), stream=NODE_EVENTS.name)
    await provision(js, NatsSettings(url=nats_url))  # the upgrade: the transform added in place
    new_xid, new_drain = _example(GpuXidReported, "new-node"), _example(NodeDrained, "new-node")
    for event in (new_xid, new_drain):
        await js.publish(event.subject, event.to_json(), stream=NODE_EVENTS.name)
    stored = await js.get_last_msg(NODE_EVENTS.name, NODE_EVENTS.stored_subject(GpuXidReported, "new-node"))
    assert stored.subject == f"{new_xid.subject}.{partition_of('new-node')}"

    # The detector's durable consumer of XIDs reads both, each decoded under the subject it was published on.
    durable = next(d for d in DURABLES if d.name == "zombie-detector-GpuXidReported")
    sub = await js.pull_subscribe_bind(durable.name, durable.stream)
    got = [GpuXidReported.from_json(m.data, subject=durable.published_subject(m.subject)) for m in await sub.fetch(10, timeout=2)]
    assert [e.node_id for e in got] == ["old-node", "new-node"]

    # The autoscaler's replay of the drains (no consumer: one stored message at a time) reads both,
    # then is woken by a drain published after it started.
    runtime = ServiceRuntime("autoscaler", nats_settings)
    drained: list[str] = []

    async def on_drain(event) -> None:
        drained.append(event.node_id)

    runtime.replay((NodeDrained,), on_drain)
    task = asyncio.create_task(runtime.app().run())
    try:
        await asyncio.wait_for(runtime.ready.wait(), 20)
        assert drained == ["old-node", "new-node"]
        late = _example(NodeDrained, "late-node")
        await js.publish(late.subject, late.to_json(), stream=NODE_EVENTS.name)
        for _ in range(500):
            if len(drained) == 3:
                break
            await asyncio.sleep(0.02)
        assert drained[2:] == ["late-node"]
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
