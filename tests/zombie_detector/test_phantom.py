"""phantom_jobs and idle_jobs: job counts with nothing behind them, from the node's own status and
from the cluster leader's view (ClusterChecked.leader_view), at the runbooks' exact edges."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import ActionCompleted, ActionOutcome, ClusterChecked, GpuSample, HttpAdmin, IncidentKind, IncidentOpened, IncidentResolved, JobsObservation, NodeRetired, NodeSampled, PeerJobs
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import Actions, AdminEndpoint, AdminPolicy, FleetPolicy
from tests.zombie_detector.test_rules import JOB, Detector

T0 = datetime(2026, 1, 24, 14, 5, tzinfo=UTC)
RESET = AdminEndpoint(url="http://127.0.0.1:8770/admin/reset_node_jobs", target="leader", body={"node_id": "{node_id}"})
POLICY = Policy(fleet=FleetPolicy(hold_s=0), actions=Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": RESET})))
PHANTOM, IDLE = IncidentKind.PHANTOM_JOBS, IncidentKind.IDLE_JOBS


def idle_sample(node="n1", *, util=(0, 4), jobs=2, held=False) -> NodeSampled:
    gpus = tuple(GpuSample(index=i, utilization_gpu_pct=u, processes=(JOB,) if held else ()) for i, u in enumerate(util))
    return NodeSampled(source="node-sampler", node_id=node, interval_s=5, gpus=gpus, jobs=JobsObservation(running=jobs))


def check(*peers: PeerJobs, leader="leader-1") -> ClusterChecked:
    return ClusterChecked(source="leader-health", cluster="selfplay", peers_total=3, peers_answering=3, leader=leader,
                          healthy=True, summary="", leader_view=peers)


def run(det: Detector, make, until_s: float, step_s: float = 30.0, start_s: float = 0.0) -> list:
    events, s = [], start_s
    while s <= until_s:
        events += det.feed(make(), s)
        s += step_s
    return events


def opened(events, kind=PHANTOM) -> list[IncidentOpened]:
    return [e for e in events if isinstance(e, IncidentOpened) and e.kind is kind]


def test_jobs_counted_with_no_process_on_idle_gpus_is_a_phantom_at_600s_not_599s():
    det = Detector(POLICY)
    assert opened(run(det, idle_sample, 570)) == []
    assert opened(det.feed(idle_sample(), 599)) == []
    (incident,) = opened(det.feed(idle_sample(), 600))
    assert incident.node_id == "n1" and incident.evidence["jobs_by_node"] == 2 and incident.evidence["jobs_by_leader"] is None
    assert "the node's own status counts 2 job(s)" in incident.summary
    # no leader known: nothing to call the reset on, so a person (the recommendation says where)
    assert "on the cluster's leader" in incident.recommended_action


@pytest.mark.parametrize(("util", "phantom"), [((0, 4), True), ((0, 5), False), ((4, 4), True)])
def test_five_percent_is_busy(util, phantom):
    """NVML's utilisation is whole percents: 4 is idle, 5 busy (the leader's 4.9 %, below)."""
    det = Detector(POLICY)
    assert bool(opened(run(det, lambda: idle_sample(util=util), 600))) is phantom


def test_a_process_on_a_gpu_or_no_jobs_counted_or_an_unread_gpu_is_no_phantom():
    for make in (lambda: idle_sample(held=True), lambda: idle_sample(jobs=0), lambda: idle_sample(jobs=None),
                 lambda: idle_sample(util=(0, None))):
        det = Detector(POLICY)
        assert opened(run(det, make, 900)) == [], make()


def test_the_leaders_count_makes_a_phantom_of_a_node_whose_own_status_gives_none_and_the_reset_goes_to_the_leader():
    det = Detector(POLICY)
    events = []
    for s in range(0, 601, 30):
        events += det.feed(check(PeerJobs(node_id="n1", jobs=3, gpu_percent=1.0)), s)
        events += det.feed(idle_sample(jobs=None), s + 1)
    (incident,) = opened(events)
    assert incident.evidence["jobs_by_leader"] == 3 and incident.evidence["leader"] == "leader-1"
    assert "the leader leader-1 counts 3 job(s)" in incident.summary
    (request,) = [e for e in events if getattr(e, "incident_id", None) == incident.incident_id and e.__class__.__name__ == "ActionRequested"]
    assert request.operation == HttpAdmin(endpoint="reset_job_count", at="leader-1")
    # the reset worked: the leader counts none: fixed once the action is verified
    done = ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id, node_id="n1",
                           attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="reset_job_count: HTTP 200",
                           request_sha256=request.request_sha256)
    det._commit(det.logic.on_action_completed(done, T0 + timedelta(seconds=610), None))
    later = det.feed(check(PeerJobs(node_id="n1", jobs=0, gpu_percent=1.0)), 640)
    (resolved,) = [e for e in later if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "fixed"


def test_without_a_leader_to_reset_on_a_person_is_called_and_the_incident_closes_when_the_count_drops():
    det = Detector(POLICY)
    events = run(det, idle_sample, 600)
    assert [type(e).__name__ for e in events] == ["IncidentOpened", "IncidentEscalated"]
    assert opened(det.feed(idle_sample(), 610)) == []  # still there: the one incident, updated
    (resolved,) = [e for e in det.feed(idle_sample(jobs=0), 630) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared" and not det.logic.book.open_on("n1")


def test_work_back_on_a_gpu_clears_a_phantom_and_its_count_starts_again():
    det = Detector(POLICY)
    (incident,) = opened(run(det, idle_sample, 600))
    (resolved,) = [e for e in det.feed(idle_sample(held=True), 630) if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == incident.incident_id and resolved.resolution == "cleared"
    assert opened(run(det, idle_sample, 1200, start_s=660)) == []  # idle again from 660 s: its ten minutes start there
    assert opened(det.feed(idle_sample(), 1260))


def test_a_leader_alone_counting_jobs_on_an_idle_peer_is_idle_jobs_for_a_person():
    det = Detector(POLICY)
    events = []
    for s in range(0, 601, 30):
        events += det.feed(check(PeerJobs(node_id="n2", jobs=1, gpu_percent=4.9), PeerJobs(node_id="n3", jobs=1, gpu_percent=5.0)), s)
    (incident,) = opened(events, IDLE)
    assert incident.node_id == "n2" and incident.evidence["gpu_percent_by_leader"] == 4.9
    assert not [e for e in events if e.__class__.__name__ == "ActionRequested"]
    assert opened(events) == []  # nothing on the node says no process is left: not a phantom
    # a sampler starts there: its view decides, and the leader-only incident closes
    closing = det.feed(idle_sample("n2", util=(80, 90), jobs=1, held=True), 620)
    assert [e for e in closing if isinstance(e, IncidentResolved)] or not det.logic.book.open_on("n2")


def test_peer_ids_that_cannot_be_node_ids_are_skipped_without_a_crash():
    det = Detector(POLICY)
    hostile = [PeerJobs(node_id=n, jobs=5, gpu_percent=0.0) for n in ("nebius.h100-3", "a b", "$(reboot)", "x" * 200)]
    events = []
    for s in range(0, 901, 30):
        events += det.feed(check(*hostile), s)
    assert opened(events, IDLE) == [] and opened(events) == []


def test_a_retired_node_is_forgotten_and_a_new_one_of_that_id_starts_its_count_again():
    det = Detector(POLICY)
    run(det, idle_sample, 570)
    retired = NodeRetired(source="remediator", node_id="n1", incident_id=uuid.uuid4(), action_id=uuid.uuid4(), reason="worker ended")
    det.feed(retired, 580)
    assert det.logic.rules and not any("n1" in getattr(rule, "nodes", {}) for rule in det.logic.rules)
    assert opened(run(det, idle_sample, 1150, start_s=600)) == []  # 550 s of the new node: not yet
    assert opened(det.feed(idle_sample(), 1200))


def test_with_no_leader_a_peers_count_still_finds_idle_jobs_and_a_phantom_goes_to_a_person():
    det = Detector(POLICY)
    events = []
    leaderless = ClusterChecked(source="leader-health", cluster="selfplay", peers_total=3, peers_answering=3, leader=None,
                                healthy=False, summary="no leader with quorum", view_by="peer-2",
                                leader_view=(PeerJobs(node_id="n2", jobs=2, gpu_percent=0.0), PeerJobs(node_id="n1", jobs=2, gpu_percent=0.0)))
    for s in range(0, 601, 30):
        events += det.feed(leaderless, s)
        events += det.feed(idle_sample("n1", jobs=None), s + 1)
    (idle,) = opened(events, IDLE)
    assert idle.node_id == "n2" and "the peer peer-2 (the cluster has no leader) counts 2 job(s)" in idle.summary
    assert idle.evidence["counted_by"] == "peer-2" and idle.evidence["leader"] is None
    (phantom,) = opened(events)
    assert phantom.node_id == "n1" and phantom.evidence["jobs_by_leader"] == 2
    assert "on the cluster's leader once it has one" in phantom.recommended_action
    assert not [e for e in events if e.__class__.__name__ == "ActionRequested"]  # no leader to reset on: a person


def test_the_leaders_own_phantom_count_is_reset_on_itself():
    det = Detector(POLICY)
    events = []
    for s in range(0, 601, 30):
        events += det.feed(check(PeerJobs(node_id="n2", jobs=0, gpu_percent=0.0), leader="n1"), s)  # no row of its own
        events += det.feed(idle_sample("n1", jobs=2), s + 1)  # its sampler reads its own status: 2 jobs, no process
    (incident,) = opened(events)
    (request,) = [e for e in events if e.__class__.__name__ == "ActionRequested"]
    assert incident.node_id == "n1" and request.operation == HttpAdmin(endpoint="reset_job_count", at="n1")
