"""Every NATS user the topology declares, against every other service's streams, consumers and
buckets: each JetStream API verb is refused by the server (what `gpumedic init` writes, on a real
nats-server with TLS). An intruder with one service's login could delete another's durable
consumer (an XID then opened nothing, and nothing said so) or write another detector's incident
state (and get a busy job killed); neither reaches the server's JetStream now."""

from __future__ import annotations

import asyncio

import pytest

from gpumedic_bus.streams import INCIDENT_STATE, KV_BUCKETS, LEASES, RULE_MEMORY, STREAMS
from gpumedic_bus.topology import (
    DURABLES, LAUNCHER, OBSERVER, OBSERVER_STREAMS, OPENS, OPERATOR, SERVICES, SHARED_LOOPS, node_user, owner_of,
)
from gpumedic_events import IncidentKind
from tests.fixtures.nats import SECURED_NODE, as_user

USERS = (*SERVICES[1:], node_user(SECURED_NODE), OPERATOR, LAUNCHER)
"""Every control-plane login but the admin's (which provisions); the observer's account is its own."""

_STREAM_VERBS = ("CREATE", "UPDATE", "DELETE", "PURGE", "MSG.DELETE", "SNAPSHOT", "RESTORE", "LEADER.STEPDOWN", "PEER.REMOVE")


def _foreign_calls(user: str) -> dict[str, str]:
    """What `user` must never do, by subject: managing any stream or bucket, making consumers of its
    own choosing, and touching another service's consumers, acks, leases or incident state."""
    calls: dict[str, str] = {}
    streams = [s.name for s in STREAMS] + [f"KV_{b.bucket}" for b in KV_BUCKETS]
    for stream in streams:
        for verb in _STREAM_VERBS:
            calls[f"$JS.API.STREAM.{verb}.{stream}"] = f"{verb.lower()} stream {stream}"
        calls[f"$JS.API.CONSUMER.CREATE.{stream}"] = f"an unnamed consumer on {stream}"
        calls[f"$JS.API.CONSUMER.CREATE.{stream}.spy"] = f"a consumer of its own on {stream}"
        calls[f"$JS.API.CONSUMER.CREATE.{stream}.spy.gpumedic.v1.>"] = f"a filtered consumer of its own on {stream}"
        calls[f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.spy"] = f"a durable of its own on {stream}"
        calls[f"$JS.API.CONSUMER.NAMES.{stream}"] = f"listing {stream}'s consumers"
    for item in DURABLES:
        if item.service == user:
            continue
        where = f"{item.service}'s {item.name}"
        api = f"$JS.API.CONSUMER.%s.{item.stream}.{item.name}"
        calls[api % "CREATE"] = f"replacing {where}"
        calls[f"{api % 'CREATE'}.{item.event.subject_filter()}"] = f"replacing {where} (filtered form)"
        calls[f"$JS.API.CONSUMER.DURABLE.CREATE.{item.stream}.{item.name}"] = f"replacing {where} (durable form)"
        calls[api % "DELETE"] = f"deleting {where}"
        calls[api % "INFO"] = f"looking up {where}"
        calls[api % "MSG.NEXT"] = f"reading {where}"
        calls[api % "LEADER.STEPDOWN"] = f"moving {where}'s leader"
        calls[f"$JS.ACK.{item.stream}.{item.name}.1.1.1.1700000000000000000.0"] = f"acking {where}"
    for kind in IncidentKind:
        if kind is not IncidentKind.FLEET_ANOMALY and owner_of(kind) != user:
            calls[f"$KV.{INCIDENT_STATE.bucket}.some-node.{kind.value}.0"] = f"writing a {kind.value} incident state"
            calls[f"$KV.{INCIDENT_STATE.bucket}.fleet.fleet_anomaly.node.{kind.value}"] = f"writing the fleet incident of {kind.value}"
    if user != "zombie-detector":
        calls[f"$KV.{RULE_MEMORY.bucket}.zombie-detector.p00"] = "writing what zombie-detector's rules remember"
    for service in SERVICES:
        if service != user:
            calls[f"$KV.{LEASES.bucket}.{service}"] = f"taking {service}'s lease"
            for work in SHARED_LOOPS.get(service, ()):
                calls[f"$KV.{LEASES.bucket}.{service}.{work}.p00"] = f"taking a partition of {service}'s {work}"
                calls[f"$KV.{LEASES.bucket}.{service}.{work}.member.spy"] = f"posing as an instance of {service}'s {work}"
    return calls


@pytest.mark.parametrize("user", (*USERS, OBSERVER))
async def test_no_user_reaches_another_services_streams_consumers_or_buckets(secured, user):
    nc, refusals = await as_user(secured, user)
    calls = _foreign_calls(user)
    if user == OBSERVER:  # in its own account, what it may keep is its own (tests/e2e/test_nats_permissions)
        calls = {s: what for s, what in calls.items() if not any(f".{name}" in s for name in OBSERVER_STREAMS)}
    try:
        for subject in calls:
            await nc.publish(subject, b"{}")
        await nc.flush()
        for _ in range(250):  # every refusal comes back as its own error
            if len(refusals.errors) >= len(calls):
                break
            await asyncio.sleep(0.02)
        allowed = [f"{what} ({subject})" for subject, what in calls.items() if f'publish to "{subject.lower()}"' not in refusals.errors_text()]
        assert not allowed, f"{user} may still: " + "; ".join(allowed[:10])
    finally:
        await nc.close()


def test_every_kind_has_exactly_one_detector_that_may_write_it():
    """A kind no detector owns could never be stored: its detector's NATS user would be refused."""
    owners = {kind: [d for d, kinds in OPENS.items() if kind in kinds] for kind in IncidentKind if kind is not IncidentKind.FLEET_ANOMALY}
    assert {kind.value: who for kind, who in owners.items() if len(who) != 1} == {}


@pytest.mark.parametrize("detector", sorted(OPENS))
async def test_a_detector_writes_the_incident_state_of_its_own_kinds_only(secured, detector):
    nc, refusals = await as_user(secured, detector)
    try:
        kv = await nc.jetstream(timeout=2).key_value(INCIDENT_STATE.bucket)
        own = OPENS[detector][0].value
        await kv.put(f"some-node.{own}.0", b"{}")  # its own kind: stored
        await kv.put(f"fleet.fleet_anomaly.node.{own}", b"{}")
        assert not refusals.errors
        foreign = next(k for k in IncidentKind if k is not IncidentKind.FLEET_ANOMALY and owner_of(k) != detector)
        with pytest.raises(Exception):  # the server never stores it, so no acknowledgement comes
            await kv.put(f"sim-node-02.{foreign.value}.1", b"{}")
        assert await refusals.refused(f'publish to "$kv.{INCIDENT_STATE.bucket.lower()}.sim-node-02.{foreign.value}.1"')
    finally:
        await nc.close()


async def test_a_node_publishes_spans_on_its_own_subject_only(secured):
    """Every node login could publish the shared `...spans.node-sampler` and so add spans to any trace
    it knew the id of, in any node's name; now each node has a span subject of its own."""
    from gpumedic_events import SpansExported

    nc, refusals = await as_user(secured, node_user(SECURED_NODE))
    try:
        own = SpansExported.subject_for(node_user(SECURED_NODE))
        for subject in (SpansExported.subject_for("node-sampler"), SpansExported.subject_for(node_user("sim-node-02")),
                        SpansExported.subject_for("remediator")):
            await nc.publish(subject, b"{}")
            assert await refusals.refused(f'publish to "{subject}"'), subject
        before = len(refusals.errors)
        await nc.publish(own, b"{}")
        await nc.flush()
        await asyncio.sleep(0.3)
        assert len(refusals.errors) == before, refusals.errors_text()
    finally:
        await nc.close()
