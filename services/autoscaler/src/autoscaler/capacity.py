"""What the fleet supplies, what the queue asks for, and the decision published. Pure.

With a demand source configured the decision is the queue's (`autoscaler.scaling`); a demand
source that cannot be read gives "hold" with the reason and no decision on the bad reading.
Without one, it rests on the busy share of GPUs. Either way capacity is the GPUs of nodes that
sampled recently and are in service: a node gpumedic drained takes no jobs, so its GPUs are no
capacity. Decisions are published, not yet carried out (spawning and terminating workers through
the remediator's gate come with the providers).
"""

from __future__ import annotations

from datetime import datetime, timedelta

from gpumedic_events import CapacityEvaluated

from autoscaler.demand import Demand, DemandUnavailable
from autoscaler.scaling import NodeLoad, Scaler, Supply

SOURCE = "autoscaler"


def supply(latest: dict[str, NodeLoad], now: datetime, *, stale_after_s: float, drained: frozenset[str],
           idle_since: dict[str, datetime] | None = None) -> tuple[int, Supply]:
    """(nodes that sampled lately, what is in service among them)."""
    fresh = [s for s in latest.values() if now - s.occurred_at <= timedelta(seconds=stale_after_s)]
    gpus = {s.node_id: len(s.gpus) for s in fresh if s.node_id not in drained}
    idle = {n: t for n, t in (idle_since or {}).items() if n in gpus}
    return len(fresh), Supply(gpus, idle)


def evaluate(
    latest: dict[str, NodeLoad],
    now: datetime,
    *,
    busy_util_pct: int,
    up_above: float,
    down_below: float,
    stale_after_s: float,
    drained: frozenset[str] = frozenset(),
) -> CapacityEvaluated:
    """The busy-share decision, for a fleet without a demand source."""
    seen, in_service = supply(latest, now, stale_after_s=stale_after_s, drained=drained)
    total, busy = in_service.total, _busy(latest, in_service, busy_util_pct)
    share = busy / total if total else 0.0
    if not total:
        decision, reason = "hold", "no recent samples" if not seen else "no GPU in service (every node that sampled is drained)"
    elif share > up_above:
        decision, reason = "scale_up", f"{busy}/{total} GPUs busy, above {up_above:.0%}"
    elif share < down_below:
        decision, reason = "scale_down", f"{busy}/{total} GPUs busy, below {down_below:.0%}"
    else:
        decision, reason = "hold", f"{busy}/{total} GPUs busy; within the target band"
    out = seen - len(in_service.gpus)
    if out and total:
        reason += f"; {out} drained node(s) not counted"
    return CapacityEvaluated(
        source=SOURCE, nodes_seen=seen, nodes_drained=out, gpus_total=total, gpus_busy=busy, decision=decision, reason=reason,
    )


def evaluate_demand(
    reading: Demand | DemandUnavailable,
    scaler: Scaler,
    latest: dict[str, NodeLoad],
    now: datetime,
    *,
    busy_util_pct: int,
    stale_after_s: float,
    drained: frozenset[str] = frozenset(),
    idle_since: dict[str, datetime] | None = None,
) -> CapacityEvaluated:
    """The queue's decision; a reading that failed holds, saying why."""
    seen, in_service = supply(latest, now, stale_after_s=stale_after_s, drained=drained, idle_since=idle_since)
    busy = _busy(latest, in_service, busy_util_pct)
    common = {"source": SOURCE, "nodes_seen": seen, "nodes_drained": seen - len(in_service.gpus),
              "gpus_total": in_service.total, "gpus_busy": busy}
    if isinstance(reading, DemandUnavailable):
        return CapacityEvaluated(**common, decision="hold", reason=f"no decision: {reading}"[:1000], demand_error=str(reading)[:500])
    decided = scaler.decide(reading, in_service, now)
    return CapacityEvaluated(
        **common, decision=decided.decision, reason=decided.reason[:1000], queued=reading.queued, in_progress=reading.in_progress,
        gpus_wanted=decided.gpus_wanted, change_gpus=decided.change_gpus, release=decided.release[:100],
    )


def _busy(latest: dict[str, NodeLoad], in_service: Supply, busy_util_pct: int) -> int:
    """GPUs above the busy threshold on the nodes in service."""
    return sum(len(s.busy(busy_util_pct)) for s in latest.values() if s.node_id in in_service.gpus)
