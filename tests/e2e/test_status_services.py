"""leader-health and autoscaler on the real bus, watching a simulated fleet: each publishes its
status events, and a node whose status endpoint hangs (TCP accepted, HTTP never answers) is
counted as not answering."""

from __future__ import annotations


import uuid
from datetime import UTC, datetime, timedelta

from autoscaler.main import create_app as autoscaler_app
from autoscaler.settings import Settings as AutoscalerSettings
from gpumedic_events import (
    ActionRequested, CapacityEvaluated, ClusterChecked, DrainNode, IncidentKind, IncidentOpened, NodeDrained, NodeUndrained,
)
from leader_health.main import create_app as leader_app
from leader_health.settings import Settings as LeaderSettings


async def _next(js, event_type, predicate, timeout_s=20.0):
    sub = await js.subscribe(event_type.subject_filter(), ordered_consumer=True)
    try:
        for _ in range(200):
            msg = await sub.next_msg(timeout=timeout_s)
            event = event_type.from_json(msg.data, subject=msg.subject)
            if predicate(event):
                return event
    finally:
        await sub.unsubscribe()
    raise AssertionError(f"no matching {event_type.__name__}")


async def test_status_services_publish_what_they_see(nats_settings, js, fleet, sampling, apps):
    peers = [n.status_url for n in fleet.nodes.values()]
    await apps.start(leader_app(LeaderSettings(nats=nats_settings, cluster="sim", peers=peers, interval_s=0.3, connect_timeout_s=2.0, http_timeout_s=2.0)))
    await apps.start(autoscaler_app(AutoscalerSettings(nats=nats_settings, interval_s=0.3)))

    healthy = await _next(js, ClusterChecked, lambda e: e.peers_answering == 2)
    assert healthy.healthy and healthy.leader == "sim-node-01" and healthy.cluster == "sim"

    fleet.node("sim-node-02").inject_status_blocked()
    # Quorum is the voters' as the daemons count them: sim-node-01 counts its blocked peer alive
    # until the membership's delay for the pair has passed, and then has 1 of 2 voters.
    degraded = await _next(js, ClusterChecked, lambda e: e.peers_answering == 1 and not e.healthy)
    assert degraded.peers_total == 2 and "quorum lost: Voters 1/2 (quorum LOST)" in degraded.summary, degraded.summary
    (blocked,) = degraded.problems  # the port accepts TCP, HTTP never answers: told apart from a dead daemon
    assert blocked.state == "blocked" and blocked.url == fleet.node("sim-node-02").status_url

    capacity = await _next(js, CapacityEvaluated, lambda e: e.nodes_seen == 2)
    assert capacity.gpus_total == 2 and capacity.gpus_busy == 2 and capacity.decision == "scale_up"


async def test_the_autoscaler_counts_no_drained_node_as_capacity_and_learns_drains_made_before_it_started(
    nats_settings, js, fleet, sampling, apps
):
    def fact(kind, node):
        return kind(source="remediator", node_id=node, incident_id=uuid.uuid4(), action_id=uuid.uuid4(), reason="gpu_xid")

    for event in (fact(NodeDrained, "sim-node-01"), fact(NodeDrained, "sim-node-02"), fact(NodeUndrained, "sim-node-02")):
        await js.publish(event.subject, event.to_json())  # as the remediator did, before the autoscaler ran
    await apps.start(autoscaler_app(AutoscalerSettings(nats=nats_settings, interval_s=0.3)))
    before = await _next(js, CapacityEvaluated, lambda e: e.nodes_seen == 2)
    assert (before.nodes_drained, before.gpus_total) == (1, 1) and "1 drained node(s) not counted" in before.reason
    undrained = fact(NodeUndrained, "sim-node-01")
    await js.publish(undrained.subject, undrained.to_json())
    after = await _next(js, CapacityEvaluated, lambda e: e.nodes_drained == 0 and e.nodes_seen == 2)
    assert after.gpus_total == 2



async def test_the_autoscaler_counts_incidents_opened_before_it_started_and_drains_a_node_whose_fix_does_not_hold(
    nats_settings, js, fleet, sampling, apps
):
    """Three zombie jobs on one node within the hour, two of them before the autoscaler ran (read
    back from the incident stream) and one after: a repeat offender, and the node's drain asked for."""
    def opened(minutes_ago):
        return IncidentOpened(source="zombie-detector", occurred_at=datetime.now(UTC) - timedelta(minutes=minutes_ago),
                              incident_id=uuid.uuid4(), node_id="sim-node-01", kind=IncidentKind.ZOMBIE_JOB, gpu_index=0,
                              fingerprint="sim-node-01/zombie_job/0", summary="a zombie job")

    for event in (opened(40), opened(20)):
        await js.publish(event.subject, event.to_json())
    await apps.start(autoscaler_app(AutoscalerSettings(nats=nats_settings, interval_s=0.3)))
    await _next(js, CapacityEvaluated, lambda e: e.nodes_seen == 2)
    third = opened(0)
    await js.publish(third.subject, third.to_json())
    offender = await _next(js, IncidentOpened, lambda e: e.kind is IncidentKind.REPEAT_OFFENDER)
    assert offender.node_id == "sim-node-01" and offender.source == "autoscaler" and offender.evidence["count"] == 3
    drain = await _next(js, ActionRequested, lambda e: e.incident_id == offender.incident_id)
    assert drain.operation == DrainNode() and drain.node_id == "sim-node-01"
