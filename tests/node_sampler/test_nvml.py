"""The NVML reader through the Sampler: every field, one failing field, no NVML at all."""

from __future__ import annotations

import pynvml
import pytest

from node_sampler.nvml import NvmlReader
from node_sampler.sampler import Sampler
from tests.node_sampler.fakes import FakeNvml, FakeProcessTable, table_for_two_gpus, two_gpus


async def test_every_field_is_filled():
    sample = await Sampler("gpu-node-07", two_gpus(), table_for_two_gpus(), [], 5.0).sample()

    assert sample.source == "node-sampler"
    assert sample.node_id == "gpu-node-07"
    assert sample.interval_s == 5.0
    assert sample.errors == ()
    g0, g1 = sample.gpus
    assert (g0.index, g0.uuid, g0.name) == (0, "GPU-aaaa", "NVIDIA H100 80GB HBM3")
    assert (g0.utilization_gpu_pct, g0.utilization_memory_pct) == (93, 41)
    assert (g0.memory_used_mib, g0.memory_total_mib) == (20480, 81559)
    (p,) = g0.processes
    assert (p.pid, p.start_ticks, p.command, p.used_memory_mib) == (41230, 8812345, "python train.py --epochs 90", 20480)
    assert g1.utilization_gpu_pct == 0
    assert [(p.pid, p.used_memory_mib) for p in g1.processes] == [(41999, 8192), (42000, None)]


async def test_bytes_from_older_bindings_become_text():
    sample = await Sampler("n1", two_gpus(as_bytes=True), table_for_two_gpus(), [], 5.0).sample()
    assert [g.uuid for g in sample.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert sample.gpus[0].name == "NVIDIA H100 80GB HBM3"


async def test_one_failing_call_costs_one_field_not_the_sample():
    nvml = two_gpus()
    nvml.failures[(1, "nvmlDeviceGetUtilizationRates")] = pynvml.NVMLError_GpuIsLost

    sample = await Sampler("n1", nvml, table_for_two_gpus(), [], 5.0).sample()

    assert sample.errors == ("gpu 1 utilization: NVMLError_GpuIsLost",)
    g0, g1 = sample.gpus
    assert g0.utilization_gpu_pct == 93 and g0.memory_used_mib == 20480 and len(g0.processes) == 1
    assert g1.utilization_gpu_pct is None and g1.utilization_memory_pct is None
    # the rest of the failing GPU is still read
    assert g1.uuid == "GPU-bbbb" and g1.memory_used_mib == 8192 and len(g1.processes) == 2


async def test_a_gpu_whose_handle_fails_is_still_listed():
    nvml = two_gpus()
    nvml.failures[(0, "nvmlDeviceGetHandleByIndex")] = pynvml.NVMLError_GpuIsLost
    nvml.failures[(1, "nvmlDeviceGetComputeRunningProcesses")] = pynvml.NVMLError_NotSupported

    sample = await Sampler("n1", nvml, table_for_two_gpus(), [], 5.0).sample()

    assert sample.errors == ("gpu 0 handle: NVMLError_GpuIsLost", "gpu 1 processes: NVMLError_NotSupported")
    assert sample.gpus[0].index == 0 and sample.gpus[0].uuid == "" and sample.gpus[0].memory_used_mib is None
    assert sample.gpus[1].processes == () and sample.gpus[1].memory_used_mib == 8192


async def test_missing_nvml_gives_a_sample_with_an_error_logged_once(caplog):
    nvml = FakeNvml([], missing=True)
    sampler = Sampler("n1", nvml, FakeProcessTable(), [], 5.0)

    with caplog.at_level("WARNING", logger="node_sampler.nvml"):
        first = await sampler.sample()
        second = await sampler.sample()

    assert first.gpus == () and second.gpus == ()
    assert first.errors == ("NVML unavailable: NVMLError_LibraryNotFound",)
    assert second.errors == first.errors
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1


async def test_the_real_binding_without_a_gpu():
    sample = await Sampler("n1", pynvml, FakeProcessTable(), [], 5.0).sample()
    assert sample.gpus == ()
    assert sample.errors and sample.errors[0].startswith("NVML unavailable: NVMLError_")


def test_init_once_and_shutdown():
    nvml = two_gpus()
    reader = NvmlReader(nvml)
    reader.read()
    reader.read()
    reader.shutdown()
    reader.shutdown()
    assert (nvml.init_calls, nvml.shutdown_calls) == (1, 1)


def test_nvml_that_comes_back_is_initialised_then():
    nvml = two_gpus(missing=True)
    reader = NvmlReader(nvml)
    assert reader.read().gpus == ()
    nvml.missing = False
    assert len(reader.read().gpus) == 2


@pytest.mark.parametrize("failure", [pynvml.NVMLError_Unknown, RuntimeError])
def test_any_exception_from_a_binding_is_guarded(failure):
    nvml = two_gpus()
    nvml.failures[(0, "nvmlDeviceGetMemoryInfo")] = failure
    reading = NvmlReader(nvml).read()
    assert reading.errors == (f"gpu 0 memory: {failure.__name__}",)
    assert reading.gpus[0].memory_used_bytes is None
