"""A node whose job keeps every CPU busy is late, not dead: its samples come late, in bursts, with
ticks missed; the rules time it by its own samples and take its word that it is late. Each test
here is a false incident the busy day opened before (issue 72), and the fault it must still find."""

from __future__ import annotations

from datetime import timedelta

from gpumedic_events import CpuPressure, GpuProcess, GpuSample, HostSample, IncidentKind, IncidentOpened, JobsObservation, NodeSampled
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy
from tests.zombie_detector.test_rules import Detector, at

POLICY = Policy(fleet=FleetPolicy(hold_s=0))
JOB = GpuProcess(pid=4242, start_ticks=777, command="python -m selfplay", container_exists=True, age_s=3 * 3600.0)


def taken(node: str, s: float, *, util: int = 0, jobs: int | None = 1, growing: bool | None = False, late_s: float = 0.0,
          missed: int = 0, pressure: float | None = None) -> NodeSampled:
    """A sample the node took at `s` on its own clock, `late_s` after it was due, `missed` ticks after the one before."""
    return NodeSampled(
        source="node-sampler", node_id=node, interval_s=5.0, occurred_at=at(s), due_at=at(s - late_s), missed_ticks=missed,
        gpus=(GpuSample(index=0, utilization_gpu_pct=util, processes=(JOB,)),),
        host=HostSample(cpu_pressure=CpuPressure(some_avg10_pct=pressure) if pressure is not None else None),
        jobs=JobsObservation(running=jobs, output_growing=growing),
    )


def test_samples_that_wait_on_a_busy_node_and_come_late_time_the_gpu_by_when_they_were_taken():
    """A GPU idle for 8 minutes (a long data-loading phase, short of the 10 a zombie needs) on a node
    whose samples wait more and more in its NATS client: the last comes 2 minutes after it was taken.
    Timed on arrival that was 10 minutes of idleness and a zombie; on the node's own times it is 8."""
    d = Detector(POLICY)
    for s in range(0, 300, 5):
        d.feed(taken("n1", s), s)  # on time
    for s in range(300, 505, 5):
        d.feed(taken("n1", s), 300 + (s - 300) * 1.6)  # each later than the one before, 8 s apart as they come
    assert not d.opened(IncidentKind.ZOMBIE_JOB)
    for s in range(505, 620, 5):  # it stays idle: at 600 s of its own time it is a zombie, however late it comes
        d.feed(taken("n1", s), 630 + (s - 505) * 0.2)
    (opened,) = d.opened(IncidentKind.ZOMBIE_JOB)
    assert 600.0 <= opened.evidence["idle_seconds"] <= 601.0


def test_a_node_that_says_it_is_late_is_given_longer_before_it_is_silent_and_its_gap_restarts_no_count():
    """A sampler starved by its job's data loaders: its samples say they were late and its CPUs
    pressed, then nothing for 40 s, then a sample that says it missed 7 ticks. That is a late node:
    no node_silent (15 s for a node that keeps time), and the zombie count it was in goes on."""
    d = Detector(POLICY)
    d.feed(taken("other", 0), 0)
    for s in range(0, 400, 5):
        d.feed(taken("n1", s, late_s=3.0, pressure=92.0), s)
        d.feed(taken("other", s, util=90), s)
    for s in range(400, 445, 5):  # n1 is quiet for 40 s; the detector keeps up with everyone else
        d.feed(taken("other", s, util=90), s)
        assert d.tick(s) == []
    d.feed(taken("n1", 440, late_s=4.0, missed=7, pressure=95.0), 440)
    assert not d.opened(IncidentKind.NODE_SILENT)
    for s in range(445, 605, 5):
        d.feed(taken("n1", s, late_s=3.0, pressure=92.0), s)
        d.feed(taken("other", s, util=90), s)
    (opened,) = d.opened(IncidentKind.ZOMBIE_JOB)  # counted from 0 across the late gap: found at 600 s, not 1040
    assert opened.node_id == "n1" and opened.evidence["idle_seconds"] >= 600.0


def test_a_busy_node_that_stops_for_good_is_still_silent_once_its_longer_patience_is_over():
    d = Detector(POLICY)
    for s in range(0, 50, 5):
        d.feed(taken("n1", s, util=90, pressure=92.0), s)
        d.feed(taken("other", s, util=90), s)
    for s in range(50, 110, 5):
        d.feed(taken("other", s, util=90), s)
        assert not [e for e in d.tick(s) if isinstance(e, IncidentOpened)]  # 12 intervals from 45 s: due at 105 s
    d.feed(taken("other", 110, util=90), 110)
    d.tick(110)
    (opened,) = d.opened(IncidentKind.NODE_SILENT)
    assert opened.node_id == "n1"
    # and a node that keeps time is silent after its 3 intervals, as before
    d.feed(taken("quiet", 115, util=90), 115)
    for s in range(120, 140, 5):
        d.feed(taken("other", s, util=90), s)
        d.tick(s)
    assert {e.node_id for e in d.opened(IncidentKind.NODE_SILENT)} == {"n1", "quiet"}


def opened_at(d: Detector, samples) -> tuple[float | None, list]:
    """Feed (s, sample) pairs; when the first incident opened (the node's seconds), and every one opened."""
    first = None
    for s, sample in samples:
        if [e for e in d.feed(sample, s) if isinstance(e, IncidentOpened)] and first is None:
            first = s
    return first, d.opened()


def test_a_checkpoint_on_a_node_without_a_job_count_is_not_a_stuck_process():
    """A node without job probes that say a count (no status endpoint): an old process's GPU idles
    for 7 minutes, then its job writes a 3-minute checkpoint (the output grows, the GPU still idles).
    That is a job between phases: nothing stuck. A GPU that idles on without output is stuck, 600 s on."""
    d = Detector(POLICY)
    phases = [(s, taken("n1", s, jobs=None, growing=None)) for s in range(0, 420, 5)]
    phases += [(s, taken("n1", s, jobs=None, growing=True)) for s in range(420, 600, 5)]
    phases += [(s, taken("n1", s, jobs=None, growing=False)) for s in range(600, 1300, 5)]
    first, opened = opened_at(d, phases)
    assert [e.kind for e in opened] == [IncidentKind.STUCK_PROCESS]
    assert first == 1200  # counted from the checkpoint's end, not from 0 (which opened it at 600)


def test_a_zombie_on_a_busy_node_whose_count_goes_unread_is_a_zombie_not_a_stuck_process():
    """A node whose job keeps its CPUs busy: its sampler misses 4 ticks every minute, and its loaded
    status endpoint answers one probe in four. A hung job there is a zombie_job (the kill the runbook
    does): the gaps its samples explain restart no count, and an unread count is not a missing one."""
    d = Detector(POLICY)
    samples = []
    for s in range(0, 900, 5):
        if s % 60 in (5, 10, 15, 20):
            continue  # the sampler did not get a CPU
        samples.append((s, taken("n1", s, jobs=1 if s % 20 == 0 else None, missed=4 if s % 60 == 25 else 0,
                                 late_s=2.0 if s % 60 == 25 else 0.0, pressure=95.0)))
    first, opened = opened_at(d, samples)
    assert [e.kind for e in opened] == [IncidentKind.ZOMBIE_JOB] and first == 600


def test_the_node_clock_never_places_a_sample_after_it_came_nor_trusts_a_clock_that_stepped_back():
    from zombie_detector.clocks import NodeClocks

    clocks = NodeClocks()
    assert clocks.place("n1", at(0), at(0.2)) == at(0.2)
    assert clocks.place("n1", at(5), at(5.1)) == at(5.1)
    assert abs(clocks.place("n1", at(10), at(40)) - at(10.1)) < timedelta(seconds=0.01)  # waited 30 s on its way: placed when taken
    assert clocks.place("n1", at(3600), at(45)) == at(45)  # a clock an hour ahead (or a lying sender): never after it came
    assert clocks.place("n1", at(50) - timedelta(days=1), at(50)) == at(50)  # stepped back a day: starts afresh at arrival
    assert abs(clocks.place("n1", at(55) - timedelta(days=1), at(55.3)) - at(55)) < timedelta(seconds=0.01)


def test_a_node_quiet_and_refusing_ssh_after_gpumedic_acted_on_it_is_its_own_doing_for_a_while():
    """gpumedic killed a zombie's processes on n1 (a work-ending action), and n1 went quiet and
    refused SSH right after, as a node does when what gpumedic ran takes it down: that is gpumedic's
    own doing, neither node_silent nor ssh_unreachable, until 5 minutes after the action's answer.
    Quiet beyond that is judged as any silence."""
    from gpumedic_events import ActionRequested, KillGpuProcesses, NodeSshChecked
    from gpumedic_incidents.policy import Kinds, Step, ZombiePolicy
    from tests.zombie_detector.test_rules import succeeded

    kill = ZombiePolicy(idle_for_s=30, ladder=(Step(action="kill_gpu_processes"),))
    d = Detector(Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(zombie_job=kill)))
    request = None
    for s in range(0, 60, 5):
        d.feed(taken("n2", s, util=90), s)
        if request is None:
            d.feed(taken("n1", s), s)
            request = next((e for e in d.events if isinstance(e, ActionRequested) and isinstance(e.operation, KillGpuProcesses)), None)
    assert request is not None and request.node_id == "n1"
    succeeded(d, request, 60)
    refused = lambda n: NodeSshChecked(source="remediator", node_id="n1", reachable=False, cause="refused",  # noqa: E731
                                       detail="connection refused", failures=n)
    for s in range(60, 360, 5):
        d.feed(taken("n2", s, util=90), s)
        if s in (100, 130, 160):
            d.feed(refused((s - 70) // 30), s)
        d.tick(s)
    assert not d.opened(IncidentKind.NODE_SILENT) and not d.opened(IncidentKind.SSH_UNREACHABLE)
    for s in range(360, 380, 5):
        d.feed(taken("n2", s, util=90), s)
        d.tick(s)
    d.feed(refused(4), 380)
    assert {e.kind for e in d.opened() if e.node_id == "n1"} >= {IncidentKind.NODE_SILENT, IncidentKind.SSH_UNREACHABLE}
