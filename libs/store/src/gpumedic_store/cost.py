"""What an incident cost: the GPU time it kept from work, and its price.

GPU time is lost in stretches, each with a number of GPUs, from a start to the incident's end
(or now, while it is open), or to its rented worker's termination if that came first (the
provider bills no more: a repeat offender's incident stays open for days after its worker ended):
- a GPU held idle (a zombie job, a leftover holder, a stuck or idle job, a job count with nothing
  behind it): its GPU, or the node's GPUs where the incident names none, from when it went idle
  (the idle time in the evidence, before the incident opened);
- a GPU gone (`gpu_lost`): that GPU from the incident's start;
- a rented worker billed for nothing (stuck spawning, a stale heartbeat, one the task database does
  not know, one that vanished, one on trial or failing its burn-in): its GPUs, from when it was
  rented or went silent;
- a drained node: every GPU of the node from the drain on (this replaces the stretches before it).
A container's death, a job killed, and the other kinds are counted as no GPU time: what a killed
job loses since its last checkpoint is not known here.

The price of a GPU-hour is the provider's for a rented worker (its price over its GPUs), else the
inventory's `price_per_gpu_hour` for the node; with neither, the GPU-hours are known and the
dollars are not. `Cost` is kept with the incident (report-builder writes it on every event of the
incident) and read back by `gpumedic cost` and the console, which carry an open one up to now.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_store.models import Incident

IDLE_KINDS = {
    # kind -> the evidence field that says how long the GPU had been idle or held when it opened
    "zombie_job": "idle_seconds",
    "orphan_gpu_holder": "held_s",
    "stuck_process": "idle_s",
    "idle_jobs": "idle_s",
    "phantom_jobs": "idle_s",
}
WORKER_KINDS = {
    # kind -> the evidence field that says how long the worker had been billed for nothing
    "stuck_spawning": "billed_s",
    "stale_heartbeat": "heartbeat_age_s",
    "unrecorded_worker": "billed_s",
    "vanished_worker": None,
    "burn_in": "billed_s",
    "burn_in_failed": "billed_s",
}
GONE_KINDS = {"gpu_lost"}


@dataclass(frozen=True)
class Price:
    """What the inventory says of a node: its GPUs, their price, and who rents it out."""

    gpus: int | None = None
    per_gpu_hour: float | None = None
    provider: str | None = None


@dataclass(frozen=True)
class Cost:
    stretches: tuple[tuple[datetime, float], ...]
    """(from when, GPUs out): each stretch lasts until the next one starts, the last until `until`."""
    until: datetime | None
    """When the loss ended (the incident closed, or its worker was terminated); None while it goes on."""
    price_per_gpu_hour: float | None
    price_from: str
    """Where the price came from, in words; empty without one."""
    provider: str | None
    what: str
    """What is counted, in words (or why nothing is)."""

    def gpu_hours(self, now: datetime, *, since: datetime | None = None) -> float:
        """GPU-hours lost up to `now` (or the end), of them only those after `since` if given."""
        end = min(self.until, now) if self.until else now
        total = 0.0
        for i, (start, gpus) in enumerate(self.stretches):
            stop = self.stretches[i + 1][0] if i + 1 < len(self.stretches) else end
            start = max(start, since) if since else start
            total += gpus * max(0.0, (min(stop, end) - start).total_seconds()) / 3600
        return total

    def dollars(self, now: datetime, *, since: datetime | None = None) -> float | None:
        return None if self.price_per_gpu_hour is None else self.gpu_hours(now, since=since) * self.price_per_gpu_hour

    def as_json(self, now: datetime) -> dict[str, Any]:
        """What the incident row keeps, and the event says: the figures as of `now` and how they were made."""
        end = self.until or now  # a closed incident's figures are final, whenever they are asked for
        usd = self.dollars(end)
        return {
            "gpu_hours": round(self.gpu_hours(end), 4), "usd": None if usd is None else round(usd, 2),
            "price_per_gpu_hour": self.price_per_gpu_hour, "price_from": self.price_from, "provider": self.provider, "what": self.what,
            "stretches": [[start.isoformat(), gpus] for start, gpus in self.stretches],
            "until": self.until.isoformat() if self.until else None,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Cost:
        return cls(
            stretches=tuple((datetime.fromisoformat(start), float(gpus)) for start, gpus in doc.get("stretches", ())),
            until=datetime.fromisoformat(doc["until"]) if doc.get("until") else None,
            price_per_gpu_hour=doc.get("price_per_gpu_hour"), price_from=doc.get("price_from", ""),
            provider=doc.get("provider"), what=doc.get("what", ""),
        )


def cost_of(
    *,
    kind: str,
    gpu_index: int | None,
    evidence: Mapping[str, Any],
    opened_at: datetime,
    closed_at: datetime | None,
    drained_at: datetime | None = None,
    terminated_at: datetime | None = None,
    price: Price = Price(),
) -> Cost:
    """The cost of one incident from what it says of itself, when the remediator drained its node
    and terminated its worker (if it did), and what the inventory says of the node."""
    stretches: list[tuple[datetime, float]] = []
    per_gpu = price.per_gpu_hour
    price_from = "the inventory's price_per_gpu_hour" if per_gpu is not None else ""
    provider = price.provider
    node_gpus = price.gpus
    worker_gpus, worker_price = _number(evidence.get("gpus")), _number(evidence.get("price_per_h"))
    if worker_price is not None and worker_gpus:  # a rented worker: its provider's price, whatever the kind
        per_gpu, price_from = worker_price / worker_gpus, f"the provider's ${worker_price:.2f}/h for the worker's {worker_gpus:g} GPU(s)"
        provider = evidence.get("provider") or provider
        node_gpus = int(worker_gpus)
    if kind in IDLE_KINDS:
        gpus = 1 if gpu_index is not None else node_gpus
        before = _seconds(evidence.get(IDLE_KINDS[kind]))
        if gpus:
            stretches.append((opened_at - timedelta(seconds=before), float(gpus)))
        where = f"GPU {gpu_index}" if gpu_index is not None else "the node's GPUs"
        what = f"{where} idle from {before:.0f} s before it opened"
    elif kind in WORKER_KINDS:
        field = WORKER_KINDS[kind]
        before = _seconds(evidence.get(field)) if field else 0.0
        if worker_gpus:
            stretches.append((opened_at - timedelta(seconds=before), float(worker_gpus)))
        what = f"the worker's {worker_gpus or '?'} GPU(s) billed for nothing from {before:.0f} s before it opened"
    elif kind in GONE_KINDS:
        stretches.append((opened_at, 1.0))
        what = f"GPU {gpu_index if gpu_index is not None else '?'} out of service"
    else:
        what = "no GPU time counted for this kind"
    if drained_at is not None and node_gpus:
        stretches = [s for s in stretches if s[0] < drained_at] + [(drained_at, float(node_gpus))]
        what += f"; the node's {node_gpus} GPUs drained from {drained_at.astimezone(UTC):%H:%M:%S}Z"
    elif drained_at is not None:
        what += "; the node was drained, but its GPU count is not known (set gpus in the inventory)"
    if stretches and per_gpu is None:
        what += "; no price (set price_per_gpu_hour in the inventory)"
    until = closed_at
    if terminated_at is not None and (closed_at is None or terminated_at < closed_at):
        until = terminated_at
        what += f"; until the worker was terminated at {terminated_at.astimezone(UTC):%H:%M:%S}Z"
    return Cost(tuple(stretches), until, per_gpu, price_from, provider, what)


def _seconds(value: Any) -> float:
    number = _number(value)
    return number if number is not None and number > 0 else 0.0


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return float(value) if value == value and abs(value) != float("inf") else None


# --- summed up: `gpumedic cost`, the console's cost page ---------------------------------------

BY = ("kind", "node", "provider", "day")


@dataclass
class CostLine:
    group: str
    """The kind, node, provider or day (YYYY-MM-DD) these figures are of."""
    incidents: int = 0
    gpu_hours: float = 0.0
    usd: float = 0.0
    unpriced_gpu_hours: float = 0.0
    """GPU-hours of incidents with no price: in `gpu_hours`, not in `usd`."""


async def costs_since(session: AsyncSession, since: datetime, now: datetime) -> list[tuple[Incident, Cost]]:
    """Every incident that lost GPU time after `since`: still open, or closed since then."""
    rows = await session.scalars(
        select(Incident).where(Incident.cost.is_not(None), or_(Incident.closed_at.is_(None), Incident.closed_at >= since))
    )
    out = []
    for incident in rows:
        cost = Cost.from_json(incident.cost)
        if cost.stretches and cost.gpu_hours(now, since=since) > 0:
            out.append((incident, cost))
    return out


def summed(costs: list[tuple[Incident, Cost]], *, by: str, since: datetime, now: datetime) -> list[CostLine]:
    """The GPU-hours lost after `since` and their price, summed by `by` (one of BY), largest first;
    by day, each day's share of each incident, oldest day first."""
    if by not in BY:
        raise ValueError(f"by must be one of {', '.join(BY)}, not {by!r}")
    lines: dict[str, CostLine] = {}

    def add(group: str, cost: Cost, start: datetime, end: datetime) -> None:
        hours = cost.gpu_hours(end, since=start)
        if hours <= 0:
            return
        line = lines.setdefault(group, CostLine(group))
        line.incidents += 1
        line.gpu_hours += hours
        if cost.price_per_gpu_hour is None:
            line.unpriced_gpu_hours += hours
        else:
            line.usd += hours * cost.price_per_gpu_hour

    for incident, cost in costs:
        if by == "day":
            day = since.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
            while day < now:
                add(f"{day:%Y-%m-%d}", cost, max(day, since), min(day + timedelta(days=1), now))
                day += timedelta(days=1)
        else:
            group = {"kind": incident.kind, "node": incident.node_id, "provider": cost.provider or "(none named)"}[by]
            add(group, cost, since, now)
    if by == "day":
        return [lines[k] for k in sorted(lines)]
    return sorted(lines.values(), key=lambda line: (-line.usd, -line.gpu_hours, line.group))
