"""The rules' memory across a takeover, through the node-incident logic: what one instance wrote
(`memory.snapshot`) another takes back (`memory.recall`), so a zombie's ten minutes, a silent
node, a failing check, a phantom job count, a log pattern's lines, a port's rate, a stale model
copy, a GPU's XIDs and a node's container deaths are not lost to a failover;
memory of samples the samples stream no longer covers, or memory that does not read, is left for
the rules to learn again, while memory of node events (kept by their stream) is taken back at any
age."""

from __future__ import annotations

import uuid

import msgspec

from gpumedic_bus.streams import PARTITIONS, SAMPLES_MAX_AGE_S, partition_of
from gpumedic_events import GpuProcess, GpuSample, IncidentKind, JobsObservation, NodeRetired
from gpumedic_incidents import Policy
from zombie_detector import memory
from zombie_detector.rules.nic import NicRule
from zombie_detector.rules.xid import XidRule
from tests.zombie_detector import test_checks, test_container_rate, test_files, test_nic_rule, test_phantom
from tests.zombie_detector.test_rules import JOB, Detector, at, sample, xid

HUNG = GpuProcess(pid=4242, start_ticks=777, command="python -m selfplay", container_exists=True)
IDLE = (GpuSample(index=0, utilization_gpu_pct=0, memory_used_mib=8192, processes=(HUNG,)),)
OLD = GpuProcess(pid=99, start_ticks=5, command="python serve.py", age_s=9 * 3600, container_exists=True)


def hung(node: str = "n1"):
    """A node claiming a job whose GPU idles and whose output does not grow."""
    return sample(node, gpus=IDLE).model_copy(update={"jobs": JobsObservation(running=1, output_growing=False)})


def _took_over(before: Detector, s: float, *, written_at: float | None = None, policy: Policy | None = None) -> tuple[Detector, list[str]]:
    """A new instance at `s`, from what `before` wrote at `written_at` (by default, `s`)."""
    after = Detector(policy) if policy is not None else Detector()
    stored, _ = memory.snapshot(before.logic.rules, at(s if written_at is None else written_at))
    return after, memory.recall(after.logic.rules, stored, at(s))


def test_a_zombie_streak_goes_on_after_a_takeover_and_is_found_at_its_ten_minutes():
    before = Detector()
    for s in range(0, 480, 5):  # eight of its ten minutes idle, then the active instance dies
        before.feed(hung("n1"), s)
    after, lines = _took_over(before, 492, written_at=480)
    assert lines == ["2 entries taken back, written up to 12s ago"]  # its streak, and when the node last sampled
    found = [s for s in range(495, 700, 5) if after.feed(hung("n1"), s) and after.opened(IncidentKind.ZOMBIE_JOB)]
    assert found and found[0] == 600, found  # at ten minutes from its start, not ten after the takeover
    fresh = Detector()  # what the takeover learnt before this memory: ten minutes from itself
    first = next(s for s in range(495, 1200, 5) if fresh.feed(hung("n1"), s) and fresh.opened(IncidentKind.ZOMBIE_JOB))
    assert first >= 1095


def _no_probe(sample):
    """A node without job probes: no job count, and no word on its output either."""
    return sample.model_copy(update={"jobs": JobsObservation()})


def test_a_stuck_process_streak_goes_on_too():
    before = Detector()
    stuck = (GpuSample(index=0, utilization_gpu_pct=0, processes=(OLD,)),)
    for s in range(0, 450, 5):
        before.feed(_no_probe(sample("n2", gpus=stuck, jobs=None)), s)
    after, _ = _took_over(before, 455)
    found = next(s for s in range(460, 1200, 5) if after.feed(_no_probe(sample("n2", gpus=stuck, jobs=None)), s) and after.opened())
    assert found == 600 and after.opened()[0].kind is IncidentKind.STUCK_PROCESS


def test_a_node_that_fell_silent_before_the_takeover_is_still_judged_silent():
    before = Detector()
    for s in range(0, 60, 5):
        before.feed(sample("quiet"), s)
        before.feed(sample("busy"), s)
    for s in range(60, 80, 5):  # "quiet" stops at 55 s; the instance dies at 80 s
        before.feed(sample("busy"), s)
    after, _ = _took_over(before, 90, written_at=80)
    for s in range(90, 130, 5):
        after.feed(sample("busy"), s)
        after.tick(s)
    silent = after.opened(IncidentKind.NODE_SILENT)
    assert [e.node_id for e in silent] == ["quiet"]  # counted from the takeover: not "busy", whose samples go on


def test_memory_older_than_the_samples_stream_is_left_and_the_rules_learn_again():
    before = Detector()
    for s in range(0, 300, 5):
        before.feed(hung("n1"), s)
    after, lines = _took_over(before, 300 + SAMPLES_MAX_AGE_S + 1, written_at=300)
    assert lines[0] == "0 entries taken back, written up to 0s ago"
    assert all("its rules of samples learn again" in line for line in lines[1:]) and len(lines) == 1 + PARTITIONS
    assert after.logic.rules[1].idle_since == {}


def test_each_partition_holds_its_own_nodes_and_an_unreadable_one_costs_only_itself():
    before = Detector()
    nodes = [f"gpu-node-{i:03d}" for i in range(40)]
    for node in nodes:
        before.feed(hung(node), 0)
    stored, _ = memory.snapshot(before.logic.rules, at(0))
    assert set(stored) == {memory.key(p) for p in range(PARTITIONS)}
    for node in nodes:
        part = msgspec.json.decode(stored[memory.key(partition_of(node))])
        assert any(e["node"] == node for e in part["rules"]["ZombieRule"])
    broken = partition_of(nodes[0])
    stored[memory.key(broken)] = b'{"at": "2026-11-23T10:00:00Z", "rules": {"ZombieRule": [{"node": "x; rm -rf /", "gpu": 0}]}}'
    after = Detector()
    lines = memory.recall(after.logic.rules, stored, at(5))
    assert any(line.startswith(f"{memory.key(broken)}: ZombieRule's memory unreadable") and "$[0]" in line for line in lines), lines
    kept = {node for node, _ in after.logic.rules[1].idle_since}
    assert kept == {n for n in nodes if partition_of(n) != broken}


def test_a_failing_check_goes_on_counting_its_for_s_after_a_takeover():
    before = Detector(test_checks.POLICY)
    for s in (0, 30):
        before.feed(test_checks.checked(gpu_fabric="problem: NVSwitch 2 is missing"), s)
    after, _ = _took_over(before, 45, written_at=40, policy=test_checks.POLICY)
    after.feed(test_checks.checked(gpu_fabric="problem: NVSwitch 2 is missing"), 61)
    assert [o.node_id for o in after.opened(IncidentKind.CHECK_FAILED)] == ["n1"]  # its 60 s counted from 0, not from 45


def test_a_phantom_job_count_goes_on_counting_its_ten_minutes_after_a_takeover():
    before = Detector(test_phantom.POLICY)
    test_phantom.run(before, test_phantom.idle_sample, 480)  # eight of its ten minutes counted on idle GPUs
    after, _ = _took_over(before, 495, written_at=480, policy=test_phantom.POLICY)
    found = [s for s in range(510, 1200, 30) if test_phantom.opened(after.feed(test_phantom.idle_sample(), s))]
    assert found[0] == 600, found  # ten minutes from the first idle sample, not from the takeover
    fresh = Detector(test_phantom.POLICY)
    assert test_phantom.opened(test_phantom.run(fresh, test_phantom.idle_sample, 1080, start_s=510)) == []


def test_a_log_patterns_lines_before_a_takeover_count_within_its_window():
    before = Detector(test_checks.PATTERNS)
    before.feed(test_checks.logged(worker_errors=40), 0)
    before.feed(test_checks.logged(worker_errors=42), 10)  # 2 lines in the window, 3 open it
    after, _ = _took_over(before, 15, policy=test_checks.PATTERNS)
    after.feed(test_checks.logged(worker_errors=43), 20)
    (opened,) = after.opened(IncidentKind.LOG_PATTERN)
    assert opened.summary.startswith("3 line(s) matched the log pattern worker-errors")
    fresh = Detector(test_checks.PATTERNS)
    fresh.feed(test_checks.logged(worker_errors=43), 20)
    assert fresh.opened() == []  # what was counted before it saw the node is history


def test_a_port_that_trains_down_while_the_detector_changes_hands_is_judged_against_the_rate_it_ran_at():
    before = Detector()
    for s in range(0, 60, 5):
        before.feed(test_nic_rule.with_ports(*test_nic_rule.HEALTHY), s)
    after, _ = _took_over(before, 70, written_at=55)
    slow = [*test_nic_rule.HEALTHY[:3], test_nic_rule.ib("mlx5_3", rate=200.0)]
    fresh = Detector()
    for detector in (after, fresh):
        for s in range(75, 150, 5):
            detector.feed(test_nic_rule.with_ports(*slow), s)
    (opened,) = after.opened(IncidentKind.NIC_DEGRADED)
    assert opened.summary == "mlx5_3 port 1 runs at 200 Gb/s where it ran at 400"
    assert fresh.opened() == []  # the first rate it saw is the one it knows


def test_a_links_downs_before_a_takeover_count_within_its_window():
    before = Detector()
    for s, downs in ((0, 5), (60, 5), (120, 6)):
        before.feed(test_nic_rule.with_ports(*test_nic_rule.HEALTHY[:3], test_nic_rule.ib("mlx5_3", downs=downs)), s)
    after, _ = _took_over(before, 130, written_at=125)
    after.feed(test_nic_rule.with_ports(*test_nic_rule.HEALTHY[:3], test_nic_rule.ib("mlx5_3", downs=7)), 180)
    (flap,) = after.opened(IncidentKind.NIC_FLAPPING)
    assert flap.summary.startswith("mlx5_3 port 1 went down 2 time(s) in 3m00s (link_downed 5 -> 7)")


def test_a_steady_port_is_remembered_by_its_rate_alone_and_the_others_in_full():
    d = Detector()
    never_up = test_nic_rule.ib("mlx5_9", state="DOWN", phys="Disabled", rate=None)
    d.feed(test_nic_rule.with_ports(*test_nic_rule.HEALTHY, never_up), 0)
    d.feed(test_nic_rule.with_ports(*test_nic_rule.HEALTHY[:3], test_nic_rule.ib("mlx5_3", downs=2), never_up), 60)
    (entry,) = next(r for r in d.logic.rules if isinstance(r, NicRule)).remember()
    assert entry.rates == {"mlx5_0-p1": 400.0, "mlx5_1-p1": 400.0, "mlx5_2-p1": 400.0}
    (downs,) = entry.ports  # not the port never up: its next sample says as much
    assert (downs.port, downs.counts[0][1:]) == ("mlx5_3-p1", (0, 0))  # where its downs rose from, within the window
    assert msgspec.json.encode(entry).startswith(b'{"node":"n1","rates":{"mlx5_0-p1":400.0,')
    d.feed(NodeRetired(source="remediator", node_id="n1", incident_id=uuid.uuid4(), action_id=uuid.uuid4(), reason="worker ended"), 70)
    assert next(r for r in d.logic.rules if isinstance(r, NicRule)).remember() == []  # a worker the pool ended is forgotten


def test_a_stale_copy_is_judged_against_the_fleets_copy_at_once_after_a_takeover():
    fleet = {"n1": {}, "n2": {}, "n3": {"present": False}, "n4": {"sha": test_files.OLD}}
    before = Detector(test_files.POLICY)
    for s in (0, 30):
        test_files.feed(before, s, fleet)
    after, _ = _took_over(before, 40, written_at=35, policy=test_files.POLICY)
    stale_first = {"n4": fleet["n4"], "n3": fleet["n3"], "n1": {}, "n2": {}}  # before the fleet's copies come in again
    test_files.feed(after, 61, stale_first)
    assert sorted(o.node_id for o in after.opened(IncidentKind.FILE_MISSING)) == ["n3", "n4"]  # their 60 s counted from 0
    fresh = Detector(test_files.POLICY)
    for s in (61, 91, 121):
        test_files.feed(fresh, s, stale_first)
    assert [o.node_id for o in fresh.opened(IncidentKind.FILE_MISSING)] == ["n3"]  # n4 is first counted at 91, when the vote is in


def _on(pid: int):
    return sample(gpus=(GpuSample(index=2, utilization_gpu_pct=90, processes=(JOB.model_copy(update={"pid": pid}),)),))


def test_a_gpus_xids_under_earlier_jobs_count_after_a_takeover_however_long_it_took():
    before = Detector()
    before.feed(xid(13), 0)  # the node's first XID: its job is not known yet
    before.feed(_on(1001), 1)
    before.feed(xid(13), 2)  # an application XID under one job: the job's fault, so far
    # the instance dies; the next takes over five minutes later (a day of XIDs is the rule's window,
    # and the XIDs meanwhile wait in their stream)
    after, lines = _took_over(before, 301, written_at=3)
    assert lines[0] == "2 entries taken back, written up to 298s ago"  # the XIDs; the node's last sample is too old to take
    after.feed(_on(2002), 302)
    after.feed(xid(13), 303)  # the same GPU under a second job: the GPU is the common factor
    (opened,) = after.opened(IncidentKind.GPU_XID)
    assert "under 2 different jobs" in opened.summary
    fresh = Detector()
    fresh.feed(_on(2002), 302)
    fresh.feed(xid(13), 303)
    assert fresh.opened() == []  # without the memory: one job, the job's fault


def test_xids_older_than_the_rules_window_are_not_taken_back():
    before = Detector()
    before.feed(_on(1001), 0)
    before.feed(xid(13), 1)
    after, _ = _took_over(before, 2 * 86_400, written_at=86_400 + 100)
    assert next(r for r in after.logic.rules if isinstance(r, XidRule)).history == {}


def _node_rate(d: Detector) -> list[str]:
    return [o.node_id for o in d.opened(IncidentKind.CONTAINER_DIED) if o.fingerprint.endswith("/node_rate")]


def test_a_nodes_container_deaths_count_after_a_takeover():
    before = Detector(test_container_rate.POLICY)
    test_container_rate.fleet_day(before, bad={"n3": [(f"job-{j}", 139) for j in range(2)]})  # two: under min_died
    assert _node_rate(before) == []  # not yet enough of n3's containers died
    after, _ = _took_over(before, 200, written_at=20, policy=test_container_rate.POLICY)
    for j in range(2, 8):
        after.feed(test_container_rate.ended("n3", f"job-{j}", 1), 201 + j)
    after.tick(230)
    assert _node_rate(after) == ["n3"]
    fresh = Detector(test_container_rate.POLICY)
    for j in range(2, 8):
        fresh.feed(test_container_rate.ended("n3", f"job-{j}", 1), 201 + j)
    fresh.tick(230)
    assert _node_rate(fresh) == []  # one node's exits alone: nothing to compare with


def test_a_partition_over_its_budget_leaves_out_its_largest_rule_and_says_so():
    before = Detector()
    nodes = [n for n in (f"gpu-node-{i:03d}" for i in range(200)) if partition_of(n) == 5][:8]
    for node in nodes:
        before.feed(hung(node), 0)
        before.feed(xid(13, gpu=1, node=node), 1)
    for i in range(900):  # a storm on one GPU: its history is the partition's largest memory
        before.feed(xid(13, gpu=2, node=nodes[0]), 2 + i * 0.01)
    full, left_out = memory.snapshot(before.logic.rules, at(20))
    assert left_out == []
    size = len(full[memory.key(5)])
    stored, left_out = memory.snapshot(before.logic.rules, at(20), budget=size // 2)
    assert [line.split(" (")[0] for line in left_out] == [f"{memory.key(5)}: XidRule's memory"]
    assert len(stored[memory.key(5)]) <= size // 2
    after = Detector()
    memory.recall(after.logic.rules, stored, at(25))
    assert {node for node, _ in after.logic.rules[1].idle_since} == set(nodes)  # the rest of the partition kept
    assert next(r for r in after.logic.rules if isinstance(r, XidRule)).history == {}
