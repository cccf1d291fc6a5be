"""stuck_process: an old process on an idle GPU where the node gives no job count (the runbook's
"running over 2 hours with no GPU activity"), observed for a person by default."""

from __future__ import annotations

import pytest

from gpumedic_events import GpuProcess, GpuSample, IncidentEscalated, IncidentKind, IncidentOpened, IncidentResolved, JobsObservation, NodeSampled
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy
from tests.zombie_detector.test_rules import Detector

POLICY = Policy(fleet=FleetPolicy(hold_s=0))


def sample(*, age_s=3 * 3600.0, util=0, jobs=None, container_exists=None) -> NodeSampled:
    holder = GpuProcess(pid=4242, start_ticks=77, command="python train.py", age_s=age_s, container_exists=container_exists)
    return NodeSampled(source="node-sampler", node_id="n1", interval_s=30, jobs=JobsObservation(running=jobs),
                       gpus=(GpuSample(index=0, utilization_gpu_pct=util, processes=(holder,)),))


def run(det: Detector, until_s: float, **kwargs) -> list:
    return [e for s in range(0, int(until_s) + 1, 30) for e in det.feed(sample(**kwargs), s)]


def test_an_old_process_on_an_idle_gpu_without_a_job_count_goes_to_a_person_after_600s():
    det = Detector(POLICY)
    assert run(det, 570) == []
    opened, escalated = det.feed(sample(), 600)
    assert isinstance(opened, IncidentOpened) and opened.kind is IncidentKind.STUCK_PROCESS and opened.gpu_index == 0
    assert "pid 4242 (python train.py) has run 3.0 h" in opened.summary and opened.evidence["pids"] == "4242"
    assert isinstance(escalated, IncidentEscalated)  # observe by default: no ladder
    (resolved,) = [e for e in det.feed(sample(util=80), 630) if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared"


@pytest.mark.parametrize("kwargs", [
    {"age_s": 7200.0},             # exactly 2 h is not over 2 h
    {"util": 5},                   # 5 % is busy
    {"jobs": 1},                   # the node counts jobs: the zombie rule's
    {"container_exists": False},   # its container is gone: an orphan
])
def test_not_stuck(kwargs):
    det = Detector(POLICY)
    assert [e for e in run(det, 1200, **kwargs) if isinstance(e, IncidentOpened) and e.kind is IncidentKind.STUCK_PROCESS] == []


def test_a_hung_job_on_a_node_whose_job_count_is_read_only_now_and_then_is_a_zombie_not_stuck():
    """A status endpoint that answers every other probe (a loaded daemon): the node does count its
    jobs, so the hung job is the zombie rule's. Its streak goes on over the samples that cannot
    tell; the stuck rule's, kept over the same samples, would have called it stuck_process (as a
    200-node simulation on a loaded machine did)."""
    det = Detector(POLICY)
    for s in range(0, 901, 30):
        det.feed(sample(jobs=None if (s // 30) % 2 else 1), s)
    assert det.opened(IncidentKind.STUCK_PROCESS) == []
    (zombie,) = det.opened(IncidentKind.ZOMBIE_JOB)
    assert zombie.gpu_index == 0 and zombie.evidence["idle_seconds"] == 600  # counted from the first sample, across the unread ones


def test_a_job_count_unread_for_longer_than_the_gap_keeps_the_zombie_count_while_the_gpu_is_seen_idle():
    """Six samples in a row without the count (more than MAX_GAP_INTERVALS), each showing the GPU
    idle and held: it was watched all along, so the count goes on (a 200-node simulation on a
    loaded machine, its status endpoints answering one probe in three, never found its zombie)."""
    det = Detector(POLICY)
    for s in range(0, 301, 30):
        det.feed(sample(jobs=1), s)
    for s in range(330, 481, 30):
        assert det.feed(sample(jobs=None), s) == []  # none of them opens anything
    for s in range(510, 601, 30):
        det.feed(sample(jobs=1), s)
    (zombie,) = det.opened(IncidentKind.ZOMBIE_JOB)
    assert zombie.evidence["idle_seconds"] == 600  # from its first idle sample
    assert det.opened(IncidentKind.STUCK_PROCESS) == []  # the node counts its jobs


def test_a_zombie_whose_count_went_unread_opens_at_its_window_and_says_the_count_it_last_read():
    det = Detector(POLICY)
    for s in range(0, 91, 30):
        det.feed(sample(jobs=2), s)
    for s in range(120, 601, 30):
        det.feed(sample(jobs=None, age_s=3600.0), s)
    (zombie,) = det.opened(IncidentKind.ZOMBIE_JOB)
    assert zombie.evidence["idle_seconds"] == 600 and zombie.evidence["jobs_running"] == 2
    # these samples never read the node's output either: the summary says so, not that none grows
    assert "while the node reports 2 job(s) when its count was last read and its output could not be read;" in zombie.summary


def test_a_count_unread_for_the_whole_window_after_jobs_were_claimed_is_one_zombie_not_also_stuck():
    det = Detector(POLICY)
    det.feed(sample(jobs=1), 0)
    for s in range(30, 1801, 30):  # never read again: the zombie opens at 600, stuck's window would end at 630
        det.feed(sample(jobs=None), s)
    assert [e.kind for e in det.opened()] == [IncidentKind.ZOMBIE_JOB]


def test_a_job_count_unread_never_starts_the_zombie_count():
    det = Detector(POLICY)
    for s in range(0, 571, 30):
        det.feed(sample(jobs=None, age_s=3600.0), s)  # an hour old: not stuck_process's either
    for s in range(600, 1141, 30):
        det.feed(sample(jobs=1), s)
    assert det.opened(IncidentKind.ZOMBIE_JOB) == []  # counted from 600, the first sample with a count


def test_samples_that_cannot_tell_whether_the_gpu_idles_for_longer_than_the_gap_start_the_zombie_count_again():
    det = Detector(POLICY)
    for s in range(0, 301, 30):
        det.feed(sample(jobs=1), s)
    for s in range(330, 481, 30):  # six samples without the GPU's utilization: not watched
        det.feed(sample(jobs=1, util=None), s)
    for s in range(510, 901, 30):
        det.feed(sample(jobs=1), s)
    assert det.opened(IncidentKind.ZOMBIE_JOB) == []  # 390 s since it was seen idle again: under 600


def test_a_gpu_busy_again_while_the_job_count_is_unread_ends_the_zombie_count():
    det = Detector(POLICY)
    for s in range(0, 301, 30):
        det.feed(sample(jobs=1), s)
    det.feed(sample(jobs=None, util=90), 330)  # working: whatever the count, no hung job now
    for s in range(360, 901, 30):
        det.feed(sample(jobs=1), s)
    assert det.opened(IncidentKind.ZOMBIE_JOB) == []  # 540 s since it idled again
