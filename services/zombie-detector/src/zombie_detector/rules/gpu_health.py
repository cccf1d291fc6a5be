"""GPU health as DCGM's health watches see it: heat, hardware throttling, memory errors, links.

One incident per GPU and kind, from the sample's figures and the GPU's last health figures
(`GpuHealth`, which come when they change and at least every `health_refresh_s`: the rule keeps
the last one per GPU):

- gpu_thermal: the core at or above the GPU's own slowdown temperature (NVML's threshold), the HBM
  at or above its maximum, or the GPU slowing itself down for heat, for `for_s`. It clears
  `clear_margin_c` below the threshold with no thermal slowdown. A busy GPU at 83 °C under an
  89 °C slowdown is a working GPU.
- gpu_throttled: a busy GPU held down by hardware (HW slowdown, HW power brake) for `for_s`. The SW
  power cap is how every GPU at its power limit runs (a real H200 at 690 of 700 W shows it), and a
  cap the operator set is theirs: neither is a fault. Heat is gpu_thermal's.
- ecc_errors: uncorrectable (double-bit) errors counted since the last sample, or corrected ones
  faster than `corrected_per_hour`. A first sample is the baseline (the count may be old).
- row_remap: a row remap waits for a reset (drain, reset once nothing holds the GPU: the ladder
  waits for the job to end, validate), or
  remapping failed (drain and a person: NVIDIA's memory error documentation says the GPU needs
  service), `after_samples` samples in a row.
- pcie_degraded: a busy GPU's link below its maximum generation or width (as its last health
  figures say) for `for_s` (a link may train down while idle), or replays faster than
  `replays_per_minute` between two health reads.
- nvlink_degraded: an NVLink down, or its errors rising faster than `errors_per_hour`.

A memory error is one fault however many signs it shows: an XID 48 comes with a new double-bit
error and a pending remap. While a gpu_xid incident is open on the GPU, ecc_errors and row_remap
stay quiet; a pending remap is row_remap's, not ecc_errors'. The other way round (the samples
showed the remap before the XID came), the XID rule leaves a memory XID to the open row_remap.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpumedic_events import ClockEventReason, GpuHealth, GpuReset, GpuSample, IncidentKind, NodeRetired
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, fingerprint
from gpumedic_incidents.policy import EccPolicy, NvLinkPolicy, PciePolicy, RowRemapPolicy, ThermalPolicy, ThrottlePolicy
from zombie_detector.rules.base import Incidents

THERMAL = IncidentKind.GPU_THERMAL
THROTTLED = IncidentKind.GPU_THROTTLED
ECC = IncidentKind.ECC_ERRORS
REMAP = IncidentKind.ROW_REMAP
PCIE = IncidentKind.PCIE_DEGRADED
NVLINK = IncidentKind.NVLINK_DEGRADED

# plain ints: an IntFlag's & builds enum members, several microseconds a sample on the hot path
HEAT = int(ClockEventReason.SW_THERMAL_SLOWDOWN | ClockEventReason.HW_THERMAL_SLOWDOWN)
HARDWARE = int(ClockEventReason.HW_SLOWDOWN | ClockEventReason.HW_POWER_BRAKE_SLOWDOWN)
WATCHED = HEAT | HARDWARE
NO_LIMIT = 1_000_000
"""A threshold not known yet (no health figures so far): nothing reaches it."""
HOUR_S = 3600.0
INTERNED_MAX = 10_000
"""Distinct health figures kept shared; most GPUs of a model report the very same ones."""


@dataclass(slots=True)
class _Gpu:
    """What the rule remembers of one GPU: a fleet has tens of thousands, so slots, and the timers
    and open kinds made only when a GPU first needs them."""

    health: GpuHealth | None = None
    slowdown: int = NO_LIMIT
    memory_max: int = NO_LIMIT
    since: dict[IncidentKind, datetime] | None = None
    """When a condition that must last began."""
    open: set[IncidentKind] | None = None
    """Kinds this rule said present and not yet cleared."""
    uncorrected: int | None = None
    corrected: tuple[datetime, int] | None = None
    """The corrected count at the start of the rate's window."""
    corrected_seen: int | None = None
    """The corrected count of the last sample."""
    remap_samples: int = 0
    narrow: bool = False
    """The last health figures said the PCIe link runs below its maximum."""
    replaying: bool = False
    replays: tuple[datetime, int] | None = None
    nvlink_errors: tuple[datetime, int] | None = None

    def started(self, kind: IncidentKind, now: datetime) -> datetime:
        if self.since is None:
            self.since = {}
        return self.since.setdefault(kind, now)

    def stop(self, kind: IncidentKind) -> None:
        if self.since:
            self.since.pop(kind, None)

    def is_open(self, kind: IncidentKind) -> bool:
        return bool(self.open) and kind in self.open  # type: ignore[operator]

    def opened(self, kind: IncidentKind) -> None:
        if self.open is None:
            self.open = set()
        self.open.add(kind)


class GpuHealthRule:
    inputs = (Sample, NodeRetired)

    def __init__(
        self,
        thermal: ThermalPolicy,
        throttle: ThrottlePolicy,
        ecc: EccPolicy,
        remap: RowRemapPolicy,
        pcie: PciePolicy,
        nvlink: NvLinkPolicy,
    ) -> None:
        self.thermal, self.throttle, self.ecc, self.remap, self.pcie, self.nvlink = thermal, throttle, ecc, remap, pcie, nvlink
        self.gpus: dict[str, dict[int, _Gpu]] = {}
        self._interned: dict[GpuHealth, GpuHealth] = {}
        """One object per distinct set of health figures, shared by every GPU that reports it (a
        fleet's GPUs mostly report the same: kept per GPU, 80,000 copies cost tens of MB)."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, NodeRetired):
            self.gpus.pop(event.node_id, None)
            return ()
        node = self.gpus.get(event.node_id)
        if node is None:
            node = self.gpus[event.node_id] = {}
        findings: list[Finding] = []
        for gpu in event.gpus:
            state = node.get(gpu.index)
            if state is None:
                state = node[gpu.index] = _Gpu()
            health = gpu.health
            if health is not None:
                self._pcie(event.node_id, gpu, health, state, now, findings)
                self._nvlink(event.node_id, gpu, health, state, now, findings)
                if len(self._interned) >= INTERNED_MAX:
                    self._interned.clear()
                state.health = health = self._interned.setdefault(health, health)
                state.slowdown = health.temperature_slowdown_c if health.temperature_slowdown_c is not None else NO_LIMIT
                state.memory_max = health.memory_temperature_max_c if health.memory_temperature_max_c is not None else NO_LIMIT
            # the common case, inline (it runs for every GPU of every sample): nothing to judge, time or clear
            if not (state.open or state.since or state.remap_samples or state.narrow):
                temp, memory = gpu.temperature_c, gpu.memory_temperature_c
                if (
                    not (gpu.clock_event_reasons or 0) & WATCHED
                    and (temp is None or temp < state.slowdown)
                    and (memory is None or memory < state.memory_max)
                    and gpu.ecc_uncorrected_volatile == state.uncorrected
                    and gpu.ecc_corrected_volatile == state.corrected_seen
                    and not gpu.remapped_rows_pending
                    and not gpu.remapped_rows_failed
                ):
                    continue
            if gpu.lost:
                continue  # gpu_lost's
            self._narrow_link(event.node_id, gpu, state, now, findings)
            self._thermal(event.node_id, gpu, state, now, findings)
            self._throttled(event.node_id, gpu, state, now, findings)
            self._memory(event.node_id, gpu, state, now, incidents, findings)
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    # --- the kinds --------------------------------------------------------------------------

    def _thermal(self, node_id: str, gpu: GpuSample, state: _Gpu, now: datetime, findings: list[Finding]) -> None:
        temp, memory, reasons = gpu.temperature_c, gpu.memory_temperature_c, gpu.clock_event_reasons or 0
        hot = bool(reasons & HEAT) or (temp is not None and temp >= state.slowdown) or (memory is not None and memory >= state.memory_max)
        if hot:
            if self._lasted(state, THERMAL, now, self.thermal.for_s):
                findings.append(self._thermal_finding(node_id, gpu, state.health, reasons))
            return
        state.stop(THERMAL)
        if temp is None or temp <= state.slowdown - self.thermal.clear_margin_c:  # an unknown threshold: NO_LIMIT
            self._clear(node_id, gpu.index, state, THERMAL, findings, "below its slowdown temperature again")

    def _thermal_finding(self, node_id: str, gpu: GpuSample, health: GpuHealth | None, reasons: int) -> Finding:
        shutdown = health.temperature_shutdown_c if health else None
        critical = gpu.temperature_c is not None and shutdown is not None and gpu.temperature_c >= shutdown - 5
        return Finding(
            kind=THERMAL,
            node_id=node_id,
            gpu_index=gpu.index,
            summary=f"GPU {gpu.index} runs at {_deg(gpu.temperature_c)} (slowdown at {_deg(health and health.temperature_slowdown_c)})"
            + (f", slowing itself down ({_names(reasons & HEAT)})" if reasons & HEAT else ""),
            evidence={
                "temperature_c": gpu.temperature_c,
                "memory_temperature_c": gpu.memory_temperature_c,
                "slowdown_c": health.temperature_slowdown_c if health else None,
                "shutdown_c": shutdown,
                "memory_max_c": health.memory_temperature_max_c if health else None,
                "clock_event_reasons": _names(reasons) or None,
                "sm_clock_mhz": gpu.sm_clock_mhz,
            },
            severity="critical" if critical else "warning",
            recommended_action="check the node's cooling: fans, inlet temperature, blocked airflow, the data centre's "
            "cooling; NVIDIA's thermal guidance: the GPU slows down to protect itself and shuts down at its shutdown temperature",
        )

    def _throttled(self, node_id: str, gpu: GpuSample, state: _Gpu, now: datetime, findings: list[Finding]) -> None:
        reasons = gpu.clock_event_reasons or 0
        busy = (gpu.utilization_gpu_pct or 0) >= self.throttle.busy_from_pct
        if reasons & HARDWARE and not reasons & HEAT and busy:
            if self._lasted(state, THROTTLED, now, self.throttle.for_s):
                health = state.health
                maximum = health.sm_clock_max_mhz if health else None
                findings.append(
                    Finding(
                        kind=THROTTLED,
                        node_id=node_id,
                        gpu_index=gpu.index,
                        summary=f"GPU {gpu.index} is held down by hardware ({_names(reasons & HARDWARE)}): SM clock "
                        f"{gpu.sm_clock_mhz or '?'} of {maximum or '?'} MHz at {gpu.utilization_gpu_pct}% busy",
                        evidence={
                            "clock_event_reasons": _names(reasons),
                            "sm_clock_mhz": gpu.sm_clock_mhz,
                            "sm_clock_max_mhz": maximum,
                            "power_w": gpu.power_w,
                            "power_limit_w": gpu.power_limit_w,
                            "utilization_gpu_pct": gpu.utilization_gpu_pct,
                        },
                        recommended_action="HW slowdown or power brake: check the power supplies and the board's external "
                        "power brake signal (the system's BMC log); a GPU that repeats it needs service",
                    )
                )
            return
        state.stop(THROTTLED)
        if not reasons & HARDWARE:
            self._clear(node_id, gpu.index, state, THROTTLED, findings, "no longer held down by hardware")

    def _memory(
        self, node_id: str, gpu: GpuSample, state: _Gpu, now: datetime, incidents: Incidents, findings: list[Finding]
    ) -> None:
        uncorrected, corrected = gpu.ecc_uncorrected_volatile, gpu.ecc_corrected_volatile
        state.corrected_seen = corrected
        new_uncorrected = 0
        if uncorrected is not None:
            if state.uncorrected is not None and uncorrected > state.uncorrected:
                new_uncorrected = uncorrected - state.uncorrected
            state.uncorrected = uncorrected
        rate = self._corrected_rate(state, corrected, now)
        remap = bool(gpu.remapped_rows_pending or gpu.remapped_rows_failed)
        state.remap_samples = state.remap_samples + 1 if remap else 0
        if not (new_uncorrected or rate is not None or remap):
            self._clear(node_id, gpu.index, state, REMAP, findings, "no row remap waits and none failed")
            return
        # the same memory fault as an open XID incident on this GPU: its ladder drains and resets
        if incidents.get(fingerprint(node_id, IncidentKind.GPU_XID, gpu.index, None)) is not None:
            return
        if remap and state.remap_samples >= self.remap.after_samples:
            _present(state, findings, self._remap_finding(node_id, gpu, state))
        elif (new_uncorrected and not remap) or rate is not None:
            # not kept open here: an error is an occurrence, which the policy's clear_after_s closes
            findings.append(self._ecc_finding(node_id, gpu, state, new_uncorrected, rate))

    def _corrected_rate(self, state: _Gpu, corrected: int | None, now: datetime) -> float | None:
        """Corrected errors per hour over the window since its start, when above the policy; the
        window starts again each hour (or when the count goes back, after a driver reload)."""
        if corrected is None:
            return None
        start = state.corrected
        if start is None or corrected < start[1]:
            state.corrected = (now, corrected)
            return None
        elapsed = (now - start[0]).total_seconds()
        grown = corrected - start[1]
        if elapsed >= HOUR_S:
            state.corrected = (now, corrected)
        if grown and grown >= self.ecc.corrected_per_hour * max(elapsed, 60.0) / HOUR_S:
            return grown * HOUR_S / max(elapsed, 60.0)
        return None

    def _ecc_finding(self, node_id: str, gpu: GpuSample, state: _Gpu, new_uncorrected: int, rate: float | None) -> Finding:
        if new_uncorrected:
            summary = f"GPU {gpu.index}: {new_uncorrected} new uncorrectable ECC error(s), {gpu.ecc_uncorrected_volatile} since the driver loaded"
        else:
            summary = f"GPU {gpu.index}: corrected ECC errors at {rate:.0f} an hour (limit {self.ecc.corrected_per_hour:g})"
        health = state.health
        return Finding(
            kind=ECC,
            node_id=node_id,
            gpu_index=gpu.index,
            summary=summary,
            evidence={
                "new_uncorrected": new_uncorrected or None,
                "uncorrected_volatile": gpu.ecc_uncorrected_volatile,
                "corrected_volatile": gpu.ecc_corrected_volatile,
                "corrected_per_hour": round(rate) if rate is not None else None,
                "retired_pages_pending": gpu.retired_pages_pending,
                "uncorrected_aggregate": health.ecc_uncorrected_aggregate if health else None,
            },
            severity="critical" if new_uncorrected else "warning",
            recommended_action="take no new jobs on the GPU; a job that was running may have read corrupted memory. "
            "Reset the GPU once idle (NVIDIA: pending page retirements and row remaps take effect at reset); "
            "errors that keep coming: RMA",
        )

    def _remap_finding(self, node_id: str, gpu: GpuSample, state: _Gpu) -> Finding:
        health = state.health
        failed = bool(gpu.remapped_rows_failed)
        held = bool(gpu.processes)
        if failed:
            summary = f"GPU {gpu.index}: row remapping failed: the GPU needs service"
            action = "drain the node and send the GPU for service (RMA): NVIDIA's memory error docs say a failed remap cannot be fixed in place"
        else:
            summary = f"GPU {gpu.index}: a row remap waits for a GPU reset" + (" (a job still holds the GPU)" if held else "")
            action = "drain the node, reset the GPU once nothing holds it (nvidia-smi -r), and check that the remap took"
        return Finding(
            kind=REMAP,
            node_id=node_id,
            gpu_index=gpu.index,
            summary=summary,
            evidence={
                "remapped_rows_pending": gpu.remapped_rows_pending,
                "remapped_rows_failed": gpu.remapped_rows_failed,
                "remapped_rows_uncorrected": health.remapped_rows_uncorrected if health else None,
                "remapped_rows_corrected": health.remapped_rows_corrected if health else None,
                "uncorrected_volatile": gpu.ecc_uncorrected_volatile,
                "processes": len(gpu.processes),
            },
            severity="critical" if failed else "warning",
            recommended_action=action,
            # the reset only where it can help; while a job holds the GPU the remediator refuses it as
            # in use (it checks on the node), and the ladder asks again until the job has ended
            operations={} if failed else {"gpu_reset": GpuReset(gpu_index=gpu.index)},
        )

    def _pcie(self, node_id: str, gpu: GpuSample, health: GpuHealth, state: _Gpu, now: datetime, findings: list[Finding]) -> None:
        """At a health read: whether the link runs below its maximum (judged on every sample while
        busy, `_narrow_link`), and how fast it replays since the last read."""
        gen, gen_max, width, width_max = health.pcie_link_gen, health.pcie_link_gen_max, health.pcie_link_width, health.pcie_link_width_max
        state.narrow = (gen is not None and gen_max is not None and gen < gen_max) or (
            width is not None and width_max is not None and width < width_max
        )
        rate = _rate(state.replays, health.pcie_replay_count, now, 60.0)
        if health.pcie_replay_count is not None:
            state.replays = (now, health.pcie_replay_count)
        state.replaying = rate is not None and rate > self.pcie.replays_per_minute
        if state.replaying:
            _present(state, findings, self._pcie_finding(node_id, gpu, health, rate))

    def _narrow_link(self, node_id: str, gpu: GpuSample, state: _Gpu, now: datetime, findings: list[Finding]) -> None:
        """A link below its maximum while its GPU is busy, for `for_s` (idle, a link may train down to save power)."""
        if state.narrow:
            if (gpu.utilization_gpu_pct or 0) < self.pcie.busy_from_pct:
                state.stop(PCIE)
            elif self._lasted(state, PCIE, now, self.pcie.for_s) and state.health is not None:
                findings.append(self._pcie_finding(node_id, gpu, state.health, None))
            return
        state.stop(PCIE)
        if not state.replaying:
            self._clear(node_id, gpu.index, state, PCIE, findings, "its PCIe link at full generation and width again")

    def _pcie_finding(self, node_id: str, gpu: GpuSample, health: GpuHealth, rate: float | None) -> Finding:
        gen, gen_max, width, width_max = health.pcie_link_gen, health.pcie_link_gen_max, health.pcie_link_width, health.pcie_link_width_max
        return Finding(
            kind=PCIE,
            node_id=node_id,
            gpu_index=gpu.index,
            summary=f"GPU {gpu.index}'s PCIe link runs at gen {gen} x{width} of gen {gen_max} x{width_max}"
            + (f", replaying {rate:.0f} times a minute" if rate is not None else "")
            + f" at {gpu.utilization_gpu_pct}% busy",
            evidence={
                "pcie_link_gen": gen,
                "pcie_link_gen_max": gen_max,
                "pcie_link_width": width,
                "pcie_link_width_max": width_max,
                "replays_per_minute": round(rate, 1) if rate is not None else None,
                "pcie_replay_count": health.pcie_replay_count,
            },
            recommended_action="reseat the GPU or its riser and check the slot; a link that trains down or replays "
            "again after that: RMA. Data over this link is slower, and a job sharing data between GPUs waits on it",
        )

    def _nvlink(self, node_id: str, gpu: GpuSample, health: GpuHealth, state: _Gpu, now: datetime, findings: list[Finding]) -> None:
        if not health.nvlink_count:
            return
        if not health.nvlinks and not state.is_open(NVLINK):  # every link up and quiet (only counted)
            state.nvlink_errors = (now, 0)
            return
        down = [link.link for link in health.nvlinks if not link.up]
        errors = sum((link.replay_errors or 0) + (link.recovery_errors or 0) + (link.crc_errors or 0) for link in health.nvlinks)
        rate = _rate(state.nvlink_errors, errors, now, HOUR_S)
        state.nvlink_errors = (now, errors)
        rising = rate is not None and rate > self.nvlink.errors_per_hour
        if down or rising:
            what = []
            if down:
                what.append(f"link{'s' if len(down) > 1 else ''} {', '.join(map(str, down))} down")
            if rising:
                what.append(f"errors at {rate:.0f} an hour")
            _present(
                state,
                findings,
                Finding(
                    kind=NVLINK,
                    node_id=node_id,
                    gpu_index=gpu.index,
                    summary=f"GPU {gpu.index}'s NVLinks: {' and '.join(what)} ({health.nvlink_count} links)",
                    evidence={
                        "links_down": " ".join(map(str, down)) or None,
                        "nvlink_count": health.nvlink_count,
                        "errors_per_hour": round(rate) if rate is not None else None,
                        "errors_total": errors,
                    },
                    severity="critical" if down else "warning",
                    recommended_action="a job across the node's GPUs runs slower or fails over this GPU: drain it and have "
                    "the NVLinks (and NVSwitch) checked; nvidia-smi nvlink -s and -e show each link",
                ),
            )
        else:
            self._clear(node_id, gpu.index, state, NVLINK, findings, "every NVLink up and quiet")

    # --- helpers ----------------------------------------------------------------------------

    @staticmethod
    def _lasted(state: _Gpu, kind: IncidentKind, now: datetime, for_s: float) -> bool:
        since = state.started(kind, now)
        if (now - since).total_seconds() < for_s:
            return False
        state.opened(kind)
        return True

    @staticmethod
    def _clear(node_id: str, index: int, state: _Gpu, kind: IncidentKind, findings: list[Finding], summary: str) -> None:
        if state.is_open(kind):
            state.open.discard(kind)  # type: ignore[union-attr]
            findings.append(Finding(kind=kind, node_id=node_id, gpu_index=index, present=False, summary=f"GPU {index}: {summary}"))


def _present(state: _Gpu, findings: list[Finding], finding: Finding) -> None:
    state.opened(finding.kind)
    findings.append(finding)


def _rate(before: tuple[datetime, int] | None, count: int | None, now: datetime, per_s: float) -> float | None:
    """How fast a counter grew since the last reading, per `per_s`; None without two readings
    (or when it went back: the driver reloaded)."""
    if before is None or count is None or count < before[1]:
        return None
    elapsed = (now - before[0]).total_seconds()
    if elapsed <= 0:
        return None
    return (count - before[1]) * per_s / elapsed


def _names(reasons: int) -> str:
    return " ".join(reason.name.lower() for reason in ClockEventReason if reasons & reason)


def _deg(value: int | None) -> str:
    return "?" if value is None else f"{value} °C"
