"""The NVML reader and the XID watcher over the pure-Python fake (and over a simulated node):
every field, one failing field, a lost GPU, no NVML at all."""

from __future__ import annotations

import time

import pynvml
import pytest

from gpumedic_sim.machine.nvml import SimNvml
from gpumedic_sim.machine.node import ScriptedNode
from node_sampler.immediate import XidReading
from node_sampler.nvml import NvmlReader, XidWatcher
from node_sampler.sampler import Sampler
from tests.node_sampler.fakes import MIB, FakeNvml, FakeProcessTable, table_for_two_gpus, two_gpus, until


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
    assert (p.pid, p.start_ticks, p.command, p.used_memory_mib) == (
        41230,
        8812345,
        "python train.py --epochs 90",
        20480,
    )
    assert g1.utilization_gpu_pct == 0
    assert [(p.pid, p.used_memory_mib) for p in g1.processes] == [(41999, 8192), (42000, None)]


async def test_bytes_from_older_bindings_become_text():
    sample = await Sampler("n1", two_gpus(as_bytes=True), table_for_two_gpus(), [], 5.0).sample()
    assert [g.uuid for g in sample.gpus] == ["GPU-aaaa", "GPU-bbbb"]
    assert sample.gpus[0].name == "NVIDIA H100 80GB HBM3"


async def test_one_failing_call_costs_one_field_not_the_sample():
    nvml = two_gpus()
    nvml.failures[(1, "nvmlDeviceGetUtilizationRates")] = pynvml.NVMLError_Unknown

    sample = await Sampler("n1", nvml, table_for_two_gpus(), [], 5.0).sample()

    assert sample.errors == ("gpu 1 utilization: NVMLError_Unknown",)
    g0, g1 = sample.gpus
    assert g0.utilization_gpu_pct == 93 and g0.memory_used_mib == 20480 and len(g0.processes) == 1
    assert g1.utilization_gpu_pct is None and g1.utilization_memory_pct is None
    # the rest of the failing GPU is still read
    assert g1.uuid == "GPU-bbbb" and g1.memory_used_mib == 8192 and len(g1.processes) == 2
    assert not g1.lost


async def test_a_gpu_whose_handle_fails_is_still_listed():
    nvml = two_gpus()
    nvml.failures[(0, "nvmlDeviceGetHandleByIndex")] = pynvml.NVMLError_Unknown
    nvml.failures[(1, "nvmlDeviceGetComputeRunningProcesses")] = pynvml.NVMLError_NotSupported

    sample = await Sampler("n1", nvml, table_for_two_gpus(), [], 5.0).sample()

    # a query the GPU does not support is no fault: no note
    assert sample.errors == ("gpu 0 handle: NVMLError_Unknown",)
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
    nvml.failures[(0, "nvmlDeviceGetMemoryInfo_v2")] = failure
    reading = NvmlReader(nvml).read()
    assert reading.errors == (f"gpu 0 memory: {failure.__name__}",)
    assert reading.gpus[0].memory_used_bytes is None


# --- the health queries, over the pure-Python fake ------------------------------------------


def test_every_health_field_in_the_bindings_units():
    nvml = two_gpus()
    g1 = nvml.gpus[1]
    g1.temp, g1.power_mw, g1.power_limit_mw = 83, 650_001, 690_000
    g1.ecc_uncorrected, g1.ecc_corrected, g1.retired_pending = 2, 11, True
    g1.remapped_rows, g1.compute_mode = (5, 1, 0, 1), 3

    g0, g1 = NvmlReader(nvml).read().gpus

    assert (g0.temperature_c, g0.power_mw, g0.power_limit_mw) == (61, 412_345, 700_000)
    assert (g0.ecc_uncorrected_volatile, g0.ecc_corrected_volatile) == (0, 7)
    assert (g0.retired_pages_pending, g0.remapped_rows_pending, g0.remapped_rows_failed) == (False, False, False)
    assert g0.compute_mode == 0 and not g0.lost
    assert (g1.temperature_c, g1.power_mw, g1.power_limit_mw) == (83, 650_001, 690_000)
    assert (g1.ecc_uncorrected_volatile, g1.ecc_corrected_volatile, g1.retired_pages_pending) == (2, 11, True)
    # (corrected, uncorrected, pending, failure): the flags are the last two
    assert (g1.remapped_rows_pending, g1.remapped_rows_failed, g1.compute_mode) == (False, True, 3)


@pytest.mark.parametrize("absent", [pynvml.NVMLError_NotSupported, pynvml.NVMLError_NoPermission])
def test_an_unsupported_query_is_no_fault_said_once_and_not_asked_again(absent, caplog):
    nvml = two_gpus()
    nvml.failures[(0, "nvmlDeviceGetRemappedRows")] = absent
    nvml.failures[(1, "nvmlDeviceGetPowerUsage")] = absent
    reader = NvmlReader(nvml)

    with caplog.at_level("DEBUG", logger="node_sampler.nvml"):
        readings = [reader.read() for _ in range(3)]

    assert all(r.errors == () for r in readings)
    g0, g1 = readings[-1].gpus
    assert g0.remapped_rows_pending is None and g0.remapped_rows_failed is None and g0.power_mw == 412_345
    assert g1.power_mw is None and g1.power_limit_mw == 700_000 and g1.remapped_rows_pending is False
    assert nvml.calls[(0, "nvmlDeviceGetRemappedRows")] == 1 and nvml.calls[(1, "nvmlDeviceGetPowerUsage")] == 1
    said = [r.getMessage() for r in caplog.records if absent.__name__ in r.getMessage()]
    assert said == [
        f"gpu 0 remapped rows: {absent.__name__}; left out of samples from now on",
        f"gpu 1 power: {absent.__name__}; left out of samples from now on",
    ]
    # a new NVML session asks again (the driver may have changed)
    reader.shutdown()
    reader.read()
    assert nvml.calls[(0, "nvmlDeviceGetRemappedRows")] == 2


def test_a_gpu_lost_mid_read_is_marked_and_asked_nothing_more():
    nvml = two_gpus()
    nvml.failures[(1, "nvmlDeviceGetTemperature")] = pynvml.NVMLError_GpuIsLost

    reading = NvmlReader(nvml).read()

    assert reading.errors == ("gpu 1: NVMLError_GpuIsLost",)
    g0, g1 = reading.gpus
    assert g1.lost and not g0.lost
    # what was read before the loss stands; nothing after it was asked
    assert (g1.uuid, g1.utilization_gpu_pct, g1.memory_used_bytes) == ("GPU-bbbb", 0, 8192 * MIB)
    assert g1.temperature_c is None and g1.power_mw is None and g1.compute_mode is None
    assert nvml.calls[(1, "nvmlDeviceGetPowerUsage")] == 0 and nvml.calls[(1, "nvmlDeviceGetComputeMode")] == 0
    assert g0.temperature_c == 61 and g0.compute_mode == 0 and g0.ecc_corrected_volatile == 7


def test_a_gpu_lost_later_keeps_its_uuid_and_costs_one_call_per_read():
    nvml = two_gpus()
    reader = NvmlReader(nvml)
    reader.read()
    nvml.gpus[0].lost = True
    before = sum(n for (gpu, _), n in nvml.calls.items() if gpu == 0)

    reading = reader.read()

    assert reading.errors == ("gpu 0: NVMLError_GpuIsLost",)
    g0 = reading.gpus[0]
    assert g0.lost and g0.uuid == "GPU-aaaa" and g0.name == "NVIDIA H100 80GB HBM3" and g0.utilization_gpu_pct is None
    assert sum(n for (gpu, _), n in nvml.calls.items() if gpu == 0) == before + 1
    assert reading.gpus[1].temperature_c == 61


def test_a_warm_read_asks_each_gpu_fourteen_things():
    nvml = two_gpus()
    reader = NvmlReader(nvml)
    reader.read()
    nvml.calls.clear()

    reader.read()

    # handle, uuid and name are kept from the first read
    assert sum(nvml.calls.values()) == 1 + 2 * 14
    assert nvml.calls[(0, "nvmlDeviceGetUUID")] == 0 and nvml.calls[(1, "nvmlDeviceGetHandleByIndex")] == 0


def test_nvml_gone_under_the_reader_is_initialised_again():
    nvml = two_gpus()
    reader = NvmlReader(nvml)
    reader.read()
    nvml.failures[(-1, "nvmlDeviceGetCount")] = pynvml.NVMLError_Uninitialized

    assert reader.read().errors == ("device count: NVMLError_Uninitialized",)
    del nvml.failures[(-1, "nvmlDeviceGetCount")]
    reading = reader.read()

    assert len(reading.gpus) == 2 and reading.errors == ()
    assert nvml.init_calls == 2
    assert nvml.calls[(0, "nvmlDeviceGetUUID")] == 2  # nothing kept from the old session


# --- the XID watcher, over the pure-Python fake and over a simulated node --------------------


def _registered(nvml: FakeNvml, *gpus: int) -> bool:
    return any(s.gpus == set(gpus) and not s.freed for s in nvml.event_sets)


def test_xids_reach_on_xid_and_stop_gives_nvml_back(watchers):
    nvml = two_gpus()
    seen: list[XidReading] = []
    watcher = XidWatcher(NvmlReader(nvml), seen.append, wait_ms=50)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: _registered(nvml, 0, 1))

    nvml.xids.put((1, 48))
    nvml.xids.put((0, 79))

    assert until(lambda: len(seen) == 2)
    assert seen == [
        XidReading(xid=48, gpu_index=1, gpu_uuid="GPU-bbbb"),
        XidReading(xid=79, gpu_index=0, gpu_uuid="GPU-aaaa"),
    ]
    watcher.stop()
    assert not watcher.running and nvml.sessions == 0 and nvml.event_sets[0].freed


def test_on_xid_that_raises_does_not_end_watching(watchers):
    nvml = two_gpus()
    seen: list[int] = []

    def on_xid(reading: XidReading) -> None:
        seen.append(reading.xid)
        if reading.xid == 13:
            raise RuntimeError("caller bug")

    watcher = XidWatcher(nvml, on_xid, wait_ms=50)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: _registered(nvml, 0, 1))
    nvml.xids.put((0, 13))
    nvml.xids.put((0, 31))
    assert until(lambda: seen == [13, 31])


def test_a_gpu_refusing_events_is_skipped_and_said_once(watchers, caplog):
    nvml = two_gpus()
    nvml.failures[(0, "nvmlDeviceRegisterEvents")] = pynvml.NVMLError_NotSupported
    seen: list[XidReading] = []
    watcher = XidWatcher(nvml, seen.append, wait_ms=50)
    watchers.append(watcher)

    with caplog.at_level("INFO", logger="node_sampler.nvml"):
        watcher.start()
        assert until(lambda: _registered(nvml, 1))
        nvml.xids.put((0, 48))  # nobody listens on GPU 0: NVML does not deliver it
        nvml.xids.put((1, 94))
        assert until(lambda: len(seen) == 1)

    assert seen == [XidReading(xid=94, gpu_index=1, gpu_uuid="GPU-bbbb")]
    assert [r.getMessage() for r in caplog.records if "no XID events" in r.getMessage()] == [
        "gpu 0: no XID events (NVMLError_NotSupported)"
    ]


def test_a_failing_wait_is_said_once_and_retried_after_a_pause(watchers, caplog):
    nvml = two_gpus()
    nvml.failures[(-1, "nvmlEventSetWait_v2")] = pynvml.NVMLError_Unknown
    seen: list[XidReading] = []
    watcher = XidWatcher(nvml, seen.append, wait_ms=50, backoff_s=0.1)
    watchers.append(watcher)

    with caplog.at_level("WARNING", logger="node_sampler.nvml"):
        watcher.start()
        time.sleep(0.45)
        waits = nvml.calls[(-1, "nvmlEventSetWait_v2")]
        del nvml.failures[(-1, "nvmlEventSetWait_v2")]
        nvml.xids.put((1, 48))
        assert until(lambda: len(seen) == 1)

    assert 2 <= waits <= 6  # a pause between tries, not a spin
    assert [r.getMessage() for r in caplog.records if "wait failed" in r.getMessage()] == [
        "XID event wait failed (NVMLError_Unknown); retrying"
    ]


def test_xid_watcher_without_nvml_says_so_once_and_starts_when_it_loads(watchers, caplog):
    nvml = two_gpus(missing=True)
    seen: list[XidReading] = []
    watcher = XidWatcher(nvml, seen.append, wait_ms=50, retry_init_s=0.02)
    watchers.append(watcher)

    with caplog.at_level("INFO", logger="node_sampler.nvml"):
        watcher.start()
        assert until(lambda: nvml.init_calls >= 3)
        nvml.missing = False
        assert until(lambda: _registered(nvml, 0, 1))
        nvml.xids.put((0, 79))
        assert until(lambda: len(seen) == 1)

    messages = [r.getMessage() for r in caplog.records]
    assert messages.count("XID events off until NVML loads: NVMLError_LibraryNotFound") == 1
    assert "XID events on for GPUs [0, 1]" in messages


def test_the_same_watcher_and_reader_over_a_simulated_node(watchers):
    node = ScriptedNode("sim-node-03", 2, seed=7)
    node.start_job(0)
    node.gpus[1].ecc_corrected, node.gpus[1].remapped_rows_pending, node.gpus[1].compute_mode = 4, True, 3
    nvml = SimNvml(node)
    reader = NvmlReader(nvml)
    seen: list[XidReading] = []
    watcher = XidWatcher(reader, seen.append, wait_ms=50)
    watchers.append(watcher)
    watcher.start()

    busy, idle = reader.read().gpus
    node.inject_xid(1, 48)

    assert until(lambda: len(seen) == 1)
    assert seen == [XidReading(xid=48, gpu_index=1, gpu_uuid=node.gpus[1].uuid)]
    # load heats the GPU and draws power towards the limit; the idle one sits at its idle figures
    assert busy.temperature_c > idle.temperature_c == 34
    assert 600_000 < busy.power_mw < 700_000 and idle.power_mw == 72_000 and busy.power_limit_mw == 700_000
    assert (idle.ecc_corrected_volatile, idle.remapped_rows_pending, idle.compute_mode) == (4, True, 3)
    # an H100 has no page retirement: None, and no note
    assert busy.retired_pages_pending is None
    watcher.stop()
    # the reader's session outlives the watcher's (init is refcounted)
    assert reader.read().errors == ()
