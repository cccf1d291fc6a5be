"""The autoscaler's decisions, from plain data."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from autoscaler.capacity import evaluate
from autoscaler.scaling import NodeLoad
from gpumedic_events import GpuSample, NodeSampled

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


def _node(node: str, utils: list[int | None], age_s: float = 0) -> NodeLoad:
    gpus = tuple(GpuSample(index=i, utilization_gpu_pct=u) for i, u in enumerate(utils))
    return NodeLoad.of(NodeSampled(source="node-sampler", node_id=node, interval_s=5, gpus=gpus, occurred_at=NOW - timedelta(seconds=age_s)))


def test_capacity_decisions_follow_the_busy_share_of_fresh_samples():
    kw = {"busy_util_pct": 20, "up_above": 0.9, "down_below": 0.3, "stale_after_s": 60}
    assert evaluate({"a": _node("a", [95, 99])}, NOW, **kw).decision == "scale_up"
    assert evaluate({"a": _node("a", [0, 0, None, 90])}, NOW, **kw).decision == "scale_down"  # None: NVML gave none
    held = evaluate({"a": _node("a", [95, 0]), "b": _node("b", [99, 99], age_s=300)}, NOW, **kw)
    assert (held.decision, held.nodes_seen, held.gpus_total, held.gpus_busy) == ("hold", 1, 2, 1)
    assert evaluate({}, NOW, **kw).reason == "no recent samples"


def test_a_drained_node_is_no_capacity():
    kw = {"busy_util_pct": 20, "up_above": 0.9, "down_below": 0.3, "stale_after_s": 60}
    latest = {"a": _node("a", [95, 99]), "b": _node("b", [0, 0])}
    assert evaluate(latest, NOW, **kw).decision == "hold"  # 2 of 4 busy
    drained = evaluate(latest, NOW, drained=frozenset({"b"}), **kw)  # its idle GPUs take no jobs
    assert (drained.decision, drained.nodes_seen, drained.nodes_drained, drained.gpus_total) == ("scale_up", 2, 1, 2)
    assert drained.reason.endswith("; 1 drained node(s) not counted")
    every = evaluate(latest, NOW, drained=frozenset({"a", "b"}), **kw)
    assert (every.decision, every.gpus_total) == ("hold", 0) and "every node that sampled is drained" in every.reason


