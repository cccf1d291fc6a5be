"""The rules' memory across a takeover, through the node-incident logic: what one instance wrote
(`memory.snapshot`) another takes back (`memory.recall`), so a zombie's ten minutes and a silent
node are not lost to a failover, and memory the samples stream no longer covers, or that does not
read, is left for the rules to learn again."""

from __future__ import annotations

import msgspec

from gpumedic_bus.streams import PARTITIONS, SAMPLES_MAX_AGE_S, partition_of
from gpumedic_events import GpuProcess, GpuSample, IncidentKind, JobsObservation
from zombie_detector import memory
from tests.zombie_detector.test_rules import Detector, at, sample

HUNG = GpuProcess(pid=4242, start_ticks=777, command="python -m selfplay", container_exists=True)
IDLE = (GpuSample(index=0, utilization_gpu_pct=0, memory_used_mib=8192, processes=(HUNG,)),)
OLD = GpuProcess(pid=99, start_ticks=5, command="python serve.py", age_s=9 * 3600, container_exists=True)


def hung(node: str = "n1"):
    """A node claiming a job whose GPU idles and whose output does not grow."""
    return sample(node, gpus=IDLE).model_copy(update={"jobs": JobsObservation(running=1, output_growing=False)})


def _took_over(before: Detector, s: float, *, written_at: float | None = None) -> tuple[Detector, list[str]]:
    """A new instance at `s`, from what `before` wrote at `written_at` (by default, `s`)."""
    after = Detector()
    stored = memory.snapshot(before.logic.rules, at(s if written_at is None else written_at))
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


def test_a_stuck_process_streak_goes_on_too():
    before = Detector()
    stuck = (GpuSample(index=0, utilization_gpu_pct=0, processes=(OLD,)),)
    for s in range(0, 450, 5):
        before.feed(sample("n2", gpus=stuck, jobs=None), s)
    after, _ = _took_over(before, 455)
    found = next(s for s in range(460, 1200, 5) if after.feed(sample("n2", gpus=stuck, jobs=None), s) and after.opened())
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
    assert all("its rules learn again" in line for line in lines[1:]) and len(lines) == 1 + PARTITIONS
    assert after.logic.rules[1].idle_since == {}


def test_each_partition_holds_its_own_nodes_and_an_unreadable_one_costs_only_itself():
    before = Detector()
    nodes = [f"gpu-node-{i:03d}" for i in range(40)]
    for node in nodes:
        before.feed(hung(node), 0)
    stored = memory.snapshot(before.logic.rules, at(0))
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
