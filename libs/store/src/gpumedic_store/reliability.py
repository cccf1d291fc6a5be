"""How reliable each host and provider was: what `gpumedic report reliability` says, as evidence a
team can send a provider.

Per host (a node of the inventory, or the provider's machine a rented worker ran on, where its
incidents name it) and per provider, over a span:
- GPU-days observed: the GPU-minutes its samples covered (`NodeDay`, which report-builder keeps
  from the minute history, a row per node and day);
- incidents by kind, and per 100 GPU-days (those of the fleet, the pool or the peer cluster as a
  whole, and informational ones, are no host's);
- mean time to detect: how long the fault had lasted when its incident opened, where the evidence
  says (a GPU's idle time before a zombie was found, a worker's billed time before it was called
  stuck); mean time to repair: opened to resolved, for those fixed or cleared;
- availability: the share of observed GPU-hours not lost to incidents (`gpumedic_store.cost`);
- goodput: the share of observed GPU-hours its GPUs were at work (utilisation of BUSY_PCT or more).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from sqlalchemy import delete, insert, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_events import WHOLE_KINDS, IncidentKind
from gpumedic_store.cost import IDLE_KINDS, WORKER_KINDS, Cost
from gpumedic_store.history import Minute
from gpumedic_store.models import Incident, NodeDay

BUSY_PCT = 10.0
"""A GPU-minute at this mean utilisation or more counts as work."""
NOT_A_HOST = {k.value for k in WHOLE_KINDS} | {IncidentKind.REPEAT_OFFENDER.value}
"""Incidents of the fleet, the worker pool or the peer cluster as a whole (no host's doing), and the
repeat offender (it counts incidents already counted)."""


def day_of(at: datetime) -> datetime:
    return at.astimezone(UTC).replace(hour=0, minute=0, second=0, microsecond=0)


async def count_days(session: AsyncSession, minutes: Mapping[str, Sequence[Minute]], providers: Mapping[str, str | None]) -> None:
    """Add these minutes to their nodes' days (a minute is counted once: the writer passes each once)."""
    add: dict[tuple[str, datetime], list[int]] = {}
    for node_id, these in minutes.items():
        for m in these:
            utils = [v for name, v in m.figures.items() if name.startswith("gpu") and name.endswith(".util_pct") and v is not None]
            counts = add.setdefault((node_id, day_of(m.minute)), [0, 0, 0])
            counts[0] += 1
            counts[1] += len(utils)
            counts[2] += sum(1 for v in utils if v >= BUSY_PCT)
    if not add:
        return
    rows = await session.execute(
        select(NodeDay.node_id, NodeDay.day, NodeDay.sampled_minutes, NodeDay.gpu_minutes, NodeDay.busy_gpu_minutes).where(
            NodeDay.node_id.in_({n for n, _ in add}), NodeDay.day.in_({d for _, d in add})
        )
    )
    known = {(n, d): (s, g, b) for n, d, s, g, b in rows}
    inserts, updates = [], []
    for (node_id, day), (sampled, gpus, busy) in add.items():
        row = {"node_id": node_id, "day": day, "provider": providers.get(node_id)}
        if (node_id, day) in known:
            s, g, b = known[(node_id, day)]
            updates.append(row | {"sampled_minutes": s + sampled, "gpu_minutes": g + gpus, "busy_gpu_minutes": b + busy})
        else:
            inserts.append(row | {"sampled_minutes": sampled, "gpu_minutes": gpus, "busy_gpu_minutes": busy})
    if inserts:
        await session.execute(insert(NodeDay), inserts)
    if updates:
        await session.execute(update(NodeDay), updates)


async def prune_days(session: AsyncSession, before: datetime) -> int:
    result = await session.execute(delete(NodeDay).where(NodeDay.day < day_of(before)))
    return result.rowcount or 0


@dataclass
class Figures:
    """One host's or provider's record over the span."""

    group: str
    provider: str | None = None
    gpu_minutes: int = 0
    busy_gpu_minutes: int = 0
    incidents: Counter[str] = field(default_factory=Counter)
    detect_s: list[float] = field(default_factory=list)
    repair_s: list[float] = field(default_factory=list)
    lost_gpu_hours: float = 0.0
    lost_usd: float = 0.0
    nodes: set[str] = field(default_factory=set)

    @property
    def gpu_days(self) -> float:
        return self.gpu_minutes / 1440

    @property
    def incident_count(self) -> int:
        return sum(self.incidents.values())

    @property
    def per_100_gpu_days(self) -> float | None:
        return 100 * self.incident_count / self.gpu_days if self.gpu_minutes else None

    @property
    def mttd_s(self) -> float | None:
        return sum(self.detect_s) / len(self.detect_s) if self.detect_s else None

    @property
    def mttr_s(self) -> float | None:
        return sum(self.repair_s) / len(self.repair_s) if self.repair_s else None

    @property
    def availability(self) -> float | None:
        observed = self.gpu_minutes / 60
        return max(0.0, 1 - self.lost_gpu_hours / observed) if observed else None

    @property
    def goodput(self) -> float | None:
        return self.busy_gpu_minutes / self.gpu_minutes if self.gpu_minutes else None

    def as_json(self) -> dict:
        return {
            "group": self.group, "provider": self.provider, "nodes": sorted(self.nodes), "gpu_days": round(self.gpu_days, 3),
            "incidents": self.incident_count, "incidents_by_kind": dict(sorted(self.incidents.items())),
            "incidents_per_100_gpu_days": _round(self.per_100_gpu_days, 2), "mttd_s": _round(self.mttd_s, 1), "mttr_s": _round(self.mttr_s, 1),
            "availability": _round(self.availability, 4), "goodput": _round(self.goodput, 4),
            "lost_gpu_hours": round(self.lost_gpu_hours, 3), "lost_usd": round(self.lost_usd, 2),
        }


@dataclass(frozen=True)
class Reliability:
    since: datetime
    until: datetime
    hosts: list[Figures]
    providers: list[Figures]
    fleet: Figures


async def reliability(session: AsyncSession, since: datetime, now: datetime) -> Reliability:
    """Every host's and provider's figures from `since` to `now`, the least reliable first."""
    incidents = [
        i for i in await session.scalars(select(Incident).where(Incident.opened_at >= since, Incident.opened_at <= now))
        if i.kind not in NOT_A_HOST and i.severity != "info"
    ]
    # a rented worker is its provider's machine wherever one of its incidents names it: its samples
    # and all its incidents count there, whatever pod id they were kept under
    node_host = {i.node_id: str(i.evidence["host_id"]) for i in incidents if (i.evidence or {}).get("host_id")}
    hosts: dict[str, Figures] = {}
    providers_of: dict[str, str | None] = {}
    days = await session.execute(
        select(NodeDay.node_id, NodeDay.provider, NodeDay.gpu_minutes, NodeDay.busy_gpu_minutes).where(NodeDay.day >= day_of(since))
    )
    for node_id, provider, gpu_minutes, busy in days:
        host = node_host.get(node_id, node_id)
        figures = hosts.setdefault(host, Figures(host, provider))
        figures.provider = figures.provider or provider
        figures.gpu_minutes += gpu_minutes
        figures.busy_gpu_minutes += busy
        figures.nodes.add(node_id)
        providers_of[node_id] = provider
    for incident in incidents:
        evidence = incident.evidence or {}
        host = node_host.get(incident.node_id, incident.node_id)
        cost = Cost.from_json(incident.cost) if incident.cost else None
        provider = (cost.provider if cost else None) or evidence.get("provider") or providers_of.get(incident.node_id)
        figures = hosts.setdefault(host, Figures(host, provider))
        figures.provider = figures.provider or provider
        figures.nodes.add(incident.node_id)
        figures.incidents[incident.kind] += 1
        before = evidence.get(IDLE_KINDS.get(incident.kind) or WORKER_KINDS.get(incident.kind) or "")
        if isinstance(before, int | float) and not isinstance(before, bool) and before > 0:
            figures.detect_s.append(float(before))
        if incident.status == "resolved" and incident.closed_at:
            figures.repair_s.append((incident.closed_at - incident.opened_at).total_seconds())
        if cost is not None:
            figures.lost_gpu_hours += cost.gpu_hours(now, since=since)
            figures.lost_usd += cost.dollars(now, since=since) or 0.0
    by_provider: dict[str, Figures] = {}
    fleet = Figures("the fleet")
    for figures in hosts.values():
        for target in (by_provider.setdefault(figures.provider or "(none named)", Figures(figures.provider or "(none named)")), fleet):
            target.gpu_minutes += figures.gpu_minutes
            target.busy_gpu_minutes += figures.busy_gpu_minutes
            target.incidents.update(figures.incidents)
            target.detect_s += figures.detect_s
            target.repair_s += figures.repair_s
            target.lost_gpu_hours += figures.lost_gpu_hours
            target.lost_usd += figures.lost_usd
            target.nodes |= figures.nodes
    return Reliability(since, now, sorted(hosts.values(), key=_worst_first), sorted(by_provider.values(), key=_worst_first), fleet)


def _worst_first(f: Figures) -> tuple:
    """Most incidents per GPU-day first (incidents with no GPU-days observed first of all), then the least available."""
    rate = f.per_100_gpu_days if f.per_100_gpu_days is not None else (float("inf") if f.incident_count else 0.0)
    return (-rate, f.availability if f.availability is not None else 1.0, f.group)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
