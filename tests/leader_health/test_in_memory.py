"""leader-health as deployed (`create_app`), its handlers on the in-memory bus (tests/fixtures/memory.py):
its check loop probes the runbooks' daemons over real HTTP on loopback, and what it decides goes
out on the in-memory streams; a node's word on its accept queue comes in through its pull consumer."""

from __future__ import annotations

import asyncio

from gpumedic_bus import NatsSettings
from gpumedic_bus.streams import NODE_EVENTS
from gpumedic_events import ActionRequested, HttpAdmin, IncidentKind, IncidentOpened, ListenBacklogReported, MessageRejected
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import Actions, AdminEndpoint, AdminPolicy, FleetPolicy, Kinds, NoLeaderPolicy, Step
from leader_health.main import create_app
from leader_health.settings import Settings
from tests.fixtures.memory import MemoryBus
from tests.leader_health.runbook_daemon import ANSWERING

POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    actions=Actions(http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url="http://127.0.0.1:8770/force_election")})),
    kinds=Kinds(no_leader=NoLeaderPolicy(grace_s=1.0, ladder=(Step(action="http_admin"),))),
)


async def test_a_cluster_with_quorum_and_no_leader_gets_one_incident_and_an_election_asked_of_an_answering_voter(cluster):
    c, urls = cluster
    await c.state(ANSWERING, leader=None, voters_alive=6)
    settings = Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), cluster="selfplay", peers=urls, interval_s=0.3,
                        connect_timeout_s=5.0, http_timeout_s=6.0)
    app = create_app(settings, policy=POLICY)
    async with MemoryBus(app, loops=True) as bus:
        for _ in range(200):
            if any(e.kind is IncidentKind.NO_LEADER for e in bus.of(IncidentOpened)) and bus.of(ActionRequested):
                break
            await asyncio.sleep(0.05)
        (opened,) = [e for e in bus.of(IncidentOpened) if e.kind is IncidentKind.NO_LEADER]
        assert "Voters 6/8 (quorum OK)" in opened.summary
        (asked,) = [e for e in bus.of(ActionRequested) if e.incident_id == opened.incident_id]
        assert asked.operation == HttpAdmin(endpoint="force_election")
        assert asked.node_id in {"hetzner-cpu1", "hetzner-cpu2", "nebius-h100-3", "vultr-a100-20gb"}


async def test_a_nodes_accept_queue_is_taken_through_its_consumer_and_a_broken_one_dead_lettered():
    app = create_app(Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), cluster="selfplay"), policy=POLICY)
    async with MemoryBus(app) as bus:
        await bus.publish(ListenBacklogReported(source="node-sampler", node_id="lambda-gh200-2", port=8770, waiting=30, limit=32))
        await bus.publish_raw("gpumedic.v1.node.listen_backlog.lambda-gh200-2", b'{"waiting": -1}', stream=NODE_EVENTS.name)
        (rejected,) = bus.of(MessageRejected)
        assert rejected.service == "leader-health" and rejected.original_subject.endswith(".lambda-gh200-2")
        handled = {s.labels["outcome"]: s.value for s in app.runtime.metrics.handled.collect()[0].samples
                   if s.name.endswith("_total") and s.labels["event"] == "ListenBacklogReported"}
        assert handled == {"ok": 1, "invalid": 1, "retried": 0, "failed": 0}
