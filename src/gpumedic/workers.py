"""What `gpumedic workers` prints: runbook 001's workers table (id, status, heartbeat age, host,
$/h, task), from the autoscaler's latest round as report-builder kept it."""

from __future__ import annotations

from gpumedic.output import clip, fmt_time, table, to_json
from gpumedic_store import views


async def workers_text(store_url: str, *, status: str | None = None, as_json: bool = False) -> str:
    async with views.store_session(store_url) as session:
        check = await views.latest_capacity_check(session)
    if check is None:
        return "no capacity round recorded (is the autoscaler running with a provider?)"
    rows = [r for r in check.worker_rows if status is None or status in (r.get("status"), r.get("record_status"))]
    if as_json:
        return to_json({"checked_at": check.checked_at, "error": check.error, "workers": rows})
    head = f"as of the autoscaler's round at {fmt_time(check.checked_at)}"
    if check.error:
        head += f" (it made no decision: {clip(check.error, 200)})"
    if not rows:
        return f"{head}: no worker{f' {status}' if status else ''}"
    lines = [head, table(
        ["WORKER", "STATUS", "RECORD", "HEARTBEAT", "HOST", "GPUS", "$/H", "TASK", "IN SERVICE"],
        [[clip(r["worker_id"], 40), r["status"], r.get("record_status") or "-", _age(r.get("heartbeat_age_s")),
          r.get("host") or "-", f"{r.get('gpus', 0)}x {clip(r.get('gpu_type') or '?', 24)}", f"{r.get('price_per_h', 0.0):.2f}",
          clip(r.get("task") or "-", 40), "yes" if r.get("in_service") else "no"] for r in rows],
        right=("HEARTBEAT", "$/H"),
    )]
    cost = sum(r.get("price_per_h", 0.0) for r in rows)
    lines.append(f"{len(rows)} worker(s), {sum(1 for r in rows if r.get('in_service'))} in service, ${cost:.2f}/h")
    return "\n".join(lines)


def _age(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds / 60:.1f}m" if seconds >= 60 else f"{seconds:.0f}s"
