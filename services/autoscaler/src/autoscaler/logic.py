"""How much of the fleet is busy, and what that asks for. Pure.

Queue depth, worker states and heartbeats come with a later issue; for now the decision rests
on the busy share of GPUs among nodes that sampled recently and are in service (a node gpumedic
drained takes no jobs, so its GPUs are no capacity), and is only published.
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpumedic_events import CapacityEvaluated, NodeSampled

SOURCE = "autoscaler"


def evaluate(
    latest: dict[str, NodeSampled],
    now: datetime,
    *,
    busy_util_pct: int,
    up_above: float,
    down_below: float,
    stale_after_s: float,
    drained: frozenset[str] = frozenset(),
) -> CapacityEvaluated:
    fresh = [s for s in latest.values() if now - s.occurred_at <= timedelta(seconds=stale_after_s)]
    in_service = [s for s in fresh if s.node_id not in drained]
    gpus = [g for s in in_service for g in s.gpus]
    busy = sum(1 for g in gpus if (g.utilization_gpu_pct or 0) > busy_util_pct)
    share = busy / len(gpus) if gpus else 0.0
    if not gpus:
        decision, reason = "hold", "no recent samples" if not fresh else "no GPU in service (every node that sampled is drained)"
    elif share > up_above:
        decision, reason = "scale_up", f"{busy}/{len(gpus)} GPUs busy, above {up_above:.0%}"
    elif share < down_below:
        decision, reason = "scale_down", f"{busy}/{len(gpus)} GPUs busy, below {down_below:.0%}"
    else:
        decision, reason = "hold", f"{busy}/{len(gpus)} GPUs busy; within the target band"
    out = len(fresh) - len(in_service)
    if out and gpus:
        reason += f"; {out} drained node(s) not counted"
    return CapacityEvaluated(
        source=SOURCE,
        nodes_seen=len(fresh),
        nodes_drained=out,
        gpus_total=len(gpus),
        gpus_busy=busy,
        decision=decision,
        reason=reason,
    )
