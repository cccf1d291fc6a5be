"""The thin path through the real parts: a simulated node reports a zombie over a real
nats-server -> zombie-detector opens an incident -> remediator kills the process over real SSH
(host key verified) -> the next samples show the GPU free -> the incident resolves ->
report-builder stores the timeline and the trace, which is one trace with the expected shape."""

from __future__ import annotations

import asyncio

from faststream import FastStream

from gpumedic_bus import NatsSettings
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, Kinds, Step, ZombiePolicy
from gpumedic_store import create_engine, session_factory, views
from remediator.main import create_app as remediator_app
from remediator.settings import Settings as RemediatorSettings
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from zombie_detector.main import create_app as detector_app
from zombie_detector.settings import Settings as DetectorSettings

TEST_POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    kinds=Kinds(
        zombie_job=ZombiePolicy(
            idle_for_s=1.0, action_timeout_s=30.0, ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=5.0),)
        )
    ),
)
"""Seconds instead of the runbooks' minutes: a zombie after 1 s idle, no fleet hold."""


def detector(nats: NatsSettings, policy: Policy = TEST_POLICY) -> FastStream:
    """zombie-detector as deployed, with the test's policy."""
    return detector_app(DetectorSettings(nats=nats, trace_to_bus=True), policy=policy)


def remediator_settings(nats: NatsSettings, store_url: str, fleet) -> RemediatorSettings:
    return RemediatorSettings(
        nats=nats, store={"url": store_url}, mode="enforce", trace_to_bus=True,
        inventory=fleet.inventory_path, known_hosts=fleet.known_hosts_path, client_key=fleet.client_key_path,
    )


async def wait_for_incident(store_url: str, status: str, timeout_s: float = 45.0):
    engine = create_engine(store_url)
    sessions = session_factory(engine)
    try:
        for _ in range(int(timeout_s / 0.25)):
            async with sessions() as session:
                rows = await views.list_incidents(session, where=views.IncidentFilter(status=status))
                if rows:
                    incident = rows[0]
                    timeline = await views.incident_timeline(session, incident_id=incident.id)
                    spans = await views.trace_spans(session, trace_id=incident.trace_id) if incident.trace_id else []
                    names = {s.name for s in spans}
                    records = sum(1 for s in spans if s.name == "record")
                    if {"detect", "decide", "act", "verify"} <= names and records >= len(timeline) >= 4:
                        return incident, timeline, spans
            await asyncio.sleep(0.25)
    finally:
        await engine.dispose()
    raise AssertionError(f"no {status} incident with its whole trace within {timeout_s}s")


async def test_zombie_is_found_killed_over_ssh_verified_and_recorded_in_one_trace(nats_settings, store_url, fleet, sampling, apps):
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, trace_to_bus=True)))
    await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    await apps.start(detector(nats_settings))

    node = fleet.node("sim-node-02")
    hung = node.inject_zombie(0)
    healthy = fleet.node("sim-node-01")

    incident, timeline, spans = await wait_for_incident(store_url, "resolved")

    # The right process died, over SSH, once; the healthy node was never touched.
    assert node.ssh_commands.count(f"kill -s TERM {hung.pid}") == 1
    assert node.process(hung.pid) is None or not node.process(hung.pid).alive
    assert healthy.ssh_commands == []
    assert (incident.node_id, incident.gpu_index, incident.resolution) == ("sim-node-02", 0, "fixed")

    assert [e.event_type for e in timeline] == ["IncidentOpened", "ActionRequested", "ActionCompleted", "IncidentResolved"]
    assert "succeeded" in timeline[2].summary

    # One trace: detect -> decide -> act -> verify, each event recorded inside it.
    assert {s.trace_id for s in spans} == {incident.trace_id}
    by_name = {}
    for span in spans:
        by_name.setdefault(span.name, []).append(span)
    (detect,), (decide,), (act,), (verify,) = (by_name[n] for n in ("detect", "decide", "act", "verify"))
    assert detect.parent_span_id is None and detect.service == "zombie-detector"
    assert decide.parent_span_id == detect.span_id
    assert act.parent_span_id == decide.span_id and act.service == "remediator"
    assert verify.parent_span_id == act.span_id and verify.service == "zombie-detector"
    records = by_name["record"]
    assert len(records) == 4 and {r.service for r in records} == {"report-builder"}
    assert {r.parent_span_id for r in records} == {detect.span_id, decide.span_id, act.span_id, verify.span_id}


async def _count(store_url: str, table) -> int:
    from sqlalchemy import func, select

    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            return (await session.execute(select(func.count()).select_from(table))).scalar_one()
    finally:
        await engine.dispose()


async def test_two_instances_of_each_service_fix_each_zombie_once_and_a_standby_takes_over(
    nats_settings, store_url, fleet, sampling, apps
):
    """report-builder and the remediator: two active instances sharing the work. zombie-detector:
    one active, one standing by on the lease, which takes over when the active one stops."""
    from gpumedic_store.models import ActionRecord, Incident, TimelineEntry

    for _ in range(2):
        await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, trace_to_bus=True)))
        await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    active = await apps.start(detector(nats_settings))
    standby = detector(nats_settings)
    apps.adopt(standby, asyncio.create_task(standby.run()))
    await asyncio.sleep(1.5)
    assert active.runtime.lease.held and not standby.runtime.ready.is_set()  # it waits on the lease

    first = fleet.node("sim-node-02")
    hung = first.inject_zombie(0)
    incident, timeline, _ = await wait_for_incident(store_url, "resolved")
    assert first.ssh_commands.count(f"kill -s TERM {hung.pid}") == 1
    assert [e.event_type for e in timeline] == ["IncidentOpened", "ActionRequested", "ActionCompleted", "IncidentResolved"]

    # The active detector stops; the standby takes over at once and fixes the next zombie.
    active.exit()
    await asyncio.wait_for(standby.runtime.ready.wait(), 10)
    second = first  # the same node again: a second node would trip the breaker of this 2-node fleet
    hung_too = second.inject_zombie(0)
    for _ in range(160):
        if await _count(store_url, Incident) == 2 and await _count(store_url, TimelineEntry) >= 8:
            break
        await asyncio.sleep(0.25)
    await asyncio.sleep(2)  # anything doubled would arrive by now
    assert second.ssh_commands.count(f"kill -s TERM {hung_too.pid}") == 1
    # no double incident, action or row, with every service running twice
    assert await _count(store_url, Incident) == 2
    assert await _count(store_url, ActionRecord) == 2
    assert await _count(store_url, TimelineEntry) == 8
    assert sum(cmd.startswith("kill ") for n in fleet.nodes.values() for cmd in n.ssh_commands) == 2
