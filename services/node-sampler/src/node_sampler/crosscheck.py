"""Check what node-sampler reads against `nvidia-smi -q -x` on the same node, field by field.

    python -m node_sampler.crosscheck            # sample now, run nvidia-smi -q -x, compare
    python -m node_sampler.crosscheck --xml F    # compare with a saved nvidia-smi -q -x
    python -m node_sampler.crosscheck --json     # the rows as JSON

Run it on a new driver or GPU model before trusting the sampler there: every row says what the
sampler reported, what nvidia-smi shows, and whether they agree. Figures that move between the two
reads (utilisation, power, clocks, temperature) agree within a tolerance; counters, limits and
identities must be equal. nvidia-smi (R550 and later) shows the temperature thresholds as margins
to the GPU's maximum operating temperature ("T.Limit"); they are converted before comparing. The
exit status is 1 when a row disagrees, 2 when nothing could be compared.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from gpumedic_events import ClockEventReason, GpuHealth, GpuSample, NodeSampled

REASON_TAGS = {
    "gpu_idle": ClockEventReason.GPU_IDLE,
    "applications_clocks_setting": ClockEventReason.APPLICATIONS_CLOCKS_SETTING,
    "sw_power_cap": ClockEventReason.SW_POWER_CAP,
    "hw_slowdown": ClockEventReason.HW_SLOWDOWN,
    "sync_boost": ClockEventReason.SYNC_BOOST,
    "sw_thermal_slowdown": ClockEventReason.SW_THERMAL_SLOWDOWN,
    "hw_thermal_slowdown": ClockEventReason.HW_THERMAL_SLOWDOWN,
    "hw_power_brake_slowdown": ClockEventReason.HW_POWER_BRAKE_SLOWDOWN,
    "display_clocks_setting": ClockEventReason.DISPLAY_CLOCK_SETTING,
}
"""nvidia-smi's clocks event reason tags (clocks_event_reason_<tag>; before R535 clocks_throttle_reason_<tag>)."""


@dataclass(frozen=True)
class Row:
    gpu: int
    field: str
    sampler: Any
    nvidia_smi: Any
    agree: bool
    note: str = ""


@dataclass(frozen=True)
class Rule:
    field: str
    ours: Callable[[GpuSample, GpuHealth], Any]
    theirs: Callable[[ET.Element], Any]
    tolerance: float = 0.0
    """Absolute difference allowed, for figures that move between the two reads."""
    note: str = ""


def _text(gpu: ET.Element, path: str) -> str | None:
    node = gpu.find(path)
    if node is None or node.text is None:
        return None
    text = node.text.strip()
    return None if text in ("", "N/A", "[N/A]", "Not Supported", "[Not Supported]") else text


def _number(path: str) -> Callable[[ET.Element], float | None]:
    """The number at the start of a value such as "975 MiB", "98 %", "16x", "692.11 W"."""

    def read(gpu: ET.Element) -> float | None:
        text = _text(gpu, path)
        match = re.match(r"-?\d+(\.\d+)?", text or "")
        return float(match.group()) if match else None

    return read


def _first(*readers: Callable[[ET.Element], Any]) -> Callable[[ET.Element], Any]:
    def read(gpu: ET.Element) -> Any:
        for reader in readers:
            value = reader(gpu)
            if value is not None:
                return value
        return None

    return read


def _yes(path: str) -> Callable[[ET.Element], bool | None]:
    def read(gpu: ET.Element) -> bool | None:
        text = _text(gpu, path)
        return None if text is None else text.lower() in ("yes", "active", "enabled")

    return read


def _sum(*paths: str) -> Callable[[ET.Element], float | None]:
    def read(gpu: ET.Element) -> float | None:
        values = [_number(path)(gpu) for path in paths]
        known = [v for v in values if v is not None]
        return sum(known) if known else None

    return read


def _ecc(counter: str, kind: str) -> Callable[[ET.Element], float | None]:
    """NVML's total of one kind of error: nvidia-smi R535+ splits it by SRAM and DRAM (and the
    SRAM uncorrectable ones by parity and SEC-DED); older ones show single_bit/double_bit totals."""
    if kind == "corrected":
        split = _sum(f"ecc_errors/{counter}/sram_correctable", f"ecc_errors/{counter}/dram_correctable")
        legacy = _number(f"ecc_errors/{counter}/single_bit/total")
    else:
        split = _sum(
            f"ecc_errors/{counter}/sram_uncorrectable_parity",
            f"ecc_errors/{counter}/sram_uncorrectable_secded",
            f"ecc_errors/{counter}/sram_uncorrectable",
            f"ecc_errors/{counter}/dram_uncorrectable",
        )
        legacy = _number(f"ecc_errors/{counter}/double_bit/total")
    return _first(split, legacy)


def _reasons(gpu: ET.Element) -> int | None:
    for group, prefix in (("clocks_event_reasons", "clocks_event_reason_"), ("clocks_throttle_reasons", "clocks_throttle_reason_")):
        node = gpu.find(group)
        if node is None:
            continue
        bits = 0
        for tag, bit in REASON_TAGS.items():
            text = _text(node, prefix + tag)
            if text is not None and text.lower() == "active":
                bits |= bit
        return bits
    return None


def _threshold(absolute: str, margin: str) -> Callable[[ET.Element], float | None]:
    """A temperature threshold in Celsius: the older absolute tag, else the R550+ margin (T.Limit)
    below the maximum operating temperature, which is `gpu_temp_max_gpu_tlimit_threshold`'s zero."""

    def read(gpu: ET.Element) -> float | None:
        value = _number(f"temperature/{absolute}")(gpu)
        if value is not None:
            return value
        limit = _number(f"temperature/{margin}")(gpu)
        tlimit = _number("temperature/gpu_temp_tlimit")(gpu)
        current = _number("temperature/gpu_temp")(gpu)
        if limit is None or tlimit is None or current is None:
            return None
        return current + tlimit - limit  # the maximum operating temperature is current + T.Limit

    return read


def _compute_mode(gpu: ET.Element) -> str | None:
    text = _text(gpu, "compute_mode")
    return None if text is None else text.lower().replace(" ", "_")


RULES: tuple[Rule, ...] = (
    Rule("uuid", lambda g, h: g.uuid, lambda x: _text(x, "uuid")),
    Rule("name", lambda g, h: g.name, lambda x: _text(x, "product_name")),
    Rule("utilization_gpu_pct", lambda g, h: g.utilization_gpu_pct, _number("utilization/gpu_util"), 10),
    Rule("utilization_memory_pct", lambda g, h: g.utilization_memory_pct, _number("utilization/memory_util"), 15),
    Rule("memory_used_mib", lambda g, h: g.memory_used_mib, _number("fb_memory_usage/used"), 64),
    Rule("memory_total_mib", lambda g, h: g.memory_total_mib, _number("fb_memory_usage/total")),
    Rule("temperature_c", lambda g, h: g.temperature_c, _number("temperature/gpu_temp"), 3),
    Rule("memory_temperature_c", lambda g, h: g.memory_temperature_c, _number("temperature/memory_temp"), 3),
    Rule(
        "power_w",
        lambda g, h: g.power_w,
        _first(_number("gpu_power_readings/average_power_draw"), _number("power_readings/power_draw")),
        40,
        "NVML's power usage is a one-second average; nvidia-smi's average power draw is the same reading",
    ),
    Rule(
        "power_limit_w",
        lambda g, h: g.power_limit_w,
        _first(_number("gpu_power_readings/current_power_limit"), _number("power_readings/enforced_power_limit")),
        0.5,
    ),
    Rule("compute_mode", lambda g, h: g.compute_mode.value if g.compute_mode else None, _compute_mode),
    Rule("sm_clock_mhz", lambda g, h: g.sm_clock_mhz, _number("clocks/sm_clock"), 150),
    Rule("clock_event_reasons", lambda g, h: g.clock_event_reasons, _reasons),
    Rule("ecc_corrected_volatile", lambda g, h: g.ecc_corrected_volatile, _ecc("volatile", "corrected")),
    Rule("ecc_uncorrected_volatile", lambda g, h: g.ecc_uncorrected_volatile, _ecc("volatile", "uncorrected")),
    Rule("retired_pages_pending", lambda g, h: g.retired_pages_pending, _yes("retired_pages/pending_retirement")),
    Rule("remapped_rows_pending", lambda g, h: g.remapped_rows_pending, _yes("remapped_rows/remapped_row_pending")),
    Rule("remapped_rows_failed", lambda g, h: g.remapped_rows_failed, _yes("remapped_rows/remapped_row_failure")),
    Rule("health.sm_clock_max_mhz", lambda g, h: h.sm_clock_max_mhz, _number("max_clocks/sm_clock")),
    Rule("health.memory_clock_mhz", lambda g, h: h.memory_clock_mhz, _number("clocks/mem_clock")),
    Rule("health.memory_clock_max_mhz", lambda g, h: h.memory_clock_max_mhz, _number("max_clocks/mem_clock")),
    Rule(
        "health.temperature_slowdown_c",
        lambda g, h: h.temperature_slowdown_c,
        _threshold("gpu_temp_slow_threshold", "gpu_temp_slow_tlimit_threshold"),
    ),
    Rule(
        "health.temperature_shutdown_c",
        lambda g, h: h.temperature_shutdown_c,
        _threshold("gpu_temp_max_threshold", "gpu_temp_max_tlimit_threshold"),
    ),
    Rule(
        "health.temperature_max_operating_c",
        lambda g, h: h.temperature_max_operating_c,
        _threshold("gpu_temp_max_gpu_threshold", "gpu_temp_max_gpu_tlimit_threshold"),
    ),
    Rule("health.pcie_link_gen", lambda g, h: h.pcie_link_gen, _number("pci/pci_gpu_link_info/pcie_gen/current_link_gen")),
    Rule("health.pcie_link_gen_max", lambda g, h: h.pcie_link_gen_max, _number("pci/pci_gpu_link_info/pcie_gen/max_link_gen")),
    Rule(
        "health.pcie_link_width", lambda g, h: h.pcie_link_width, _number("pci/pci_gpu_link_info/link_widths/current_link_width")
    ),
    Rule(
        "health.pcie_link_width_max", lambda g, h: h.pcie_link_width_max, _number("pci/pci_gpu_link_info/link_widths/max_link_width")
    ),
    Rule("health.pcie_replay_count", lambda g, h: h.pcie_replay_count, _number("pci/replay_counter")),
    Rule("health.ecc_corrected_aggregate", lambda g, h: h.ecc_corrected_aggregate, _ecc("aggregate", "corrected")),
    Rule("health.ecc_uncorrected_aggregate", lambda g, h: h.ecc_uncorrected_aggregate, _ecc("aggregate", "uncorrected")),
    Rule("health.remapped_rows_corrected", lambda g, h: h.remapped_rows_corrected, _number("remapped_rows/remapped_row_corr")),
    Rule("health.remapped_rows_uncorrected", lambda g, h: h.remapped_rows_uncorrected, _number("remapped_rows/remapped_row_unc")),
    Rule(
        "health.retired_pages",
        lambda g, h: h.retired_pages,
        _sum(
            "retired_pages/multiple_single_bit_retirement/retired_count",
            "retired_pages/double_bit_retirement/retired_count",
        ),
    ),
    Rule("health.fan_speed_pct", lambda g, h: h.fan_speed_pct, _number("fan_speed")),
)


def compare(sample: NodeSampled, smi: ET.Element) -> list[Row]:
    """A row per field per GPU; GPUs are matched by UUID (nvidia-smi's order may differ from NVML's)."""
    theirs = {(_text(gpu, "uuid") or ""): gpu for gpu in smi.findall("gpu")}
    rows: list[Row] = []
    for gpu in sample.gpus:
        xml = theirs.get(gpu.uuid)
        if xml is None:
            rows.append(Row(gpu.index, "uuid", gpu.uuid, None, False, "nvidia-smi does not list this GPU"))
            continue
        health = gpu.health or GpuHealth()
        for rule in RULES:
            ours, other = rule.ours(gpu, health), rule.theirs(xml)
            rows.append(Row(gpu.index, rule.field, ours, other, _agree(ours, other, rule.tolerance), rule.note))
        rows.append(_processes(gpu, xml))
    return rows


def _agree(ours: Any, theirs: Any, tolerance: float) -> bool:
    if ours is None or theirs is None:
        return ours is None and theirs is None
    if isinstance(ours, bool) or isinstance(theirs, bool):
        return bool(ours) == bool(theirs)
    if isinstance(ours, (int, float)) and isinstance(theirs, (int, float)):
        return abs(float(ours) - float(theirs)) <= tolerance
    return str(ours) == str(theirs)


def _processes(gpu: GpuSample, xml: ET.Element) -> Row:
    """The compute processes and their memory, MiB (within 2)."""
    listed = {}
    for info in xml.findall("processes/process_info"):
        if (_text(info, "type") or "C") in ("C", "C+G"):
            pid = _number("pid")(info)
            if pid is not None:
                listed[int(pid)] = _number("used_memory")(info)
    ours = {p.pid: p.used_memory_mib for p in gpu.processes}
    agree = set(ours) == set(listed) and all(
        _agree(ours[pid], listed[pid], 2) for pid in ours if ours[pid] is not None and listed.get(pid) is not None
    )
    return Row(gpu.index, "processes (pid: MiB)", ours, listed, agree)


def render(rows: list[Row]) -> str:
    lines = [f"{'gpu':>3}  {'field':<34} {'node-sampler':>22} {'nvidia-smi':>22}  "]
    for row in rows:
        mark = "ok" if row.agree else "DIFFERS"
        lines.append(f"{row.gpu:>3}  {row.field:<34} {_show(row.sampler):>22} {_show(row.nvidia_smi):>22}  {mark}")
    differ = sum(not row.agree for row in rows)
    lines.append(f"{len(rows) - differ} of {len(rows)} agree" + (f"; {differ} differ" if differ else ""))
    return "\n".join(lines)


def _show(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    return str(value)


async def _sample() -> NodeSampled:
    import pynvml

    from node_sampler.procs import ProcFsTable
    from node_sampler.sampler import Sampler

    sampler = Sampler("crosscheck", pynvml, ProcFsTable("/proc"), [], 1.0, holder_scan_interval_s=0)
    try:
        return await sampler.sample()  # a first sample reads the health figures too
    finally:
        sampler.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m node_sampler.crosscheck", description=__doc__.splitlines()[0])
    parser.add_argument("--xml", type=Path, help="a saved `nvidia-smi -q -x` (default: run nvidia-smi now)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args(argv)
    sample = asyncio.run(_sample())
    if args.xml is not None:
        text = args.xml.read_text()
    else:
        try:
            text = subprocess.run(["nvidia-smi", "-q", "-x"], capture_output=True, text=True, check=True, timeout=60).stdout
        except (OSError, subprocess.SubprocessError) as exc:
            print(f"crosscheck: nvidia-smi -q -x failed: {exc}", file=sys.stderr)
            return 2
    rows = compare(sample, ET.fromstring(text))
    if not rows:
        print(f"crosscheck: nothing to compare (the sample has no GPU: {'; '.join(sample.errors) or 'no errors'})", file=sys.stderr)
        return 2
    print(json.dumps([asdict(row) for row in rows], default=str, indent=1) if args.json else render(rows))
    return 0 if all(row.agree for row in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
