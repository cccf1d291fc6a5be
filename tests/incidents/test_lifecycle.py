"""The shared incident lifecycle and the book above it, driven directly with plain values."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    KillGpuProcesses,
    Matcher,
    ProcessTarget,
    SilenceAdded,
    SilenceRemoved,
)
from gpumedic_incidents import FLEET_NODE, Finding, IncidentBook, Policy, Transition, cleared
from gpumedic_incidents.book import RECENTLY_CLOSED
from gpumedic_incidents.policy import FleetPolicy, KindPolicy, Kinds, Step, XidPolicy, ZombiePolicy

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
ZOMBIE = IncidentKind.ZOMBIE_JOB
KILL = KillGpuProcesses(gpu_index=0, targets=(ProcessTarget(pid=4242, start_ticks=7, command="python x"),), max_gpu_utilization_pct=5)
POLICY = Policy(
    fleet=FleetPolicy(share=0.3, min_nodes=3, window_s=600, hold_s=15),
    kinds=Kinds(
        zombie_job=ZombiePolicy(ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=30),)),
        # Without their shipped drain ladders: these tests are about kinds a person handles.
        gpu_xid=XidPolicy(clear_after_s=3600),
        gpu_lost=KindPolicy(clear_after_s=600),
    ),
)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def zombie(node="n1", gpu=0, **changes) -> Finding:
    values = {"kind": ZOMBIE, "node_id": node, "gpu_index": gpu, "summary": "idle", "operations": {"kill_gpu_processes": KILL}}
    return Finding(**{**values, **changes})


def run(book: IncidentBook, transitions: list[Transition]) -> list:
    """Commit every transition (as a handler would after publishing) and return their events."""
    events = []
    for t in transitions:
        book.commit(t)
        events += t.events
    return events


def book(policy: Policy = POLICY, nodes: int = 20) -> IncidentBook:
    b = IncidentBook("zombie-detector", policy)
    for i in range(nodes):
        b.saw_node(f"n{i + 1}", T0)
    return b


def test_a_new_incident_is_held_then_requests_the_first_step_with_its_pending_action():
    b = book()
    (opened,) = run(b, b.on_finding(zombie(), at(0)))
    assert isinstance(opened, IncidentOpened) and opened.fingerprint == "n1/zombie_job/0"
    assert b.get("n1/zombie_job/0").phase == "held"
    assert run(b, b.on_tick(at(14))) == []
    (request,) = run(b, b.on_tick(at(15)))
    assert isinstance(request, ActionRequested) and request.attempt == 1 and request.fingerprint == "n1/zombie_job/0"
    state = b.get("n1/zombie_job/0")
    assert state.phase == "acting" and state.pending_action.action_id == request.action_id


def _acting(b: IncidentBook) -> ActionRequested:
    run(b, b.on_finding(zombie(), at(0)))
    (request,) = run(b, b.on_tick(at(15)))
    return request


def _result(request: ActionRequested, outcome=ActionOutcome.SUCCEEDED) -> ActionCompleted:
    return ActionCompleted(
        source="remediator", action_id=request.action_id, incident_id=request.incident_id, node_id=request.node_id,
        attempt=request.attempt, outcome=outcome, detail="done",
    )


def test_fixed_when_the_fault_is_gone_after_the_action():
    b = book()
    request = _acting(b)
    assert run(b, b.on_finding(cleared(ZOMBIE, "n1", 0), at(16))) == []  # acting: the answer comes first
    run(b, b.on_action_completed(_result(request), at(17), None))
    assert b.get("n1/zombie_job/0").phase == "verifying"
    (resolved,) = run(b, b.on_finding(cleared(ZOMBIE, "n1", 0), at(20)))
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"
    assert b.incidents == {}


def test_a_closed_incident_stays_readable_for_a_while_by_when_it_closed():
    b = book()
    request = _acting(b)
    run(b, b.on_action_completed(_result(request), at(17), None))
    for t in b.on_finding(cleared(ZOMBIE, "n1", 0), at(20)):
        b.commit(t, at(20))
    ((closed, closed_at),) = b.closed_on("n1")
    assert (closed.fingerprint, closed.attempt, closed_at) == ("n1/zombie_job/0", 1, at(20)) and b.closed_on("n2") == []
    for t in b.on_finding(zombie("n2"), at(20 + RECENTLY_CLOSED.total_seconds() + 1)):  # a later close lets the old ones go
        b.commit(t)
    (t,) = b.on_finding(cleared(ZOMBIE, "n2", 0), at(20 + RECENTLY_CLOSED.total_seconds() + 1))
    b.commit(t, at(20 + RECENTLY_CLOSED.total_seconds() + 1))
    assert b.closed_on("n1") == [] and [s.node_id for s, _ in b.closed_on("n2")] == ["n2"]


def test_still_there_after_the_verify_window_retries_then_escalates_after_the_ladder():
    b = book()
    first = _acting(b)
    run(b, b.on_action_completed(_result(first, ActionOutcome.FAILED), at(16), None))
    assert run(b, b.on_finding(zombie(), at(40))) == []  # inside the verify window
    (second,) = run(b, b.on_finding(zombie(), at(47)))
    assert isinstance(second, ActionRequested) and second.attempt == 2 and second.action_id != first.action_id
    run(b, b.on_action_completed(_result(second), at(48), None))
    (escalated,) = run(b, b.on_finding(zombie(), at(79)))
    assert isinstance(escalated, IncidentEscalated) and "2 attempt(s) did not fix n1 GPU 0" in escalated.reason
    (resolved,) = run(b, b.on_finding(cleared(ZOMBIE, "n1", 0), at(90)))
    assert resolved.resolution == "cleared"


def test_refused_or_observed_or_unanswered_actions_escalate():
    for outcome, words in ((ActionOutcome.BLOCKED, "refused the action"), (ActionOutcome.OBSERVED, "observe mode")):
        b = book()
        (escalated,) = run(b, b.on_action_completed(_result(_acting(b), outcome), at(16), None))
        assert isinstance(escalated, IncidentEscalated) and words in escalated.reason
    b = book()
    _acting(b)
    assert run(b, b.on_tick(at(15 + 299))) == []
    (late,) = run(b, b.on_tick(at(15 + 301)))
    assert "no answer from the remediator within 300s" in late.reason


def test_a_stale_or_repeated_result_changes_nothing():
    b = book()
    request = _acting(b)
    assert run(b, b.on_action_completed(_result(request).model_copy(update={"attempt": 2}), at(16), None)) == []
    assert len(run(b, b.on_action_completed(_result(request), at(16), None))) == 0  # a state change, no event
    assert b.on_action_completed(_result(request), at(17), None) == []


def test_the_answer_to_a_forgery_under_our_action_id_is_not_taken_for_ours():
    b = book()
    request = _acting(b)
    forged = request.model_copy(update={"node_id": "n2"})  # what the remediator refused, under our id
    assert forged.action_id == request.action_id and forged.request_sha256 != request.request_sha256
    theirs = _result(request, ActionOutcome.BLOCKED).model_copy(update={"request_sha256": forged.request_sha256})
    assert b.on_action_completed(theirs, at(16), None) == []
    ours = _result(request).model_copy(update={"request_sha256": request.request_sha256})
    run(b, b.on_action_completed(ours, at(17), None))
    assert b.get("n1/zombie_job/0").phase == "verifying"


def test_nothing_safe_to_do_escalates_at_once():
    b = book(Policy(fleet=FleetPolicy(hold_s=0)))
    _, escalated = run(b, b.on_finding(zombie(operations={}, unsafe="pid 4242 cannot be identified"), at(0)))
    assert isinstance(escalated, IncidentEscalated) and escalated.reason == "pid 4242 cannot be identified"


def test_a_kind_without_a_ladder_goes_to_a_person_with_the_recommended_action_after_the_fleet_hold():
    b = book()
    finding = Finding(IncidentKind.GPU_LOST, "n3", 2, summary="GPU 2 lost", recommended_action="drain the node")
    (opened,) = run(b, b.on_finding(finding, at(0)))
    assert isinstance(opened, IncidentOpened) and opened.recommended_action == "drain the node"
    assert run(b, b.on_tick(at(14))) == []  # held: were much of the fleet to follow, one page would do for all
    (escalated,) = run(b, b.on_tick(at(15)))
    assert isinstance(escalated, IncidentEscalated) and escalated.reason == "no automatic fix for gpu_lost: drain the node"


def test_a_person_s_kind_on_much_of_the_fleet_at_once_is_one_page_for_the_fleet():
    """Container deaths after a bad rollout, a few per tick: the ones held when the fleet incident
    opens join it and call nobody themselves; only the fleet incident escalates."""
    b = book(nodes=20)
    events = []
    for i in range(7):
        died = Finding(IncidentKind.CONTAINER_DIED, f"n{i + 1}", None, key=f"c{i}", summary="exited 1", occurrence=True)
        events += run(b, b.on_findings([died], at(i)))
    events += [e for s in range(7, 40) for e in run(b, b.on_tick(at(s)))]
    escalated = [e for e in events if isinstance(e, IncidentEscalated)]
    fleet = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert len(fleet) == 1 and len(escalated) == 8  # the fleet incident, and each node's as part of it
    assert all(e.node_id == FLEET_NODE or e.reason == f"part of fleet incident {fleet[0].incident_id}: no node action" for e in escalated)


def test_repeats_count_and_publish_an_update_only_now_and_then():
    b = book()
    xid = Finding(IncidentKind.GPU_XID, "n2", 0, summary="XID 48", occurrence=True)
    run(b, b.on_finding(xid, at(0)))
    updates = [e for s in range(1, 12) for e in run(b, b.on_finding(xid, at(s)))]
    assert [u.occurrences for u in updates if isinstance(u, IncidentUpdated)] == [2, 10]
    assert b.get("n2/gpu_xid/0").occurrences == 12


def test_an_event_reported_incident_clears_after_a_quiet_while():
    b = book()
    run(b, b.on_finding(Finding(IncidentKind.GPU_XID, "n2", 0, occurrence=True), at(0)))
    run(b, b.on_tick(at(15)))  # to a person, after the fleet hold
    assert run(b, b.on_tick(at(3599))) == []
    (resolved,) = run(b, b.on_tick(at(3600)))
    assert resolved.resolution == "cleared" and "not seen again for 3600s" in resolved.summary


def test_a_fault_every_sample_shows_is_seen_and_never_cleared_as_quiet_and_the_state_is_not_rewritten_each_sample():
    # A lost GPU is in every sample (a level finding, no new occurrence): it is not "quiet". Taken
    # for quiet, a drained node's incident went to validation, came back escalated at the next
    # sample, and did so every sample.
    b = book()
    lost = Finding(IncidentKind.GPU_LOST, "n3", 2, summary="GPU 2 lost")
    run(b, b.on_finding(lost, at(0)))
    run(b, b.on_tick(at(4)) + b.on_tick(at(15)))  # to a person, after the fleet hold
    changes, events = 0, []
    for s in range(5, 1800, 5):
        transitions = b.on_finding(lost, at(s)) + b.on_tick(at(s + 1))
        changes += len(transitions)
        events += run(b, transitions)
    assert events == [] and b.get("n3/gpu_lost/2").phase == "escalated"
    assert changes <= 1800 / (600 / 4)  # last seen refreshed now and then, not written once a sample
    # Gone from the samples (no finding at all): quiet from about the last one that showed it
    # (its last refresh, at most a quarter of clear_after_s before).
    cleared_at = next(s for s in range(1800, 3000, 5) if run(b, b.on_tick(at(s))))
    assert 1795 + 600 * 3 / 4 <= cleared_at <= 1795 + 600 and "n3/gpu_lost/2" not in b.incidents


def test_half_the_fleet_at_once_is_one_fleet_incident_and_no_request():
    b = book(nodes=20)
    events = []
    for i in range(10):  # half the fleet within a few seconds
        events += run(b, b.on_finding(zombie(node=f"n{i + 1}"), at(i * 0.5)))
    for s in range(5, 60, 5):
        events += run(b, b.on_tick(at(s)))
    assert not any(isinstance(e, ActionRequested) for e in events)
    fleet = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert len(fleet) == 1 and fleet[0].node_id == FLEET_NODE and "zombie_job on 7 of 20 nodes" in fleet[0].summary
    node_incidents = [i for i in b.incidents.values() if i.kind is ZOMBIE]
    assert len(node_incidents) == 10 and all(i.phase == "escalated" for i in node_incidents)
    assert {i.related_incident_id for i in node_incidents} == {fleet[0].incident_id}
    # The fleet incident closes once no node shows the fault any more.
    for i in range(10):
        run(b, b.on_finding(cleared(ZOMBIE, f"n{i + 1}", 0), at(100)))
    (closed,) = run(b, b.on_tick(at(101)))
    assert isinstance(closed, IncidentResolved) and closed.kind is IncidentKind.FLEET_ANOMALY and b.incidents == {}


def test_a_fleet_incident_names_what_most_of_its_nodes_share_and_not_what_only_some_do():
    """A bad image rolled out to a third of the fleet: its nodes' incidents carry the image they ran,
    and the fleet incident says what changed with the fault, where a person would look first."""
    b = book(nodes=20)
    events = []
    for i in range(7):
        image = "registry.example/selfplay:2026.11" if i == 3 else "registry.example/selfplay:2026.12"
        evidence = {"image": image, "driver_version": f"550.54.{i}", "provider": "runpod", "exit_code": 1}
        events += run(b, b.on_finding(zombie(node=f"n{i + 1}", evidence=evidence), at(i * 0.5)))
    (fleet,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    shared = "image registry.example/selfplay:2026.12 on 6 of 7; provider runpod on 7 of 7"
    assert fleet.summary.endswith(f"; what they share: {shared}"), fleet.summary
    assert fleet.evidence["shared_image"] == "registry.example/selfplay:2026.12" and fleet.evidence["shared_provider"] == "runpod"
    assert "shared_driver_version" not in fleet.evidence  # every node its own: nothing shared
    assert fleet.recommended_action.startswith(f"start with what they share ({shared})")
    # nothing in common: the summary says no more than before
    plain = book(nodes=20)
    events = [e for i in range(7) for e in run(plain, plain.on_finding(zombie(node=f"n{i + 1}", evidence={"image": f"img:{i}"}), at(i)))]
    (fleet,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert "share" not in fleet.summary.split("faults; no node action is taken")[-1] and "shared_image" not in fleet.evidence


def test_much_of_the_fleet_found_in_one_round_is_one_fleet_incident_and_no_request():
    # A rule that looks at everything each round (repeat offenders, the pool's kinds) finds all
    # its nodes at once: decided one by one, each saw only the incidents committed before the
    # round, so ten of twenty nodes at once were ten node incidents, each asking for its action.
    b = book(nodes=20)
    run(b, b.reconcile([zombie(node="n20")], {ZOMBIE}, at(0)))  # one already open
    transitions = b.reconcile([zombie(node=f"n{i + 1}") for i in range(10)] + [zombie(node="n20")], {ZOMBIE}, at(5))
    events = run(b, transitions) + [e for s in range(10, 60, 5) for e in run(b, b.on_tick(at(s)))]
    assert not any(isinstance(e, ActionRequested) for e in events)
    (fleet,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert "zombie_job on 11 of 20 nodes" in fleet.summary
    node_incidents = [i for i in b.incidents.values() if i.kind is ZOMBIE]
    assert len(node_incidents) == 11 and {i.related_incident_id for i in node_incidents} == {fleet.incident_id}


def test_findings_made_together_count_together_tick_after_tick():
    """A rule that reports what settled by each tick (container deaths, a few at a time): three per
    tick over five ticks is 15 of 45 nodes. Decided one by one, each tick's last saw 13 (under the
    share) and no fleet incident ever opened; decided together, the fifth tick's findings are 15."""
    b = book(nodes=45)
    events = []
    for tick in range(5):
        found = [zombie(node=f"n{3 * tick + i + 1}", evidence={"image": "selfplay:2026.12"}) for i in range(3)]
        events += run(b, b.on_findings(found, at(tick)))
    (fleet,) = [e for e in events if isinstance(e, IncidentOpened) and e.kind is IncidentKind.FLEET_ANOMALY]
    assert "zombie_job on 15 of 45 nodes" in fleet.summary
    assert fleet.summary.endswith("what they share: image selfplay:2026.12 on 15 of 15")  # the tick's own three too
    assert {i.related_incident_id for i in b.incidents.values() if i.kind is ZOMBIE} == {fleet.incident_id}


def test_a_few_nodes_found_in_one_round_are_separate_incidents_that_each_act():
    b = book(nodes=20)
    run(b, b.reconcile([zombie(node="n1"), zombie(node="n2")], {ZOMBIE}, at(0)))
    requests = [e for e in run(b, b.on_tick(at(15))) if isinstance(e, ActionRequested)]
    assert sorted(r.node_id for r in requests) == ["n1", "n2"]


def test_a_few_nodes_are_separate_incidents_that_each_act():
    b = book(nodes=20)
    for i in range(2):
        run(b, b.on_finding(zombie(node=f"n{i + 1}"), at(0)))
    requests = [e for e in run(b, b.on_tick(at(15))) if isinstance(e, ActionRequested)]
    assert sorted(r.node_id for r in requests) == ["n1", "n2"]


def _silence(**match) -> SilenceAdded:
    return SilenceAdded(
        source="gpumedic-cli", silence_id=uuid.uuid4(), starts_at=at(-10), ends_at=at(100), reason="maintenance",
        created_by="alice", **match,
    )


def test_a_silenced_finding_is_recorded_as_silenced_and_acts_only_after_the_silence():
    b = book()
    silence = _silence(node_id="n1")
    b.on_silence(silence)
    (opened,) = run(b, b.on_finding(zombie(), at(0)))
    assert opened.silence_id == silence.silence_id and b.get("n1/zombie_job/0").phase == "silenced"
    assert [e for s in range(1, 100, 10) for e in run(b, b.on_tick(at(s)))] == []
    (request,) = run(b, b.on_tick(at(100)))  # the window ended and the fault is still there
    assert isinstance(request, ActionRequested)


def test_silences_match_by_node_kind_gpu_and_end_when_removed():
    b = book()
    b.on_silence(_silence(kind=IncidentKind.DISK_PRESSURE))
    b.on_silence(gpu := _silence(node_id="n1", gpu_index=3))
    assert b.silence_for(ZOMBIE, "n1", 0, at(0)) is None
    assert b.silence_for(IncidentKind.DISK_PRESSURE, "n9", None, at(0)) is not None
    assert b.silence_for(ZOMBIE, "n1", 3, at(0)) == gpu
    b.on_silence(SilenceRemoved(source="gpumedic-cli", silence_id=gpu.silence_id, removed_by="alice"))
    assert b.silence_for(ZOMBIE, "n1", 3, at(0)) is None
    assert b.silence_for(IncidentKind.DISK_PRESSURE, "n9", None, at(200)) is None  # expired


def test_silences_match_as_alertmanager_matchers_do_every_one_holding():
    """`=~` and `!~` match the whole label (`n1` is not `n10`), a label an incident lacks is empty
    (`gpu=~.+`: only GPU incidents), and every matcher must hold."""
    b = book()
    b.on_silence(racks := _silence(matchers=(Matcher.parse("node=~n[12]"), Matcher.parse("kind!=gpu_xid"))))
    b.on_silence(gpus := _silence(matchers=(Matcher.parse('node="n7"'), Matcher.parse("gpu=~.+"))))
    b.on_silence(not_n9 := _silence(matchers=(Matcher.parse("node!~n[0-9]+"),)))
    assert b.silence_for(ZOMBIE, "n1", 0, at(0)) == racks and b.silence_for(ZOMBIE, "n2", None, at(0)) == racks
    assert b.silence_for(ZOMBIE, "n10", 0, at(0)) is None
    assert b.silence_for(IncidentKind.GPU_XID, "n1", 0, at(0)) is None
    assert b.silence_for(ZOMBIE, "n7", 2, at(0)) == gpus and b.silence_for(IncidentKind.DISK_PRESSURE, "n7", None, at(0)) is None
    assert b.silence_for(ZOMBIE, "gpu-host", 0, at(0)) == not_n9


def test_a_silence_on_a_peer_cluster_holds_its_incidents_while_they_stay_open():
    """leader-health's findings name their cluster in the evidence; the incident keeps it, so the
    silence holds at every tick and not only when it opened."""
    from gpumedic_incidents import Finding as Found

    b = book()
    b.on_silence(selfplay := _silence(matchers=(Matcher.parse("cluster=selfplay"),)))
    finding = Found(kind=IncidentKind.NO_LEADER, node_id="selfplay", evidence={"cluster": "selfplay"}, summary="no leader")
    (opened,) = run(b, b.on_finding(finding, at(0)))
    assert opened.silence_id == selfplay.silence_id
    (state,) = b.incidents.values()
    assert state.cluster == "selfplay" and b.silence_for(state.kind, state.node_id, None, at(5), cluster=state.cluster) == selfplay
    other = Found(kind=IncidentKind.NO_LEADER, node_id="training", evidence={"cluster": "training"}, summary="no leader")
    (opened,) = run(b, b.on_finding(other, at(0)))
    assert opened.silence_id is None


def test_a_recurring_window_silences_in_each_window_and_never_after_its_last():
    """Every 100 s for 20 s, from 0 until 250: windows [0, 20), [100, 120), [200, 220)."""
    b = book()
    weekly = SilenceAdded(source="gpumedic-cli", silence_id=uuid.uuid4(), node_id="n1", starts_at=at(0), ends_at=at(20),
                          every_s=3600, repeat_until=at(250), reason="patching", created_by="alice")
    weekly = weekly.model_copy(update={"every_s": 100})  # the model's floor is an hour; the arithmetic is the same
    b.on_silence(weekly)
    silenced = [t for t in range(-10, 400, 5) if b.silence_for(ZOMBIE, "n1", 0, at(t)) is not None]
    assert silenced == [0, 5, 10, 15, 100, 105, 110, 115, 200, 205, 210, 215]
    assert weekly.last_end == at(220) and weekly.window_at(at(205)) == (at(200), at(220))


@pytest.mark.parametrize(("window", "says"), [
    ({"every_s": 7200}, "needs both every_s and repeat_until"),
    ({"every_s": 3600, "repeat_until": at(90_000), "ends_at": at(7200)}, "at least the window's length"),
    ({"every_s": 3600, "repeat_until": at(10)}, "after the first window's end"),
])
def test_a_recurring_window_that_cannot_be_is_refused(window, says):
    with pytest.raises(ValueError, match=says):
        SilenceAdded(source="gpumedic-cli", silence_id=uuid.uuid4(), starts_at=at(0), reason="r", created_by="alice",
                     **({"ends_at": at(20)} | window))


@pytest.mark.parametrize(("text", "says"), [
    ("node=~gpu-0[34", "is not a regular expression"), ("host=gpu-01", "no label 'host'"), ("node", "is no matcher"),
])
def test_a_matcher_that_does_not_parse_says_what_is_wrong(text, says):
    with pytest.raises(ValueError, match=says):
        Matcher.parse(text)


def test_nothing_changes_until_commit():
    b = book()
    transitions = b.on_finding(zombie(), at(0))
    assert b.incidents == {}
    b.commit(transitions[0])
    assert list(b.incidents) == ["n1/zombie_job/0"]


def test_a_step_refused_only_because_its_target_is_in_use_waits_and_asks_again_then_a_person():
    waits = Step(action="kill_gpu_processes", attempts=1, verify_within_s=30, wait_while_in_use_s=3600, ask_again_every_s=900)
    b = book(POLICY.model_copy(update={"kinds": Kinds(zombie_job=ZombiePolicy(ladder=(waits,)))}))
    first = _acting(b)
    in_use = _result(first, ActionOutcome.BLOCKED).model_copy(update={"in_use": True, "detail": "refused: GPU 0 runs compute process(es) 77"})
    (update,) = run(b, b.on_action_completed(in_use, at(16), None))
    assert isinstance(update, IncidentUpdated) and "waits for n1 GPU 0 to be free" in update.summary and "in 15 min" in update.summary
    state = b.get("n1/zombie_job/0")
    assert (state.phase, state.deadline, state.waiting_since, state.step_attempts) == ("waiting", at(16 + 900), at(16), 0)
    assert run(b, b.on_finding(zombie(), at(500))) == []  # the fault is still there: it waits on
    assert run(b, b.on_tick(at(16 + 899))) == []
    (again,) = run(b, b.on_tick(at(16 + 900)))
    assert isinstance(again, ActionRequested) and again.attempt == 2
    # refused again and again: the wait counts from the first refusal, and ends with a person
    asked, t = [again], at(16 + 901)
    while True:
        (answer,) = run(b, b.on_action_completed(in_use.model_copy(update={"action_id": asked[-1].action_id, "attempt": asked[-1].attempt}), t, None))
        if isinstance(answer, IncidentEscalated):
            break
        deadline = b.get("n1/zombie_job/0").deadline
        asked += run(b, b.on_tick(deadline))
        t = deadline + timedelta(seconds=1)
    assert [r.attempt for r in asked] == [2, 3, 4, 5] and b.get("n1/zombie_job/0").phase == "escalated"
    assert t > at(16 + 3600) and "kill_gpu_processes waited 1 h for n1 GPU 0 to be free" in answer.reason


def test_once_free_the_waiting_step_runs_and_its_attempts_are_its_own():
    waits = Step(action="kill_gpu_processes", attempts=1, verify_within_s=30, wait_while_in_use_s=3600, ask_again_every_s=900)
    b = book(POLICY.model_copy(update={"kinds": Kinds(zombie_job=ZombiePolicy(ladder=(waits,)))}))
    first = _acting(b)
    run(b, b.on_action_completed(_result(first, ActionOutcome.BLOCKED).model_copy(update={"in_use": True}), at(16), None))
    (again,) = run(b, b.on_tick(at(16 + 900)))
    run(b, b.on_action_completed(_result(again), at(16 + 901), None))
    state = b.get("n1/zombie_job/0")
    assert (state.phase, state.waiting_since, state.step_attempts) == ("verifying", None, 1)
    (resolved,) = run(b, b.on_finding(cleared(ZOMBIE, "n1", 0), at(16 + 910)))
    assert resolved.resolution == "fixed"
    # a refusal for any other reason (the gate, a protected node) is a person's at once
    b = book(POLICY.model_copy(update={"kinds": Kinds(zombie_job=ZombiePolicy(ladder=(waits,)))}))
    (escalated,) = run(b, b.on_action_completed(_result(_acting(b), ActionOutcome.BLOCKED), at(16), None))
    assert isinstance(escalated, IncidentEscalated) and "refused the action" in escalated.reason
