"""What `gpumedic cost` prints: the GPU-hours incidents kept from work over a span, and their
price, summed by kind, node, provider or day (`gpumedic_store.cost`)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpumedic.output import fmt_time, table, to_json
from gpumedic_store import views
from gpumedic_store.cost import CostLine, costs_since, summed


async def cost_text(store_url: str, *, since: timedelta, by: str, as_json: bool = False, now: datetime | None = None) -> str:
    now = now or datetime.now(UTC)
    start = now - since
    async with views.store_session(store_url) as session:
        costs = await costs_since(session, start, now)
    lines = summed(costs, by=by, since=start, now=now)
    total = CostLine("total", incidents=len(costs), gpu_hours=sum(c.gpu_hours for c in lines), usd=sum(c.usd for c in lines),
                     unpriced_gpu_hours=sum(c.unpriced_gpu_hours for c in lines))
    if as_json:
        return to_json({"since": start, "until": now, "by": by, "lines": lines, "total": total})
    head = f"GPU time lost to incidents from {fmt_time(start)} to {fmt_time(now)}, by {by}"
    if not lines:
        return f"{head}: none (no incident kept a GPU from work in that span)"
    rows = [(c.group, c.incidents, f"{c.gpu_hours:.2f}", f"{c.usd:,.2f}", f"{c.unpriced_gpu_hours:.2f}" if c.unpriced_gpu_hours else "-")
            for c in [*lines, total]]
    out = [head, table([by, "incidents", "GPU-hours", "$", "GPU-hours without a price"], rows,
                       right=("incidents", "GPU-hours", "$", "GPU-hours without a price"))]
    if total.unpriced_gpu_hours:
        out.append("Some GPU time has no price: set price_per_gpu_hour (and gpus) in the inventory report-builder reads "
                   "(GPUMEDIC_REPORTS_INVENTORY; the embedded stack reads the remediator's).")
    if by == "day":
        out.append("A day's figure is the share of each incident that fell on it (UTC days).")
    return "\n".join(out)
