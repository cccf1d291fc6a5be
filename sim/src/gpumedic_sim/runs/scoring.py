"""Scoring a simulated run: what was scripted (ground truth) against the incidents detectors opened.

Each scripted fault or benign behaviour carries its answer key, `InjectedFault.expect`: the
incident kinds that rightly describe it, written from what the simulation does (`sim.state`),
never from a detector's rules. Empty means "must open no node incident": a job that finished, a
container the node stopped on purpose, a checkpoint pause, an application's own XID.

`score` matches incidents to injections on the same node from 1 s before the injection to
`window_s` after:

- the first incident of each expected kind detects its fault; a fault on one GPU is found only by
  an incident that names that GPU (unless its answer key says the incident is the node's,
  `Entry.whole_node`), so a node-wide incident does not find a GPU's fault;
- a second incident of the same kind for the same fault is a duplicate: a person was told twice,
  so it counts against precision;
- every other incident is a false positive, put down to the injection it came with (a wrong
  kind for a fault, or a benign behaviour that opened one), else to nothing at all;
- a fleet incident (node "fleet") is right when a node incident linked to it was right.

Precision is right incidents over all incidents; recall is detected faults over faults that
expect an incident. `render` prints the table, `Score.to_dict` the JSON.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta

from gpumedic_events import IncidentKind, IncidentOpened
from pydantic import BaseModel, ConfigDict, Field

from gpumedic_sim.faults import FAULTS, Benign, Fault, InjectedFault

DEFAULT_WINDOW_S = 120.0
EARLY_S = 1.0
"""An incident up to this long before the recorded injection still counts (clocks, ordering)."""


@dataclass(frozen=True)
class Observed:
    """An incident a detector opened, as the score sees it."""

    at: datetime
    incident_id: str
    node_id: str
    gpu: int | None
    kind: str
    detector: str
    summary: str = ""
    related_to: str | None = None
    """The fleet incident it is part of, if any."""
    severity: str = "warning"

    @classmethod
    def from_event(cls, event: IncidentOpened) -> Observed:
        return cls(
            at=event.occurred_at,
            incident_id=str(event.incident_id),
            node_id=event.node_id,
            gpu=event.gpu_index,
            kind=event.kind.value if isinstance(event.kind, IncidentKind) else str(event.kind),
            detector=event.source,
            summary=event.summary,
            related_to=str(event.related_incident_id) if event.related_incident_id else None,
            severity=event.severity,
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "at": _iso(self.at), "incident_id": self.incident_id, "node_id": self.node_id, "gpu": self.gpu,
            "kind": self.kind, "detector": self.detector, "summary": self.summary, "related_to": self.related_to,
        }


@dataclass(frozen=True)
class Outcome:
    """One injection and the incidents it drew."""

    injection: InjectedFault
    right: tuple[Observed, ...]
    """Incidents of an expected kind."""
    wrong: tuple[Observed, ...]
    """Incidents it drew of a kind it does not expect: false positives."""

    @property
    def expects_incident(self) -> bool:
        return bool(self.injection.expect)

    @property
    def detected(self) -> bool:
        return bool(self.right)

    @property
    def latency_s(self) -> float | None:
        if not self.right:
            return None
        return max(0.0, (min(x.at for x in self.right) - self.injection.at).total_seconds())

    def to_dict(self) -> dict[str, object]:
        i = self.injection
        return {
            "at": _iso(i.at), "node_id": i.node_id, "gpu": i.gpu, "injected": i.fault, "expect": sorted(i.expect),
            "detected": self.detected, "latency_s": _round(self.latency_s),
            "right": [x.to_dict() for x in self.right], "wrong": [x.to_dict() for x in self.wrong],
        }


@dataclass(frozen=True)
class KindScore:
    """One injected kind's line: a fault or a benign behaviour."""

    kind: str
    expect: tuple[str, ...]
    injected: int
    detected: int
    missed: int
    false_positives: int
    latency_median_s: float | None
    latency_max_s: float | None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind, "expect": list(self.expect), "injected": self.injected, "detected": self.detected,
            "missed": self.missed, "false_positives": self.false_positives,
            "latency_median_s": _round(self.latency_median_s), "latency_max_s": _round(self.latency_max_s),
        }


@dataclass(frozen=True)
class Score:
    window_s: float
    outcomes: tuple[Outcome, ...]
    """Every distinct injection, by time."""
    incidents: tuple[Observed, ...]
    """Every incident opened, by time."""
    false_positives: tuple[Observed, ...]
    """Incidents that were not right, by time."""
    duplicate_injections: int

    @property
    def expected(self) -> int:
        return sum(1 for o in self.outcomes if o.expects_incident)

    @property
    def detected(self) -> int:
        return sum(1 for o in self.outcomes if o.expects_incident and o.detected)

    @property
    def missed(self) -> tuple[Outcome, ...]:
        return tuple(o for o in self.outcomes if o.expects_incident and not o.detected)

    @property
    def precision(self) -> float | None:
        """Right incidents / all incidents; None without any incident."""
        n = len(self.incidents)
        return (n - len(self.false_positives)) / n if n else None

    @property
    def recall(self) -> float | None:
        """Faults detected with a right incident / faults that expect one; None without any."""
        return self.detected / self.expected if self.expected else None

    @property
    def kinds(self) -> tuple[KindScore, ...]:
        """One line per injected kind: faults in `Fault` order, then benign behaviours."""
        order = {k.value: i for i, k in enumerate([*Fault, *Benign])}
        groups: dict[str, list[Outcome]] = {}
        for o in self.outcomes:
            groups.setdefault(str(o.injection.fault), []).append(o)
        lines = []
        for name in sorted(groups, key=lambda k: (order.get(k, len(order)), k)):
            group = groups[name]
            latencies = [s for o in group if (s := o.latency_s) is not None]
            expect = sorted({k for o in group for k in o.injection.expect})
            lines.append(
                KindScore(
                    kind=name,
                    expect=tuple(expect),
                    injected=len(group),
                    detected=sum(1 for o in group if o.expects_incident and o.detected),
                    missed=sum(1 for o in group if o.expects_incident and not o.detected),
                    false_positives=sum(len(o.wrong) for o in group),
                    latency_median_s=statistics.median(latencies) if latencies else None,
                    latency_max_s=max(latencies) if latencies else None,
                )
            )
        return tuple(lines)

    def to_dict(self) -> dict[str, object]:
        return {
            "window_s": self.window_s,
            "totals": {
                "injected": len(self.outcomes),
                "expect_incident": self.expected,
                "detected": self.detected,
                "missed": len(self.missed),
                "incidents": len(self.incidents),
                "false_positives": len(self.false_positives),
                "precision": _round(self.precision, 4),
                "recall": _round(self.recall, 4),
                "duplicate_injections": self.duplicate_injections,
            },
            "kinds": [k.to_dict() for k in self.kinds],
            "injections": [o.to_dict() for o in self.outcomes],
            "false_positives": [x.to_dict() for x in self.false_positives],
        }


class Expectations(BaseModel):
    """What a run of a scenario must reach (its `expect:`); `gpumedic sim` exits 1 when it falls short."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    recall: float | None = Field(default=None, ge=0, le=1, description="At least this share of the faults found.")
    precision: float | None = Field(default=None, ge=0, le=1, description="At least this share of the incidents right.")
    false_positives: int | None = Field(default=None, ge=0, description="At most this many incidents that were not right.")

    def shortfalls(self, result: Score) -> list[str]:
        """What the run fell short of, one sentence each; empty when it met every expectation (a
        share with nothing to measure, such as recall without a fault, is met)."""
        short = []
        for name in ("recall", "precision"):
            wanted, got = getattr(self, name), getattr(result, name)
            if wanted is not None and got is not None and got < wanted:
                short.append(f"{name} {_pct(got)}, expected at least {_pct(wanted)}")
        if self.false_positives is not None and len(result.false_positives) > self.false_positives:
            short.append(f"{len(result.false_positives)} false positive(s), expected at most {self.false_positives}")
        return short


def score(injected: Sequence[InjectedFault], incidents: Sequence[Observed], *, window_s: float = DEFAULT_WINDOW_S) -> Score:
    if window_s < 0:
        raise ValueError("window_s must be 0 or more")
    injections: dict[tuple, InjectedFault] = {}
    for i in injected:
        i = i._replace(at=_aware(i.at), fault=str(i.fault))
        injections.setdefault((i.at, i.node_id, i.gpu, i.fault), i)
    ordered = sorted(injections.values(), key=lambda i: (i.at, i.node_id, -1 if i.gpu is None else i.gpu, i.fault))
    seen: dict[str, Observed] = {}
    for x in incidents:
        seen.setdefault(x.incident_id, replace(x, at=_aware(x.at)))
    observed = sorted(seen.values(), key=lambda x: (x.at, x.node_id, x.kind, x.incident_id))

    early, late = timedelta(seconds=EARLY_S), timedelta(seconds=window_s)

    def drew(i: InjectedFault, x: Observed) -> bool:
        same_gpu = i.gpu is None or x.gpu is None or i.gpu == x.gpu
        return x.node_id == i.node_id and same_gpu and i.at - early <= x.at <= i.at + late

    def found(i: InjectedFault, x: Observed) -> bool:
        on_its_gpu = i.gpu is None or x.gpu == i.gpu or (i.fault in FAULTS and FAULTS[i.fault].whole_node)
        return x.kind in i.expect and drew(i, x) and on_its_gpu

    right: dict[str, list[Observed]] = {}
    right_ids: set[str] = set()
    for i in ordered:
        hits = [x for x in observed if found(i, x)]
        right[_key(i)] = [x for n, x in enumerate(hits) if x.kind not in {h.kind for h in hits[:n]}]  # the first of each kind
        right_ids.update(x.incident_id for x in right[_key(i)])
    # A fleet incident is right when it grouped node incidents that were right.
    right_ids.update(x.related_to for x in observed if x.incident_id in right_ids and x.related_to)

    wrong: dict[str, list[Observed]] = {}
    false_positives = []
    for x in observed:
        if x.incident_id in right_ids:
            continue
        false_positives.append(x)
        cause = next((i for i in reversed(ordered) if drew(i, x)), None)
        if cause is not None:
            wrong.setdefault(_key(cause), []).append(x)
    outcomes = tuple(Outcome(i, tuple(right[_key(i)]), tuple(wrong.get(_key(i), ()))) for i in ordered)
    return Score(window_s, outcomes, tuple(observed), tuple(false_positives), len(injected) - len(injections))


def _key(i: InjectedFault) -> str:
    return f"{i.at.isoformat()}|{i.node_id}|{i.gpu}|{i.fault}"


# --- rendering ----------------------------------------------------------------------------------

_HEADER = ("injected", "n", "expected incident", "detected", "missed", "false pos.", "to incident med/max")


def render(result: Score) -> str:
    """The score as a fixed-width table for a terminal, then what went wrong, then a summary."""
    rows = [_HEADER]
    for k in result.kinds:
        expects = bool(k.expect)
        rows.append(
            (
                k.kind,
                str(k.injected),
                "/".join(k.expect) if expects else "none",
                f"{k.detected}/{k.injected}" if expects else "-",
                str(k.missed) if expects else "-",
                str(k.false_positives),
                _span(k.latency_median_s, k.latency_max_s),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0]), row[1].rjust(widths[1]), row[2].ljust(widths[2])]
        cells += [cell.rjust(w) for cell, w in zip(row[3:], widths[3:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if not result.outcomes:
        lines.append("(nothing injected)")
    lines.append("")
    for o in result.missed:
        i = o.injection
        lines.append(f"missed: {i.fault} on {_where(i.node_id, i.gpu)} at {_iso(i.at)} (expected {'/'.join(sorted(i.expect))})")
    if result.false_positives:
        lines.append(f"false positives ({len(result.false_positives)}):")
        causes = {x.incident_id: o for o in result.outcomes for x in o.wrong}
        for x in result.false_positives:
            because = _why_wrong(x, causes.get(x.incident_id))
            lines.append(f"  {_iso(x.at)}  {x.kind} on {_where(x.node_id, x.gpu)}  ({because})")
    else:
        lines.append("false positives: none")
    if result.duplicate_injections:
        lines.append(f"injections recorded twice, counted once: {result.duplicate_injections}")
    lines.append(
        f"summary: {len(result.outcomes)} injected, {result.expected} expect an incident; detected {result.detected} "
        f"(recall {_pct(result.recall)}); {len(result.incidents)} incidents, {len(result.false_positives)} false "
        f"positive{'' if len(result.false_positives) == 1 else 's'} (precision {_pct(result.precision)}); window {result.window_s:g}s"
    )
    return "\n".join(lines)


def _why_wrong(x: Observed, cause: Outcome | None) -> str:
    if cause is None:
        return "with nothing injected there"
    i = cause.injection
    where = _where(i.node_id, i.gpu)
    if x.kind not in i.expect:
        return f"with {i.fault} on {where}"
    if any(r.kind == x.kind for r in cause.right):
        return f"a second {x.kind} for {i.fault} on {where}"
    return f"for {i.fault} on {where}, but it names {'no GPU' if x.gpu is None else f'GPU {x.gpu}'}"


def _where(node_id: str, gpu: int | None) -> str:
    return node_id if gpu is None else f"{node_id} GPU {gpu}"


def _span(median: float | None, worst: float | None) -> str:
    return "-" if median is None or worst is None else f"{median:.1f}s/{worst:.1f}s"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


def _aware(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _iso(at: datetime) -> str:
    at = _aware(at).astimezone(UTC)
    return at.isoformat(timespec="milliseconds" if at.microsecond else "seconds").replace("+00:00", "Z")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
