"""The samples stream's partitions against a real nats-server: the partition it stores each node
under is the one `partition_of` computes, a consumer of one partition gets exactly its nodes, each
in order, and provisioning gives a stream made before partitions its transform in place."""

from __future__ import annotations

import dataclasses

import pytest
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from gpumedic_bus import NatsSettings, provision
from gpumedic_bus.streams import PARTITIONS, SAMPLES, partition_of
from gpumedic_events import NodeSampled

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
    assert transform is not None and f"partition({PARTITIONS},1)" in transform.dest
    await _publish(js, ["after-provision"])
    last = await js.get_last_msg(SAMPLES.name, SAMPLES.stored_subject(NodeSampled, "after-provision"))
    assert last.subject.endswith(f".{partition_of('after-provision')}")


@pytest.mark.parametrize("bad", [-1, PARTITIONS])
def test_a_partition_out_of_range_is_refused_saying_which(bad):
    with pytest.raises(ValueError, match=rf"{SAMPLES.name} has no partition {bad}"):
        SAMPLES.partition_filter(NodeSampled, bad)
