"""The zombie rules and the incident state machine, driven directly with plain events.

Time is the detector's own clock (`now`), passed with each sample; samples come every 5 s as a
node sends them (`feed`), since idleness counts only across samples at the node's interval."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    GpuProcess,
    GpuSample,
    JobsObservation,
    NodeSampled,
)
from gpumedic_incidents import operation_digest
from zombie_detector.logic import Escalated, Followed, Opened, Resolved, Retried, Rules, ZombieDetector

T0 = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)
RULES = Rules(idle_util_pct=5, idle_for_s=60, verify_within_s=30, action_timeout_s=120, max_attempts=2)
HOLDER = GpuProcess(pid=4242, start_ticks=777, command="python train.py", used_memory_mib=20000)


def at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def sample(at_s: float, *, util: int | None = 0, procs=(HOLDER,), running: int | None = 1, growing=False, node="n1") -> NodeSampled:
    gpu = GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=20000 if procs else 0, processes=procs)
    return NodeSampled(
        source="node-sampler", node_id=node, interval_s=5, occurred_at=T0 + timedelta(seconds=at_s),
        gpus=(gpu,), jobs=JobsObservation(running=running, output_growing=growing),
    )


def completed(opened: Opened, outcome=ActionOutcome.SUCCEEDED, attempt=1) -> ActionCompleted:
    return ActionCompleted(
        source="remediator", action_id=opened.action.action_id, incident_id=opened.incident.incident_id,
        node_id=opened.incident.node_id, attempt=attempt, outcome=outcome, detail="done",
    )


def feed(det: ZombieDetector, start_s: float, end_s: float, make=sample, **kwargs) -> list:
    """Samples every 5 s from `start_s` to `end_s` inclusive, each at its own moment; all effects."""
    effects = []
    for s in range(int(start_s), int(end_s) + 1, 5):
        effects += det.on_sample(make(s, **kwargs), at(s))
    return effects


def open_incident(det: ZombieDetector) -> Opened:
    assert feed(det, 0, 55) == []
    (effect,) = det.on_sample(sample(60), at(60))
    assert isinstance(effect, Opened)
    return effect


def test_idle_gpu_with_jobs_claimed_opens_one_incident_and_requests_a_kill():
    det = ZombieDetector(RULES)
    assert feed(det, 0, 55) == []  # not yet idle for long enough
    (opened,) = det.on_sample(sample(60), at(60))
    assert isinstance(opened, Opened)
    assert opened.opened.gpu_index == 0 and opened.opened.kind == "zombie_job"
    assert [t.pid for t in opened.action.operation.targets] == [4242]
    assert opened.action.operation.targets[0].start_ticks == 777
    assert opened.action.attempt == 1


def test_the_request_names_its_incident_and_the_gpu_state_it_assumes():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    action, incident = opened.action, opened.incident
    assert action.fingerprint == incident.fingerprint == "n1/zombie_job/0"
    assert action.operation.max_gpu_utilization_pct == RULES.idle_util_pct
    # The incident records exactly the request it waits for: the remediator runs that and nothing else.
    assert incident.phase == "acting" and incident.detector == "zombie-detector"
    assert (incident.pending_action.action_id, incident.pending_action.attempt) == (action.action_id, 1)
    assert incident.pending_action.operation_sha256 == operation_digest(action.operation)


def test_a_burst_of_samples_proves_no_idleness_whatever_their_timestamps_say():
    det = ZombieDetector(RULES)
    # A thousand samples claiming to span an hour, all arriving within one second.
    for i in range(1000):
        crafted = sample(0).model_copy(update={"occurred_at": T0 + timedelta(seconds=3.6 * i)})
        assert det.on_sample(crafted, T0 + timedelta(milliseconds=i)) == []
    assert det.incidents == {}


def test_a_gap_in_the_samples_restarts_the_idle_count():
    det = ZombieDetector(RULES)
    assert feed(det, 0, 30) == []
    # Unseen for 25 s (more than 3 intervals of 5 s): nobody watched it meanwhile, so the count
    # starts again at 55 (without the gap it would open at 60).
    assert feed(det, 55, 110) == []
    assert isinstance(det.on_sample(sample(115), at(115))[0], Opened)


def test_a_holder_that_cannot_be_identified_is_escalated_without_a_kill():
    anonymous = GpuProcess(pid=4242, used_memory_mib=20000)  # the sampler could not read /proc/4242
    det = ZombieDetector(RULES)
    feed(det, 0, 55, procs=(anonymous,))
    opened, escalated = det.on_sample(sample(60, procs=(anonymous,)), at(60))
    assert isinstance(opened, Opened) and opened.action is None
    assert isinstance(escalated, Escalated)
    assert "pid 4242 on GPU 0 cannot be identified" in escalated.event.reason
    assert escalated.incident.phase == "escalated" and escalated.incident.pending_action is None


def test_repeats_update_the_open_incident_instead_of_opening_another():
    det = ZombieDetector(RULES)
    open_incident(det)
    assert not any(isinstance(e, Opened) for e in feed(det, 65, 400))
    assert len(det.incidents) == 1


def test_busy_gpu_or_growing_output_or_no_jobs_is_not_a_zombie():
    for kwargs in ({"util": 80}, {"growing": True}, {"running": 0}, {"running": None}, {"procs": ()}):
        det = ZombieDetector(RULES)
        assert feed(det, 0, 600, **kwargs) == [], kwargs


def two_gpus(at_s: float, *, util0=0, growing=True) -> NodeSampled:
    busy = GpuSample(index=1, utilization_gpu_pct=95, memory_used_mib=30000, processes=(HOLDER.model_copy(update={"pid": 5151}),))
    idle = GpuSample(index=0, utilization_gpu_pct=util0, memory_used_mib=20000, processes=(HOLDER,))
    return NodeSampled(
        source="node-sampler", node_id="n2", interval_s=5, occurred_at=T0 + timedelta(seconds=at_s),
        gpus=(idle, busy), jobs=JobsObservation(running=2, output_growing=growing),
    )


def test_one_hung_gpu_among_busy_ones_is_found_although_the_node_output_grows():
    det = ZombieDetector(RULES)
    (opened,) = feed(det, 0, 60, make=two_gpus)
    assert isinstance(opened, Opened) and opened.opened.gpu_index == 0
    assert [t.pid for t in opened.action.operation.targets] == [4242]


def test_growth_is_credited_to_the_idle_gpu_when_no_other_gpu_works():
    det = ZombieDetector(RULES)

    def idle_only(s):
        return two_gpus(s).model_copy(update={"gpus": (two_gpus(s).gpus[0],)})

    assert feed(det, 0, 120, make=idle_only) == []


def test_healthy_nodes_take_the_fast_path_and_leave_no_state():
    det = ZombieDetector(RULES)
    assert feed(det, 0, 600, util=90, growing=True) == []
    assert det.watched == set() and det.idle_since == {} and det.incidents == {}


def test_activity_in_between_restarts_the_idle_clock():
    det = ZombieDetector(RULES)
    feed(det, 0, 25)
    det.on_sample(sample(30, util=90), at(30))
    assert feed(det, 35, 90) == []  # idle since 35: 55 s so far
    assert isinstance(det.on_sample(sample(95), at(95))[0], Opened)


def test_kill_then_free_gpu_resolves_as_fixed():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    assert det.on_sample(sample(65, procs=()), at(65)) == []  # still acting: wait for the remediator
    (followed,) = det.on_action_completed(completed(opened), T0 + timedelta(seconds=66), "00-" + "a" * 32 + "-" + "b" * 16 + "-01")
    assert isinstance(followed, Followed) and followed.incident.phase == "verifying"
    (resolved,) = det.on_sample(sample(70, procs=()), T0 + timedelta(seconds=70))
    assert isinstance(resolved, Resolved) and resolved.event.resolution == "fixed"
    assert det.incidents == {}


def test_gpu_still_held_after_verify_window_retries_then_escalates():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    det.on_action_completed(completed(opened, ActionOutcome.FAILED), T0 + timedelta(seconds=61), None)
    assert det.on_sample(sample(80), T0 + timedelta(seconds=80)) == []  # inside the verify window
    (retried,) = det.on_sample(sample(95), T0 + timedelta(seconds=95))
    assert isinstance(retried, Retried) and retried.action.attempt == 2
    assert retried.action.action_id != opened.action.action_id
    later = T0 + timedelta(seconds=100)
    det.on_action_completed(completed(opened, attempt=2).model_copy(update={"action_id": retried.action.action_id}), later, None)
    (escalated,) = det.on_sample(sample(140), T0 + timedelta(seconds=140))
    assert isinstance(escalated, Escalated) and "2 attempts" in escalated.event.reason


def test_observe_mode_or_blocked_escalates_and_a_later_clearance_resolves():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    (escalated,) = det.on_action_completed(completed(opened, ActionOutcome.OBSERVED), at(61), None)
    assert isinstance(escalated, Escalated) and "observe mode" in escalated.event.reason
    assert feed(det, 65, 200) == []  # no new incident while escalated
    (resolved,) = det.on_sample(sample(205, util=90), at(205))
    assert resolved.event.resolution == "cleared"


def test_a_repeated_or_stale_action_result_changes_nothing():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    assert det.on_action_completed(completed(opened, attempt=2), T0, None) == []
    assert len(det.on_action_completed(completed(opened), T0, None)) == 1
    assert det.on_action_completed(completed(opened), T0, None) == []


def test_a_remediator_that_never_answers_is_escalated_by_the_tick():
    det = ZombieDetector(RULES)
    open_incident(det)
    assert det.on_tick(at(100)) == []
    (escalated,) = det.on_tick(at(200))
    assert "no answer from the remediator" in escalated.event.reason


def test_a_sample_that_cannot_tell_never_resolves_an_incident():
    det = ZombieDetector(RULES)
    opened = open_incident(det)
    det.on_action_completed(completed(opened), T0 + timedelta(seconds=61), None)
    assert det.on_sample(sample(70, running=None), T0 + timedelta(seconds=70)) == []
    assert det.on_sample(sample(71, util=None), T0 + timedelta(seconds=71)) == []
    (resolved,) = det.on_sample(sample(72, procs=(), running=None), T0 + timedelta(seconds=72))
    assert resolved.event.resolution == "fixed"  # an empty GPU is decisive whatever the probes say
