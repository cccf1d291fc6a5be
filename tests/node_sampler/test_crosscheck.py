"""The crosscheck against nvidia-smi -q -x, over what a real H200 showed (tests/fixtures/nvidia-smi,
taken on the device machine with driver 580.159.04; serial number blanked)."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from pathlib import Path

import pynvml

from node_sampler.crosscheck import compare, render
from node_sampler.procs import ProcessInfo
from node_sampler.sampler import Sampler
from tests.node_sampler.fakes import FakeGpu, FakeNvml, FakeProcessTable

FIXTURES = Path(__file__).parents[1] / "fixtures" / "nvidia-smi"
UUID = "GPU-6f4a64b0-28ae-237f-6a84-5cf7638b7156"


def _h200_as_nvml_answered(**changes) -> FakeNvml:
    """The busy H200's NVML answers as the device run read them (docs/real-nvml.md)."""
    gpu = FakeGpu(
        uuid=UUID,
        name="NVIDIA H200",
        util=98,
        mem_util=24,
        used_mib=975,
        total_mib=143771,
        processes=[(464, 966)],
        temp=53,
        power_mw=690_296,
        power_limit_mw=700_000,
        ecc_uncorrected=0,
        ecc_corrected=0,
        reserved_mib=616,
        sm_clock=1470,
        sm_clock_max=1980,
        mem_clock=3201,
        mem_clock_max=3201,
        clock_event_reasons=0x4,
        memory_temp=47,
        ecc_aggregate=(0, 0),
    )
    for name, value in changes.items():
        setattr(gpu, name, value)
    nvml = FakeNvml([gpu])
    nvml.failures[(0, "nvmlDeviceGetRetiredPagesPendingStatus")] = pynvml.NVMLError_NotSupported
    return nvml


async def _sample(nvml: FakeNvml):
    table = FakeProcessTable({464: ProcessInfo(pid=464, start_ticks=4393, command="python3 -", user="root")})
    return await Sampler("h200-node", nvml, table, [], 1.0).sample()


def _smi(name: str) -> ET.Element:
    return ET.fromstring((FIXTURES / name).read_text())


async def test_a_sample_of_the_busy_h200_agrees_with_nvidia_smi_on_every_field():
    rows = compare(await _sample(_h200_as_nvml_answered()), _smi("h200-busy.xml"))

    assert [row for row in rows if not row.agree] == []
    fields = {row.field: row for row in rows}
    # the thresholds nvidia-smi shows as T.Limit margins (-2, -8, 0 C at 53 C with T.Limit 34 C)
    assert fields["health.temperature_slowdown_c"].nvidia_smi == 89
    assert fields["health.temperature_shutdown_c"].nvidia_smi == 95
    assert fields["health.temperature_max_operating_c"].nvidia_smi == 87
    assert fields["clock_event_reasons"].nvidia_smi == 0x4  # SW power cap only
    assert fields["processes (pid: MiB)"].sampler == {464: 966}
    assert "0 differ" not in render(rows) and render(rows).endswith(f"{len(rows)} of {len(rows)} agree")


async def test_used_memory_that_counts_the_drivers_reserve_is_caught():
    # what the first nvmlMemory version says: 975 MiB used + 616 MiB reserved
    rows = compare(await _sample(_h200_as_nvml_answered(used_mib=975 + 616)), _smi("h200-busy.xml"))

    assert [(row.field, row.sampler, row.nvidia_smi) for row in rows if not row.agree] == [("memory_used_mib", 1591, 975.0)]
    assert "1 differ" in render(rows)


async def test_the_idle_h200_differs_where_it_should():
    # compared with the idle document, the busy sample's moving figures and its process disagree
    rows = compare(await _sample(_h200_as_nvml_answered()), _smi("h200-idle.xml"))

    differ = {row.field for row in rows if not row.agree}
    assert {"utilization_gpu_pct", "power_w", "sm_clock_mhz", "clock_event_reasons", "processes (pid: MiB)"} <= differ
    assert "memory_total_mib" not in differ and "health.temperature_slowdown_c" not in differ


async def test_a_gpu_nvidia_smi_does_not_list_is_one_row():
    rows = compare(await _sample(_h200_as_nvml_answered(uuid="GPU-other")), _smi("h200-busy.xml"))

    assert [(row.field, row.agree) for row in rows] == [("uuid", False)]
