"""A detector interrupted in the middle of opening an incident, on a real nats-server: one that
stopped between saving the incident and publishing its events publishes them once when it
resumes (the saved IncidentOpened and ActionRequested, with their own ids); one whose bus stopped
answering between the announcement and the action request waits it out, and the fault stays one
incident, while its samples go on being handled (the stuck publish holds no lock they need). A
decider restarted after a close knows of it from the bucket, which forgets the close an hour on."""

from __future__ import annotations

import asyncio
import dataclasses
import time
import uuid
from datetime import UTC, datetime

from gpumedic_bus import NatsSettings, ServiceRuntime
from gpumedic_bus.streams import ACTIONS, INCIDENT_STATE
from gpumedic_events import (
    ActionCompleted, ActionRequested, GpuProcess, GpuSample, IncidentKind, IncidentOpened, JobsObservation, NodeFindings, NodeSampled,
    ServiceHeartbeat,
)
from gpumedic_events.base import json_examples
from gpumedic_incidents import Finding, Policy, store
from gpumedic_incidents.policy import FleetPolicy, Kinds, ZombiePolicy
from gpumedic_incidents.store import IncidentStates, state_key
from gpumedic_incidents.state import IncidentState, Unpublished
from tests.e2e.test_thin_path import detector
from zombie_detector.handlers import DetectorHandlers
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules import decider_rules
from zombie_detector.wire import wire


async def test_a_saved_but_unpublished_transition_is_published_once_on_resume(nats_settings, js, apps):
    example = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])
    opened = example.model_copy(update={"event_id": uuid.uuid4(), "incident_id": uuid.uuid4()})
    request = ActionRequested.model_validate(json_examples(ActionRequested)[0]).model_copy(
        update={"event_id": uuid.uuid4(), "action_id": uuid.uuid4(), "incident_id": opened.incident_id, "node_id": opened.node_id})
    now = datetime.now(UTC)
    states = await IncidentStates.open(js)
    saved = IncidentState(
        incident_id=opened.incident_id, kind=opened.kind, detector="zombie-detector", node_id=opened.node_id,
        gpu_index=opened.gpu_index, opened_at=now, last_seen_at=now, phase="acting",
        outbox=tuple(Unpublished(event=type(e).__name__, body=e.to_json().decode()) for e in (opened, request)),
    )
    await states.save(saved)
    announced: list[IncidentOpened] = []
    requested: list[ActionRequested] = []
    subs = [await js.subscribe(t.subject_filter(), cb=_collect(t, seen), ordered_consumer=True)
            for t, seen in ((IncidentOpened, announced), (ActionRequested, requested))]
    await apps.start(detector(nats_settings))
    for _ in range(40):
        if announced and requested:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(0.5)  # a second one would arrive by now
    for sub in subs:
        await sub.unsubscribe()

    assert [(e.event_id, e.incident_id) for e in announced] == [(opened.event_id, opened.incident_id)]
    assert [r.action_id for r in requested] == [request.action_id]  # the action the incident waits for is asked for
    resumed = await states.get(saved.fingerprint)
    assert resumed is not None and resumed.incident_id == saved.incident_id and resumed.outbox == ()


async def test_a_stream_that_stops_answering_between_announcement_and_request_gives_one_incident(
        nats_settings, js, fleet, sampling, apps):
    """The bus goes away after the IncidentOpened is stored and before the ActionRequested is: the
    detector waits it out (the same ids, so stored once) instead of failing the transition, which
    made the next sample open the same fault as a second incident."""
    opened: list[IncidentOpened] = []
    requested: list[ActionRequested] = []
    for event_type, seen in ((IncidentOpened, opened), (ActionRequested, requested)):
        await js.subscribe(event_type.subject_filter(), cb=_collect(event_type, seen), ordered_consumer=True)
    beats: list[tuple[float, ServiceHeartbeat]] = []

    async def on_beat(msg) -> None:
        beat = ServiceHeartbeat.from_json(msg.data, subject=msg.subject)
        if beat.service == "zombie-detector":
            beats.append((asyncio.get_running_loop().time(), beat))

    await js._nc.subscribe(ServiceHeartbeat.subject_filter(), cb=on_beat)
    full = ACTIONS.config()
    # No stream takes requests for now: a publish gets "no response from stream", as during an election.
    await js.update_stream(dataclasses.replace(full, subjects=[ActionCompleted.subject_filter()]))
    await apps.start(detector(nats_settings))
    fleet.node("sim-node-02").inject_zombie(0)
    for _ in range(100):
        if opened:
            break
        await asyncio.sleep(0.1)
    assert opened and not requested
    stuck_since = asyncio.get_running_loop().time()
    await asyncio.sleep(7.0)  # samples keep coming meanwhile: none may open it again
    assert not requested
    # The publish is still stuck, yet the samples are handled as they come: a heartbeat 2 s or
    # more into it says the samples consumer is not behind (it fell 7 s behind when the
    # publish held the lock that sample handling needs).
    late = [b for at, b in beats if at >= stuck_since + 2.0]
    assert late, "no heartbeat of zombie-detector while its publish was stuck"
    lags = [lag for b in late for lag in b.lag if lag.durable == "zombie-detector-samples"]
    assert lags and all(lag.behind_s < 2.0 for lag in lags), lags
    await js.update_stream(full)  # the stream answers again
    for _ in range(100):
        if requested:
            break
        await asyncio.sleep(0.1)
    await asyncio.sleep(1.0)
    assert len({e.incident_id for e in opened}) == 1, opened
    assert [r.incident_id for r in requested] == [opened[0].incident_id]


def _collect(event_type, into: list):
    async def on_message(msg) -> None:
        into.append(event_type.from_json(msg.data, subject=msg.subject))

    return on_message


async def test_a_zombie_streak_outlives_the_detector_that_began_it(nats_settings, js, apps):
    """The active detector stops six seconds into a GPU's twelve idle ones; the next instance takes
    its rules' memory back and opens the zombie at twelve seconds from the start, not twelve after it."""
    policy = Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(zombie_job=ZombiePolicy(idle_for_s=12.0)))
    example = NodeSampled.model_validate(json_examples(NodeSampled)[0])
    hung = example.model_copy(update={
        "node_id": "resumed-01", "interval_s": 1.0, "jobs": JobsObservation(running=1, output_growing=False),
        "gpus": (GpuSample(index=0, utilization_gpu_pct=0, processes=(GpuProcess(pid=4242, start_ticks=7, command="python train.py"),)),),
    })
    opened: list[IncidentOpened] = []
    await js.subscribe(IncidentOpened.subject_filter(), cb=_collect(IncidentOpened, opened), ordered_consumer=True)

    async def idle_for(seconds: float) -> None:
        for _ in range(int(seconds)):
            await js.publish(hung.subject, hung.model_copy(update={"event_id": uuid.uuid4(), "occurred_at": datetime.now(UTC)}).to_json())
            await asyncio.sleep(1.0)

    first = await apps.start(detector(nats_settings, policy))
    began = time.monotonic()
    await idle_for(6)  # a checkpoint is written at 5 s, and again as it stops
    first.exit()
    await asyncio.sleep(1.0)
    await apps.start(detector(nats_settings, policy))
    while not opened and time.monotonic() - began < 30:
        await idle_for(1)
    assert [e.fingerprint for e in opened] == ["resumed-01/zombie_job/0"]
    found_after_s = time.monotonic() - began
    print(f"zombie found {found_after_s:.1f}s after its first idle sample")
    assert found_after_s < 12 + 6, found_after_s  # a fresh start would need 12 s from its own first sample


async def test_a_restarted_decider_knows_what_the_run_before_it_closed(nats_url, js):
    """A cell that takes over a dead replica's partition reads the samples it left, and may send a
    zombie found in them that was killed and closed meanwhile. A decider restarted in between (the
    dead replica held the lease) reads when each incident closed off the state bucket, where a
    close leaves its mark for an hour: the stale finding opens nothing, one seen after it does."""
    states = await IncidentStates.open(js)
    now = datetime.now(UTC)
    open_one, fixed = (IncidentState(incident_id=uuid.uuid4(), kind=IncidentKind.ZOMBIE_JOB, detector="zombie-detector", node_id=node,
                                     gpu_index=0, opened_at=now, last_seen_at=now, phase="acting") for node in ("sim-node-01", "sim-node-02"))
    for state in (open_one, fixed):
        await states.save(state)
    await asyncio.sleep(0.01)
    before_close = datetime.now(UTC)
    await states.delete(fixed)  # the earlier run closed it: fixed
    policy = Policy(fleet=FleetPolicy(hold_s=0))
    decider = DetectorHandlers(ServiceRuntime("zombie-detector", NatsSettings(url=nats_url)), NodeIncidents(policy, decider_rules(policy)))
    await decider.restore(states)
    assert set(decider.logic.book.incidents) == {open_one.fingerprint}

    def found(observed_at: datetime) -> NodeFindings:
        zombie = Finding(IncidentKind.ZOMBIE_JOB, "sim-node-02", 0, summary="GPU 0 idle with a process on it")
        return NodeFindings(source="zombie-detector", cell="p00", observed_at=observed_at, findings=(wire(zombie),))

    assert decider.logic.on_findings(found(before_close), datetime.now(UTC)) == []  # older news than the close
    [reopened] = decider.logic.on_findings(found(datetime.now(UTC)), datetime.now(UTC))
    assert reopened.after is not None and reopened.after.node_id == "sim-node-02" and reopened.after.incident_id != fixed.incident_id


async def test_a_closes_mark_is_forgotten_after_its_time(nats_url, js, monkeypatch):
    """The bucket keeps a closed incident's mark for `CLOSE_KEPT_S` only: it does not grow by every
    fingerprint ever open, and a detector's start reads no more keys than the open incidents and
    the last hour's closes (here a second)."""
    monkeypatch.setattr(store, "CLOSE_KEPT_S", 1.0)
    states = await IncidentStates.open(js)
    now = datetime.now(UTC)
    closed = IncidentState(incident_id=uuid.uuid4(), kind=IncidentKind.ZOMBIE_JOB, detector="zombie-detector", node_id="sim-node-03",
                           gpu_index=1, opened_at=now, last_seen_at=now, phase="acting")
    await states.save(closed)
    await states.delete(closed)
    assert await states.get(closed.fingerprint) is None
    assert list((await states.load(closed_since=now))[1]) == [state_key(closed.fingerprint)]
    await asyncio.sleep(2.5)  # the server removes an expired message within a second or so
    assert await states.load(closed_since=now) == ([], {})
    info = await js.stream_info(f"KV_{INCIDENT_STATE.bucket}")
    assert info.state.messages == 0
