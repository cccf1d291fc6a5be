"""The zombie rule alone through the node-incident logic and the shared lifecycle, driven directly.

Time is the detector's own clock (`now`), passed with each sample; samples come every 5 s as a
node sends them (`feed`), since idleness counts only across samples at the node's interval. The
fleet hold is 0 here (tests/incidents covers it), so a new incident acts at once."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    GpuProcess,
    GpuSample,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    JobsObservation,
    NodeSampled,
    RestartJob,
)
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, Policy, operation_digest
from gpumedic_incidents.policy import Actions, FleetPolicy, JobRestart, Kinds, RestartJobPolicy, Step, ZombiePolicy
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules.zombie import ZombieRule

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    kinds=Kinds(
        zombie_job=ZombiePolicy(
            idle_below_pct=5,
            idle_for_s=60,
            action_timeout_s=120,
            ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=30),),
        )
    ),
)
HOLDER = GpuProcess(pid=4242, start_ticks=777, command="python train.py", used_memory_mib=20000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(at_s: float, *, util: int | None = 0, procs=(HOLDER,), running: int | None = 1, growing=False, node="n1") -> NodeSampled:
    gpu = GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=20000 if procs else 0, processes=procs)
    return NodeSampled(
        source="node-sampler", node_id=node, interval_s=5, occurred_at=T0 + timedelta(seconds=at_s),
        gpus=(gpu,), jobs=JobsObservation(running=running, output_growing=growing),
    )


def detector() -> NodeIncidents:
    return NodeIncidents(POLICY, rules=[ZombieRule(POLICY.kinds.zombie_job, POLICY.actions.kill_gpu_processes)])


def apply(det: NodeIncidents, transitions) -> list:
    """Commit every transition (as the handlers do once published) and return their events."""
    events = []
    for t in transitions:
        det.book.commit(t)
        events += t.events
    return events


def feed(det: NodeIncidents, start_s: float, end_s: float, make=sample, **kwargs) -> list:
    """Samples every 5 s from `start_s` to `end_s` inclusive, each at its own moment; all events."""
    return [e for s in range(int(start_s), int(end_s) + 1, 5) for e in apply(det, det.on_event(make(s, **kwargs), at(s)))]


def open_incident(det: NodeIncidents) -> tuple[IncidentOpened, ActionRequested]:
    assert feed(det, 0, 55) == []
    opened, request = apply(det, det.on_event(sample(60), at(60)))
    assert isinstance(opened, IncidentOpened) and isinstance(request, ActionRequested)
    return opened, request


def completed(request: ActionRequested, outcome=ActionOutcome.SUCCEEDED) -> ActionCompleted:
    return ActionCompleted(
        source="remediator", action_id=request.action_id, incident_id=request.incident_id,
        node_id=request.node_id, attempt=request.attempt, outcome=outcome, detail="done",
    )


def test_idle_gpu_with_jobs_claimed_opens_one_incident_and_requests_a_kill():
    det = detector()
    opened, request = open_incident(det)
    assert opened.gpu_index == 0 and opened.kind == "zombie_job" and "held by pid 4242" in opened.summary
    assert [t.pid for t in request.operation.targets] == [4242]
    assert request.operation.targets[0].start_ticks == 777
    assert request.attempt == 1


def test_the_request_names_its_incident_and_the_gpu_state_it_assumes():
    det = detector()
    _, request = open_incident(det)
    incident = det.book.get("n1/zombie_job/0")
    assert request.fingerprint == incident.fingerprint == "n1/zombie_job/0"
    assert request.operation.max_gpu_utilization_pct == 4  # below idle_below_pct (5)
    # The incident records exactly the request it waits for: the remediator runs that and nothing else.
    assert incident.phase == "acting" and incident.detector == "zombie-detector"
    assert (incident.pending_action.action_id, incident.pending_action.attempt) == (request.action_id, 1)
    assert incident.pending_action.operation_sha256 == operation_digest(request.operation)


def test_a_burst_of_samples_proves_no_idleness_whatever_their_timestamps_say():
    det = detector()
    for i in range(1000):  # a thousand samples claiming to span an hour, all within one second
        crafted = sample(0).model_copy(update={"occurred_at": T0 + timedelta(seconds=3.6 * i)})
        assert det.on_event(crafted, T0 + timedelta(milliseconds=i)) == []
    assert det.book.incidents == {}


def test_a_gap_in_the_samples_restarts_the_idle_count():
    det = detector()
    assert feed(det, 0, 30) == []
    # Unseen for 25 s (more than 3 intervals of 5 s): nobody watched it meanwhile, so the count
    # starts again at 55 (without the gap it would open at 60).
    assert feed(det, 55, 110) == []
    assert isinstance(apply(det, det.on_event(sample(115), at(115)))[0], IncidentOpened)


def test_a_holder_that_cannot_be_identified_is_escalated_without_a_kill():
    anonymous = GpuProcess(pid=4242, used_memory_mib=20000)  # the sampler could not read /proc/4242
    det = detector()
    feed(det, 0, 55, procs=(anonymous,))
    opened, escalated = apply(det, det.on_event(sample(60, procs=(anonymous,)), at(60)))
    assert isinstance(opened, IncidentOpened) and isinstance(escalated, IncidentEscalated)
    assert "pid 4242 on GPU 0 cannot be identified" in escalated.reason
    assert det.book.get("n1/zombie_job/0").phase == "escalated"


def test_a_holder_seen_as_pid_1_is_never_a_kill_target():
    # In a pid namespace the sampler can see a container's init as pid 1 beside the job: the kill
    # names the job alone.
    init = GpuProcess(pid=1, start_ticks=5, command="/sbin/docker-init -- python train.py", used_memory_mib=10)
    det = detector()
    feed(det, 0, 55, procs=(init, HOLDER))
    opened, request = apply(det, det.on_event(sample(60, procs=(init, HOLDER)), at(60)))
    assert isinstance(opened, IncidentOpened) and isinstance(request, ActionRequested)
    assert [t.pid for t in request.operation.targets] == [HOLDER.pid]


def test_repeats_update_the_open_incident_instead_of_opening_another():
    det = detector()
    open_incident(det)
    assert not any(isinstance(e, IncidentOpened) for e in feed(det, 65, 400))
    assert len(det.book.incidents) == 1


def test_busy_gpu_or_growing_output_or_no_jobs_is_not_a_zombie():
    for kwargs in ({"util": 80}, {"growing": True}, {"running": 0}, {"running": None}, {"procs": ()}):
        assert feed(detector(), 0, 600, **kwargs) == [], kwargs


def two_gpus(at_s: float, *, util0=0, growing=True) -> NodeSampled:
    busy = GpuSample(index=1, utilization_gpu_pct=95, memory_used_mib=30000, processes=(HOLDER.model_copy(update={"pid": 5151}),))
    idle = GpuSample(index=0, utilization_gpu_pct=util0, memory_used_mib=20000, processes=(HOLDER,))
    return NodeSampled(
        source="node-sampler", node_id="n2", interval_s=5, occurred_at=T0 + timedelta(seconds=at_s),
        gpus=(idle, busy), jobs=JobsObservation(running=2, output_growing=growing),
    )


def test_one_hung_gpu_among_busy_ones_is_found_although_the_node_output_grows():
    opened, request = feed(detector(), 0, 60, make=two_gpus)
    assert opened.gpu_index == 0 and [t.pid for t in request.operation.targets] == [4242]


def test_growth_is_credited_to_the_idle_gpu_when_no_other_gpu_works():
    def idle_only(s):
        return two_gpus(s).model_copy(update={"gpus": (two_gpus(s).gpus[0],)})

    assert feed(detector(), 0, 120, make=idle_only) == []


def writing(at_s: float, *, gpu0_writes: bool | None) -> NodeSampled:
    """GPU 0 idle among a busy one, with its process's own write counter: growing, flat or unknown."""
    sample = two_gpus(at_s)
    written = None if gpu0_writes is None else (1_000_000 + int(at_s) * 4096 if gpu0_writes else 1_000_000)
    idle = sample.gpus[0].model_copy(update={"processes": (HOLDER.model_copy(update={"write_bytes": written}),)})
    return sample.model_copy(update={"gpus": (idle, sample.gpus[1])})


def test_an_idle_gpu_whose_own_process_writes_is_producing_not_hung():
    # A checkpoint on GPU 0 while GPU 1 computes: its process writes, so no zombie however long.
    assert feed(detector(), 0, 600, make=writing, gpu0_writes=True) == []
    # Its counter flat: hung, although the node's output grows (from GPU 1).
    opened, _ = feed(detector(), 0, 60, make=writing, gpu0_writes=False)
    assert opened.gpu_index == 0
    # No counters (a sampler without root): the node-wide rule as before.
    opened, _ = feed(detector(), 0, 60, make=writing, gpu0_writes=None)
    assert opened.gpu_index == 0


def test_a_new_process_on_the_gpu_cannot_tell_from_its_counter():
    from zombie_detector.rules.zombie import holder_writes, wrote_since

    gpu = writing(10, gpu0_writes=False).gpus[0]
    assert wrote_since(None, gpu) is None
    assert wrote_since(holder_writes(gpu), gpu) is False
    assert wrote_since({(4242, 777): 999}, gpu) is True
    assert wrote_since({(9999, 1): 5}, gpu) is None  # another process before: nothing to compare


def test_healthy_nodes_take_the_fast_path_and_leave_no_state():
    det = detector()
    assert feed(det, 0, 600, util=90, growing=True) == []
    (rule,) = det.rules
    assert rule.idle_since == {} and det.book.incidents == {}


def test_activity_in_between_restarts_the_idle_clock():
    det = detector()
    feed(det, 0, 25)
    det.on_event(sample(30, util=90), at(30))
    assert feed(det, 35, 90) == []  # idle since 35: 55 s so far
    assert isinstance(apply(det, det.on_event(sample(95), at(95)))[0], IncidentOpened)


def test_kill_then_free_gpu_resolves_as_fixed():
    det = detector()
    _, request = open_incident(det)
    assert apply(det, det.on_event(sample(65, procs=()), at(65))) == []  # acting: wait for the remediator
    apply(det, det.on_action_completed(completed(request), at(66), "00-" + "a" * 32 + "-" + "b" * 16 + "-01"))
    assert det.book.get("n1/zombie_job/0").phase == "verifying"
    (resolved,) = apply(det, det.on_event(sample(70, procs=()), at(70)))
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"
    assert "holds no process after the action" in resolved.summary
    assert det.book.incidents == {}


def test_gpu_still_held_after_verify_window_retries_then_escalates():
    det = detector()
    _, first = open_incident(det)
    apply(det, det.on_action_completed(completed(first, ActionOutcome.FAILED), at(61), None))
    assert apply(det, det.on_event(sample(80), at(80))) == []  # inside the verify window
    (second,) = apply(det, det.on_event(sample(95), at(95)))
    assert isinstance(second, ActionRequested) and second.attempt == 2 and second.action_id != first.action_id
    apply(det, det.on_action_completed(completed(second), at(100), None))
    (escalated,) = apply(det, det.on_event(sample(140), at(140)))
    assert isinstance(escalated, IncidentEscalated) and "2 attempt(s) did not fix n1 GPU 0" in escalated.reason


def test_observe_mode_or_blocked_escalates_and_a_later_clearance_resolves():
    det = detector()
    _, request = open_incident(det)
    (escalated,) = apply(det, det.on_action_completed(completed(request, ActionOutcome.OBSERVED), at(61), None))
    assert isinstance(escalated, IncidentEscalated) and "observe mode" in escalated.reason
    assert feed(det, 65, 200) == []  # no new incident while escalated
    (resolved,) = apply(det, det.on_event(sample(205, util=90), at(205)))
    assert resolved.resolution == "cleared" and "no longer looks like a zombie" in resolved.summary


def test_a_remediator_that_never_answers_is_escalated_by_the_tick():
    det = detector()
    open_incident(det)
    assert apply(det, det.on_tick(at(170))) == []
    (escalated,) = apply(det, det.on_tick(at(200)))
    assert "no answer from the remediator" in escalated.reason


def test_a_sample_that_cannot_tell_never_resolves_an_incident():
    det = detector()
    _, request = open_incident(det)
    apply(det, det.on_action_completed(completed(request), at(61), None))
    assert apply(det, det.on_event(sample(70, running=None), at(70))) == []
    assert apply(det, det.on_event(sample(71, util=None), at(71))) == []
    (resolved,) = apply(det, det.on_event(sample(72, procs=(), running=None), at(72)))
    assert resolved.resolution == "fixed"  # an empty GPU is decisive whatever the probes say


def test_the_runbooks_thresholds_hold_at_their_edges():
    """`gpu_percent < 5` for more than 10 minutes: 5 % is busy, 4 % idle; 599 s is not yet, 600 s is."""
    policy = Policy(fleet=FleetPolicy(hold_s=0))  # the shipped defaults: idle_below_pct 5, idle_for_s 600
    assert (policy.kinds.zombie_job.idle_below_pct, policy.kinds.zombie_job.idle_for_s) == (5, 600)

    def fresh() -> NodeIncidents:
        return NodeIncidents(policy, rules=[ZombieRule(policy.kinds.zombie_job, policy.actions.kill_gpu_processes)])

    def opened(det: NodeIncidents, at_s: float, util: int) -> bool:
        events = apply(det, det.on_event(sample(at_s, util=util), at(at_s)))
        return any(isinstance(e, IncidentOpened) for e in events)

    busy = fresh()
    assert not any(opened(busy, s, 5) for s in range(0, 1205, 5))  # 5 % for 20 minutes: busy
    idle = fresh()
    assert not any(opened(idle, s, 4) for s in range(0, 595, 5))
    assert not opened(idle, 599, 4)  # idle for 599 s: not yet
    assert opened(idle, 600, 4)  # 600 s: a zombie


def test_a_policy_with_the_old_idle_util_pct_says_what_it_is_now():
    import pytest
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"idle_util_pct is now idle_below_pct.*idle_util_pct: 5 is idle_below_pct: 6"):
        ZombiePolicy.model_validate({"idle_util_pct": 5})


def test_a_failing_rule_or_finding_costs_only_itself(caplog):
    class Broken:
        inputs = (Sample,)

        def observe(self, event, now, incidents):
            raise RuntimeError("a bug")

        def tick(self, now, incidents):
            raise RuntimeError("a bug")

    class Unrecordable(Broken):
        def observe(self, event, now, incidents):
            return [Finding(IncidentKind.STUCK_PROCESS, event.node_id, evidence={"pids": [1, 2]})]  # not a scalar

    det = NodeIncidents(POLICY, rules=[Broken(), Unrecordable(), ZombieRule(POLICY.kinds.zombie_job, POLICY.actions.kill_gpu_processes)])
    with caplog.at_level("ERROR", logger="zombie_detector.node_incidents"):
        opened, _ = open_incident(det)
        assert apply(det, det.on_tick(at(61))) == []
    assert opened.kind is IncidentKind.ZOMBIE_JOB
    assert "rule Broken failed on NodeSampled from n1" in caplog.text and "rule Broken failed on a tick" in caplog.text
    assert "the stuck_process finding on n1 could not be recorded" in caplog.text


def _restarting_detector() -> NodeIncidents:
    kinds = POLICY.kinds.model_copy(update={"zombie_job": POLICY.kinds.zombie_job.model_copy(update={"restart_job": "selfplay"})})
    policy = POLICY.model_copy(update={
        "kinds": kinds, "actions": Actions(restart_job=RestartJobPolicy(jobs={"selfplay": JobRestart(unit="selfplay.service")})),
    })
    return NodeIncidents(policy, rules=[ZombieRule(policy.kinds.zombie_job, policy.actions.kill_gpu_processes)])


@pytest.mark.parametrize(("outcome", "ends"), [(ActionOutcome.SUCCEEDED, "fixed"), (ActionOutcome.FAILED, "escalated")])
def test_a_verified_kill_restarts_the_job_the_policy_names_before_the_incident_ends(outcome, ends):
    det = _restarting_detector()
    _, kill = open_incident(det)
    apply(det, det.on_action_completed(completed(kill), at(66), None))
    (restart,) = apply(det, det.on_event(sample(70, procs=()), at(70)))  # the kill is verified: now the restart
    assert isinstance(restart, ActionRequested) and restart.operation == RestartJob(job="selfplay") and restart.attempt == 2
    state = det.book.get("n1/zombie_job/0")
    assert (state.phase, state.resolution) == ("acting", "fixed")
    assert apply(det, det.on_event(sample(72, procs=()), at(72))) == []  # waiting for the restart's answer
    (end,) = apply(det, det.on_action_completed(completed(restart, outcome), at(75), None))
    if ends == "fixed":
        assert isinstance(end, IncidentResolved) and end.resolution == "fixed" and "; restarted, done" in end.summary
        assert det.book.incidents == {}
    else:
        assert isinstance(end, IncidentEscalated) and "fixed, but the job's restart was failed: done" in end.reason


def test_when_the_launcher_starts_the_killed_job_again_the_ladder_ends_its_pattern_as_the_runbook_does():
    """Runbook 000: the GPU's holders are killed, but a new hung process takes the GPU again (the
    launcher respawned it): the next step is the policy's pattern kill (pkill -f 'python.*selfplay')."""
    from gpumedic_events import KillPattern
    from gpumedic_incidents.policy import PatternKillPolicy, ProcessPattern

    policy = Policy(
        fleet=FleetPolicy(hold_s=0),
        actions=Actions(kill_pattern=PatternKillPolicy(grace_s=5, patterns={"selfplay": ProcessPattern(regex="python.*selfplay")})),
        kinds=Kinds(zombie_job=ZombiePolicy(idle_for_s=60, kill_pattern="selfplay", ladder=(
            Step(action="kill_gpu_processes", verify_within_s=30), Step(action="kill_pattern", verify_within_s=30)))),
    )
    det = NodeIncidents(policy, rules=[ZombieRule(policy.kinds.zombie_job, policy.actions.kill_gpu_processes,
                                                  pattern_kill=policy.actions.kill_pattern)])
    asked = []
    respawned = HOLDER.model_copy(update={"pid": 5151, "start_ticks": 901})
    for s in range(0, 200, 5):
        for event in apply(det, det.on_event(sample(s, procs=(HOLDER,) if s < 70 else (respawned,)), at(s))):
            if isinstance(event, ActionRequested):
                asked.append(event.operation)
                apply(det, det.on_action_completed(ActionCompleted(
                    source="remediator", action_id=event.action_id, incident_id=event.incident_id, node_id="n1",
                    attempt=event.attempt, outcome=ActionOutcome.SUCCEEDED, detail="done"), at(s + 1), None))
    assert [o.operation for o in asked] == ["kill_gpu_processes", "kill_pattern"]
    assert asked[1] == KillPattern(pattern="selfplay", grace_s=5, max_gpu_utilization_pct=4)
