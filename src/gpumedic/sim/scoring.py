"""Scoring a simulated run: the faults injected (ground truth) against what the system reported.

What the system reports becomes `Finding`s: an incident a detector opened (kind = its
`IncidentKind`, e.g. "zombie_job"), or a signal a node surfaced on the bus (an XID, a lost GPU, an
OOM kill, a container exit, a full disk, a process holding a GPU for a container that is gone, a
sampler gone quiet ...). `EVIDENCE` says which finding kinds count as seeing each fault kind.

The two are kept apart on purpose: "the sampler surfaced the signal" means the data was on the
bus; "a detector opened an incident" means gpumedic noticed and would act. Today only zombie_job
has a detector, so for every other kind the incident column reads "-".

`score` matches each injected fault to the findings on its node (and its GPU, when both name
one) within [at - 1 s, at + window]; `render` prints the table, `Score.to_dict` the JSON.
"""

from __future__ import annotations

import re
import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from types import MappingProxyType

from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ContainerExited,
    Event,
    GpuLost,
    GpuXidReported,
    IncidentKind,
    IncidentOpened,
    NodeSampled,
    ProcessOomKilled,
)

from gpumedic.sim.scenario import FaultKind
from gpumedic.sim.state import InjectedFault

DEFAULT_WINDOW_S = 120.0
EARLY_S = 1.0
"""A finding up to this long before the recorded injection still counts (clocks, ordering)."""
DISK_FULL_PCT = 98.0


class Signal:
    """The kinds of finding that are raw node events (not a detector's judgement)."""

    XID = "xid"
    GPU_LOST = "gpu_lost_reported"
    OOM_KILL = "oom_kill"
    """The kernel's OOM killer ended a process (kernel log)."""
    CONTAINER_OOM_KILLED = "container_oom_killed"
    """The container engine says the container was OOM-killed."""
    EXIT_137 = "container_exit_137"
    EXIT_139 = "container_exit_139"
    EXIT_143 = "container_exit_143"
    EXIT_OTHER = "container_exit_other"
    GPU_OOM_IN_LOGS = "gpu_oom_in_logs"
    DEVICE_BUSY_IN_LOGS = "device_busy_in_logs"
    DISK_FULL = "disk_full"
    ORPHAN_HOLDER = "orphan_holder"
    SAMPLER_SILENT = "sampler_silent"
    NVML_MISSING = "nvml_missing"
    STATUS_PROBE_FAILED = "status_probe_failed"
    SSH_REFUSED = "ssh_refused"
    SSH_TIMEOUT = "ssh_timeout"


SIGNAL_KINDS: frozenset[str] = frozenset(v for k, v in vars(Signal).items() if k.isupper())
INCIDENT_KINDS: frozenset[str] = frozenset(k.value for k in IncidentKind)
"""Finding kinds that are incidents a detector opened; disjoint from `SIGNAL_KINDS`."""

EVIDENCE: Mapping[FaultKind, frozenset[str]] = MappingProxyType(
    {
        FaultKind.ZOMBIE_JOB: frozenset({IncidentKind.ZOMBIE_JOB.value}),
        FaultKind.ORPHAN_GPU_HOLDER: frozenset({Signal.ORPHAN_HOLDER, Signal.DEVICE_BUSY_IN_LOGS}),
        FaultKind.OOM_KILL: frozenset({Signal.OOM_KILL, Signal.EXIT_137, Signal.CONTAINER_OOM_KILLED}),
        FaultKind.SEGFAULT: frozenset({Signal.EXIT_139}),
        FaultKind.SIGTERM: frozenset({Signal.EXIT_143}),
        FaultKind.DISK_FULL: frozenset({Signal.DISK_FULL}),
        FaultKind.GPU_OOM: frozenset({Signal.GPU_OOM_IN_LOGS}),
        FaultKind.XID: frozenset({Signal.XID}),
        FaultKind.GPU_LOST: frozenset({Signal.GPU_LOST, Signal.XID}),
        FaultKind.SSH_REFUSES: frozenset({Signal.SSH_REFUSED}),
        FaultKind.SSH_HANGS: frozenset({Signal.SSH_TIMEOUT}),
        FaultKind.SAMPLER_SILENT: frozenset({Signal.SAMPLER_SILENT}),
        FaultKind.NVML_MISSING: frozenset({Signal.NVML_MISSING}),
        FaultKind.STATUS_BLOCKED: frozenset({Signal.STATUS_PROBE_FAILED}),
    }
)
"""Which finding kinds count as seeing each fault kind: incident kinds (a detector) and signal
kinds (raw node events) together; split them with `incident_evidence` / `signal_evidence`."""


def incident_evidence(kind: str) -> frozenset[str]:
    return _evidence(kind) & INCIDENT_KINDS


def signal_evidence(kind: str) -> frozenset[str]:
    return _evidence(kind) & SIGNAL_KINDS


def _evidence(kind: str) -> frozenset[str]:
    try:
        return EVIDENCE.get(FaultKind(kind), frozenset())
    except ValueError:
        return frozenset()


# --- findings -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class Finding:
    """Something the system reported about a node (and maybe one GPU) at a moment."""

    at: datetime
    node_id: str
    gpu: int | None
    kind: str
    source: str
    detail: str = ""

    @property
    def is_incident(self) -> bool:
        return self.kind in INCIDENT_KINDS

    def to_dict(self) -> dict[str, object]:
        return {
            "at": _iso(self.at),
            "node_id": self.node_id,
            "gpu": self.gpu,
            "kind": self.kind,
            "source": self.source,
            "detail": self.detail,
        }


_GPU_OOM = re.compile(
    r"CUDA out of memory|CUDA error: out of memory|OutOfMemoryError|cudaErrorMemoryAllocation"
    r"|CUBLAS_STATUS_ALLOC_FAILED|CUDNN_STATUS_ALLOC_FAILED",
    re.IGNORECASE,
)
_DEVICE_BUSY = re.compile(r"busy or unavailable|cudaErrorDevicesUnavailable", re.IGNORECASE)
_GPU_LOST_ERROR = re.compile(r"^gpu (\d+)\b.*NVMLError_GpuIsLost")
_NVIDIA_DEVICE = re.compile(r"^/dev/nvidia(\d+)$")


def findings_from_event(event: Event) -> list[Finding]:
    """What one event on the bus says, as findings; [] for events that report no trouble."""
    if isinstance(event, IncidentOpened):
        kind = event.kind.value if isinstance(event.kind, IncidentKind) else str(event.kind)
        return [Finding(event.occurred_at, event.node_id, event.gpu_index, kind, event.source, event.summary)]
    if isinstance(event, GpuXidReported):
        detail = f"XID {event.xid}" + (f": {event.description}" if event.description else "")
        return [Finding(event.occurred_at, event.node_id, event.gpu_index, Signal.XID, event.source, detail)]
    if isinstance(event, GpuLost):
        return [Finding(event.occurred_at, event.node_id, event.gpu_index, Signal.GPU_LOST, event.source, event.reason)]
    if isinstance(event, ProcessOomKilled):
        detail = f"pid {event.pid} ({event.process_name})" if event.process_name else f"pid {event.pid}"
        return [Finding(event.occurred_at, event.node_id, None, Signal.OOM_KILL, event.source, detail)]
    if isinstance(event, ContainerExited):
        return _from_container_exit(event)
    if isinstance(event, NodeSampled):
        return _from_sample(event)
    if isinstance(event, ActionCompleted):
        return _from_action(event)
    return []


def findings_from_events(events: Iterable[Event]) -> list[Finding]:
    return [f for event in events for f in findings_from_event(event)]


def _from_container_exit(event: ContainerExited) -> list[Finding]:
    def finding(kind: str, detail: str) -> Finding:
        return Finding(event.occurred_at, event.node_id, None, kind, event.source, detail)

    name = event.name or event.container_id[:12]
    found: list[Finding] = []
    if event.exit_code != 0:
        kind = {137: Signal.EXIT_137, 139: Signal.EXIT_139, 143: Signal.EXIT_143}.get(
            event.exit_code, Signal.EXIT_OTHER
        )
        found.append(finding(kind, f"{name} exited {event.exit_code}"))
    if event.oom_killed:
        found.append(finding(Signal.CONTAINER_OOM_KILLED, f"{name} OOMKilled"))
    if any(_GPU_OOM.search(line) for line in event.last_log_lines):
        found.append(finding(Signal.GPU_OOM_IN_LOGS, f"{name}: CUDA out of memory in its logs"))
    if any(_DEVICE_BUSY.search(line) for line in event.last_log_lines):
        found.append(finding(Signal.DEVICE_BUSY_IN_LOGS, f"{name}: GPU busy or unavailable in its logs"))
    return found


def _from_sample(event: NodeSampled) -> list[Finding]:
    seen: dict[tuple[str, int | None, str], Finding] = {}

    def add(kind: str, gpu: int | None, detail: str) -> None:
        seen.setdefault((kind, gpu, detail), Finding(event.occurred_at, event.node_id, gpu, kind, event.source, detail))

    for disk in event.host.disks:
        if disk.used_pct >= DISK_FULL_PCT:
            add(Signal.DISK_FULL, None, f"{disk.path} {disk.used_pct:.0f}% used")
    for gpu in event.gpus:
        if gpu.lost:
            add(Signal.GPU_LOST, gpu.index, "sample: GPU lost")
        for p in gpu.processes:
            if p.container_exists is False:
                add(Signal.ORPHAN_HOLDER, gpu.index, f"pid {p.pid}: container gone")
    for holder in event.device_holders:
        if holder.container_exists is False:
            indexes = {int(m[1]) for d in holder.devices if (m := _NVIDIA_DEVICE.match(d))}
            add(Signal.ORPHAN_HOLDER, indexes.pop() if len(indexes) == 1 else None, f"pid {holder.pid}: container gone")
    for error in event.errors:
        if error.startswith("NVML unavailable"):
            add(Signal.NVML_MISSING, None, error)
        elif error.startswith("status probe"):
            add(Signal.STATUS_PROBE_FAILED, None, error)
        elif m := _GPU_LOST_ERROR.match(error):
            add(Signal.GPU_LOST, int(m[1]), "sample: GPU lost")
    return list(seen.values())


def _from_action(event: ActionCompleted) -> list[Finding]:
    if event.outcome is not ActionOutcome.FAILED:
        return []
    text = event.detail.lower()
    if "connection refused" in text:
        kind = Signal.SSH_REFUSED
    elif "timed out" in text or "timeout" in text:
        kind = Signal.SSH_TIMEOUT
    else:
        return []
    return [Finding(event.occurred_at, event.node_id, None, kind, event.source, event.detail[:200])]


# --- scoring ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class FaultOutcome:
    """One injected fault and what first saw it."""

    fault: InjectedFault
    first_signal: Finding | None
    first_incident: Finding | None

    @property
    def signal_latency_s(self) -> float | None:
        return _latency(self.fault, self.first_signal)

    @property
    def incident_latency_s(self) -> float | None:
        return _latency(self.fault, self.first_incident)

    @property
    def missed(self) -> bool:
        return self.first_signal is None and self.first_incident is None

    def to_dict(self) -> dict[str, object]:
        return {
            "at": _iso(self.fault.at),
            "node_id": self.fault.node_id,
            "gpu": self.fault.gpu,
            "fault": self.fault.fault,
            "signal": self.first_signal.to_dict() if self.first_signal else None,
            "signal_latency_s": _round(self.signal_latency_s),
            "incident": self.first_incident.to_dict() if self.first_incident else None,
            "incident_latency_s": _round(self.incident_latency_s),
        }


@dataclass(frozen=True)
class KindScore:
    """One fault kind's line of the score."""

    kind: str
    injected: int
    has_signal: bool
    """Some signal kind counts as evidence for this fault kind."""
    has_detector: bool
    """Some incident kind counts: a detector exists for this fault kind."""
    signalled: int
    detected: int
    missed: int
    """Faults nothing saw: no signal and no incident."""
    false_positives: int
    signal_median_s: float | None
    signal_max_s: float | None
    incident_median_s: float | None
    incident_max_s: float | None

    @property
    def recall(self) -> float | None:
        return self.detected / self.injected if self.injected else None

    @property
    def signal_rate(self) -> float | None:
        return self.signalled / self.injected if self.injected else None

    @property
    def precision(self) -> float | None:
        total = self.detected + self.false_positives
        return self.detected / total if total else None

    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "injected": self.injected,
            "has_signal": self.has_signal,
            "has_detector": self.has_detector,
            "signalled": self.signalled,
            "detected": self.detected,
            "missed": self.missed,
            "false_positives": self.false_positives,
            "signal_median_s": _round(self.signal_median_s),
            "signal_max_s": _round(self.signal_max_s),
            "incident_median_s": _round(self.incident_median_s),
            "incident_max_s": _round(self.incident_max_s),
            "recall": _round(self.recall, 4),
            "signal_rate": _round(self.signal_rate, 4),
            "precision": _round(self.precision, 4),
        }


@dataclass(frozen=True)
class Score:
    window_s: float
    kinds: tuple[KindScore, ...]
    """One line per fault kind injected or falsely reported; FaultKind order, then by name."""
    outcomes: tuple[FaultOutcome, ...]
    """Every distinct injected fault, by time."""
    false_positives: tuple[Finding, ...]
    """Incidents that match no injected fault, by time (exact repeats once)."""
    unmatched_signals: int
    """Distinct (node, GPU, kind) signals that match no injected fault: e.g. a container the
    remediator killed, or noise; reported, not scored."""
    duplicate_injections: int
    """Injected faults recorded more than once (same time, node, GPU and kind), counted once."""

    @property
    def injected(self) -> int:
        return len(self.outcomes)

    @property
    def signalled(self) -> int:
        return sum(1 for o in self.outcomes if o.first_signal is not None)

    @property
    def detected(self) -> int:
        return sum(1 for o in self.outcomes if o.first_incident is not None)

    @property
    def missed(self) -> int:
        return sum(1 for o in self.outcomes if o.missed)

    @property
    def with_signal(self) -> int:
        """Injected faults of kinds some signal can show."""
        return sum(k.injected for k in self.kinds if k.has_signal)

    @property
    def detectable(self) -> int:
        """Injected faults of kinds a detector exists for."""
        return sum(k.injected for k in self.kinds if k.has_detector)

    @property
    def recall(self) -> float | None:
        """Faults an incident found / faults injected (of every kind, detector or not)."""
        return self.detected / self.injected if self.injected else None

    @property
    def recall_detectable(self) -> float | None:
        """Faults an incident found / faults injected of the kinds a detector exists for."""
        return self.detected / self.detectable if self.detectable else None

    @property
    def precision(self) -> float | None:
        """True incidents / all incidents: faults an incident found (several incidents for one
        fault count once) against those plus the false positives; None without any incident."""
        total = self.detected + len(self.false_positives)
        return self.detected / total if total else None

    def to_dict(self) -> dict[str, object]:
        return {
            "window_s": self.window_s,
            "totals": {
                "injected": self.injected,
                "with_signal": self.with_signal,
                "signalled": self.signalled,
                "detectable": self.detectable,
                "detected": self.detected,
                "missed": self.missed,
                "false_positives": len(self.false_positives),
                "precision": _round(self.precision, 4),
                "recall": _round(self.recall, 4),
                "recall_detectable": _round(self.recall_detectable, 4),
                "unmatched_signals": self.unmatched_signals,
                "duplicate_injections": self.duplicate_injections,
            },
            "kinds": [k.to_dict() for k in self.kinds],
            "faults": [o.to_dict() for o in self.outcomes],
            "false_positives": [f.to_dict() for f in self.false_positives],
        }


def score(
    injected: Sequence[InjectedFault], findings: Sequence[Finding], *, window_s: float = DEFAULT_WINDOW_S
) -> Score:
    """Match each injected fault to the findings that count as seeing it (`EVIDENCE`) on the same
    node, on the same GPU when both name one, from 1 s before it to `window_s` after. A finding may
    serve several faults (a fault injected twice on one GPU); a fault counts once however many
    findings match it. Incidents that match no fault are false positives."""
    if window_s < 0:
        raise ValueError("window_s must be 0 or more")
    faults: list[InjectedFault] = []
    seen_faults: set[tuple[datetime, str, int | None, str]] = set()
    for f in injected:
        f = InjectedFault(_aware(f.at), f.node_id, f.gpu, str(f.fault))
        key = (f.at, f.node_id, f.gpu, f.fault)
        if key not in seen_faults:
            seen_faults.add(key)
            faults.append(f)
    duplicates = len(injected) - len(faults)
    faults.sort(key=lambda f: (f.at, f.node_id, -1 if f.gpu is None else f.gpu, f.fault))

    unique: dict[tuple, Finding] = {}
    for x in findings:
        x = Finding(_aware(x.at), x.node_id, x.gpu, x.kind, x.source, x.detail)
        unique.setdefault((x.at, x.node_id, x.gpu, x.kind, x.source), x)
    ordered = sorted(unique.values(), key=_finding_order)
    by_node: dict[str, list[Finding]] = {}
    for x in ordered:
        by_node.setdefault(x.node_id, []).append(x)

    early, late = timedelta(seconds=EARLY_S), timedelta(seconds=window_s)
    matched: set[int] = set()
    outcomes: list[FaultOutcome] = []
    for fault in faults:
        evidence = _evidence(fault.fault)
        first_signal = first_incident = None
        for x in by_node.get(fault.node_id, ()):
            if x.kind not in evidence or not fault.at - early <= x.at <= fault.at + late:
                continue
            if fault.gpu is not None and x.gpu is not None and fault.gpu != x.gpu:
                continue
            matched.add(id(x))
            if x.kind in INCIDENT_KINDS:
                first_incident = first_incident or x
            elif x.kind in SIGNAL_KINDS:
                first_signal = first_signal or x
        outcomes.append(FaultOutcome(fault, first_signal, first_incident))

    false_positives = tuple(x for x in ordered if x.kind in INCIDENT_KINDS and id(x) not in matched)
    unmatched_signals = len(
        {(x.node_id, x.gpu, x.kind) for x in ordered if x.kind not in INCIDENT_KINDS and id(x) not in matched}
    )
    return Score(
        window_s=window_s,
        kinds=_by_kind(outcomes, false_positives),
        outcomes=tuple(outcomes),
        false_positives=false_positives,
        unmatched_signals=unmatched_signals,
        duplicate_injections=duplicates,
    )


def _by_kind(outcomes: Sequence[FaultOutcome], false_positives: Sequence[Finding]) -> tuple[KindScore, ...]:
    groups: dict[str, list[FaultOutcome]] = {}
    for o in outcomes:
        groups.setdefault(o.fault.fault, []).append(o)
    fp_by_kind: dict[str, int] = {}
    for x in false_positives:
        for kind in FaultKind:
            if x.kind in EVIDENCE[kind]:
                fp_by_kind[kind.value] = fp_by_kind.get(kind.value, 0) + 1
    order = {k.value: i for i, k in enumerate(FaultKind)}
    names = sorted(set(groups) | set(fp_by_kind), key=lambda k: (order.get(k, len(order)), k))
    lines = []
    for name in names:
        group = groups.get(name, [])
        signal = [s for o in group if (s := o.signal_latency_s) is not None]
        incident = [s for o in group if (s := o.incident_latency_s) is not None]
        lines.append(
            KindScore(
                kind=name,
                injected=len(group),
                has_signal=bool(signal_evidence(name)),
                has_detector=bool(incident_evidence(name)),
                signalled=len(signal),
                detected=len(incident),
                missed=sum(1 for o in group if o.missed),
                false_positives=fp_by_kind.get(name, 0),
                signal_median_s=statistics.median(signal) if signal else None,
                signal_max_s=max(signal) if signal else None,
                incident_median_s=statistics.median(incident) if incident else None,
                incident_max_s=max(incident) if incident else None,
            )
        )
    return tuple(lines)


# --- rendering ----------------------------------------------------------------------------------

_HEADER = ("fault kind", "injected", "signal seen", "incident", "missed", "to signal med/max", "to incident med/max")


def render(result: Score) -> str:
    """The score as a fixed-width table for a terminal, then the false positives, then a summary.
    "-" in the signal or incident column: no signal (or no detector) exists for that kind yet."""
    rows = [_HEADER]
    for k in result.kinds:
        rows.append(
            (
                k.kind,
                str(k.injected),
                f"{k.signalled}/{k.injected}" if k.has_signal else "-",
                f"{k.detected}/{k.injected}" if k.has_detector else "-",
                str(k.missed),
                _span(k.signal_median_s, k.signal_max_s),
                _span(k.incident_median_s, k.incident_max_s),
            )
        )
    widths = [max(len(row[i]) for row in rows) for i in range(len(_HEADER))]
    lines = []
    for n, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])] + [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    if not result.kinds:
        lines.append("(no faults injected)")

    lines.append("")
    if result.false_positives:
        lines.append(f"false positives ({len(result.false_positives)}): incidents that match no injected fault")
        for x in result.false_positives:
            gpu = "-" if x.gpu is None else f"GPU {x.gpu}"
            lines.append(f"  {_iso(x.at)}  {x.node_id}  {gpu}  {x.kind}  ({x.source})")
    else:
        lines.append("false positives: none")
    if result.unmatched_signals:
        lines.append(f"signals that match no injected fault (not scored): {result.unmatched_signals}")
    if result.duplicate_injections:
        lines.append(f"faults recorded twice, counted once: {result.duplicate_injections}")
    lines.append(_summary(result))
    return "\n".join(lines)


def _summary(r: Score) -> str:
    parts = [f"{r.injected} injected"]
    parts.append(f"signal seen {r.signalled}/{r.with_signal}")
    incidents = f"incident {r.detected}/{r.injected} (recall {_pct(r.recall)}"
    if r.detectable != r.injected:
        incidents += f"; {r.detected}/{r.detectable} of kinds with a detector"
    parts.append(incidents + ")")
    parts.append(f"{len(r.false_positives)} false positive{'' if len(r.false_positives) == 1 else 's'}")
    parts.append(f"precision {_pct(r.precision)}")
    parts.append(f"{r.missed} missed")
    parts.append(f"window {r.window_s:g}s")
    return "summary: " + ", ".join(parts)


def _span(median: float | None, worst: float | None) -> str:
    if median is None or worst is None:
        return "-"
    return f"{median:.1f}s/{worst:.1f}s"


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value * 100:.0f}%"


# --- helpers ------------------------------------------------------------------------------------


def _aware(at: datetime) -> datetime:
    return at.replace(tzinfo=UTC) if at.tzinfo is None else at


def _latency(fault: InjectedFault, finding: Finding | None) -> float | None:
    if finding is None:
        return None
    return max(0.0, (finding.at - fault.at).total_seconds())


def _finding_order(x: Finding) -> tuple:
    return (x.at, x.node_id, -1 if x.gpu is None else x.gpu, x.kind, x.source, x.detail)


def _iso(at: datetime) -> str:
    at = _aware(at).astimezone(UTC)
    text = at.isoformat(timespec="milliseconds" if at.microsecond else "seconds")
    return text.replace("+00:00", "Z")


def _round(value: float | None, digits: int = 3) -> float | None:
    return None if value is None else round(value, digits)
