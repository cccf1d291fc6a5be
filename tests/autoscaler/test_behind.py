"""The autoscaler scales on nothing its samples have not shown: while its samples consumer is
behind, each round holds and says why, and once caught up every idle clock starts afresh."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

from autoscaler.handlers import CapacityHandlers
from autoscaler.scaling import NodeLoad
from autoscaler.settings import Settings
from gpumedic_bus.consume import Lag


def _handlers(lags: list[Lag]) -> CapacityHandlers:
    runtime = SimpleNamespace(lags=lambda: lags)
    detector = SimpleNamespace(logic=None)  # a round that ran would need it: none may run while behind
    return CapacityHandlers(runtime, Settings(), detector, behind_after_s=10.0)  # type: ignore[arg-type]


async def test_while_behind_its_samples_the_autoscaler_holds_and_then_counts_idle_afresh():
    lags = [Lag("autoscaler-samples", pending=40_000, behind_s=35.0)]
    handlers = _handlers(lags)
    long_ago = datetime.now(UTC) - timedelta(hours=2)
    handlers.latest = {"n1": NodeLoad("n1", long_ago, (0, 0)), "n2": NodeLoad("n2", long_ago, (90, 95))}
    handlers.idle_since = {"n1": long_ago}  # idle for two hours, as far as the samples seen go
    held = await handlers.evaluate_once()
    assert (held.decision, held.nodes_seen, held.gpus_total, held.gpus_busy) == ("hold", 2, 4, 2)
    assert held.reason.startswith("samples 35s behind (40,000 waiting): no scaling")
    lags[:] = [Lag("autoscaler-samples", pending=0, behind_s=0.0)]
    assert handlers._held_behind() is None
    assert handlers.idle_since["n1"] > datetime.now(UTC) - timedelta(seconds=5)  # its idle clock starts again now
