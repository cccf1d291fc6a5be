"""The NVML reader and the XID watcher through the REAL pynvml, over a fake libnvidia-ml.so.1.

The fake (fake_nvml/fake_nvml.c) answers the C entry points pynvml's ctypes wrappers call, with
the struct layouts they pass, so these tests also pin the symbol names, argument orders and
units the binding uses: a wrapper that changed would fail here, not on a GPU node.
"""

from __future__ import annotations

import ctypes
import logging
import time

import pynvml
import pytest

from node_sampler.immediate import XidReading
from node_sampler.readings import RawGpu, RawHealth, RawNvLink, RawProcess
from node_sampler.nvml import NvmlReader, XidWatcher
from tests.node_sampler.fake_nvml import GIB, FakeNvmlLib
from tests.node_sampler.fakes import until

NOT_SUPPORTED, NO_PERMISSION, DRIVER_NOT_LOADED, GPU_IS_LOST, UNKNOWN = 3, 4, 9, 15, 999
QUERIES_PER_WARM_GPU = 14


def _busy_node(fake: FakeNvmlLib, gpus: int = 2) -> None:
    fake.set_gpu_count(gpus)
    fake.set_ids(0, "GPU-5f1c2d3e-0000-4a4a-9b9b-000000000000", "NVIDIA H100 80GB HBM3")
    fake.set_gpu(0, util=93, mem_util=41, used_bytes=20 * GIB, total_bytes=80 * GIB, temp=67, power_mw=612_345)
    fake.set_health(0, ecc_uncorrected=2, ecc_corrected=17, retired_pending=True, remap_pending=True, compute_mode=3)
    fake.add_process(0, 41230, 20 * GIB)
    fake.add_process(0, 41231, None)


def test_every_field_with_its_unit(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.set_health(1, ecc_corrected=1, remapped_corrected=4, remapped_uncorrected=1, remap_failed=True)

    reading = NvmlReader(pynvml).read()

    assert reading.errors == ()
    assert reading.gpus == (
        RawGpu(
            index=0,
            uuid="GPU-5f1c2d3e-0000-4a4a-9b9b-000000000000",
            name="NVIDIA H100 80GB HBM3",
            utilization_gpu_pct=93,
            utilization_memory_pct=41,
            memory_used_bytes=20 * GIB,
            memory_total_bytes=80 * GIB,
            processes=(RawProcess(41230, 20 * GIB), RawProcess(41231, None)),
            temperature_c=67,
            power_mw=612_345,
            power_limit_mw=700_000,
            ecc_uncorrected_volatile=2,
            ecc_corrected_volatile=17,
            retired_pages_pending=True,
            remapped_rows_pending=True,
            remapped_rows_failed=False,
            compute_mode=3,
            sm_clock_mhz=345,
            clock_event_reasons=0x1,
            memory_temperature_c=30,
        ),
        RawGpu(
            index=1,
            uuid="GPU-fake-1",
            name="Fake H100 80GB HBM3",
            utilization_gpu_pct=0,
            utilization_memory_pct=0,
            memory_used_bytes=0,
            memory_total_bytes=80 * GIB,
            processes=(),
            temperature_c=35,
            power_mw=70_000,
            power_limit_mw=700_000,
            ecc_uncorrected_volatile=0,
            ecc_corrected_volatile=1,
            retired_pages_pending=False,
            remapped_rows_pending=False,
            remapped_rows_failed=True,
            compute_mode=0,
            sm_clock_mhz=345,
            clock_event_reasons=0x1,
            memory_temperature_c=30,
        ),
    )


def test_a_health_read_brings_every_slowly_changing_figure(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.set_clocks(0, sm=1470, sm_max=1980, memory=3201, memory_max=3201, reasons=0x4 | 0x40)
    fake_nvml.set_thermal(0, memory_temp=71, shutdown=92, slowdown=87, memory_max=95, gpu_max=85)
    fake_nvml.set_pcie(0, gen=4, gen_max=5, width=8, width_max=16, replay=12)
    fake_nvml.set_ecc_aggregate(0, corrected=33, uncorrected=1)
    fake_nvml.set_health(0, remapped_corrected=4, remapped_uncorrected=1)
    fake_nvml.set_nvlink(0, 0, up=True, replay=2, recovery=1, crc_flit=5, crc_data=6)
    fake_nvml.set_nvlink(0, 1, up=False)

    reading = NvmlReader(pynvml).read(health=True)

    assert reading.errors == ()
    g0, g1 = reading.gpus
    assert (g0.sm_clock_mhz, g0.clock_event_reasons, g0.memory_temperature_c) == (1470, 0x44, 71)
    assert g0.health == RawHealth(
        sm_clock_max_mhz=1980,
        memory_clock_mhz=3201,
        memory_clock_max_mhz=3201,
        temperature_slowdown_c=87,
        temperature_shutdown_c=92,
        temperature_max_operating_c=85,
        memory_temperature_max_c=95,
        pcie_link_gen=4,
        pcie_link_gen_max=5,
        pcie_link_width=8,
        pcie_link_width_max=16,
        pcie_replay_count=12,
        ecc_corrected_aggregate=33,
        ecc_uncorrected_aggregate=1,
        remapped_rows_corrected=4,
        remapped_rows_uncorrected=1,
        retired_pages=None,  # Hopper: not supported, so not a note
        fan_speed_pct=None,  # SXM: not supported
        nvlink_count=2,
        nvlinks=(RawNvLink(0, True, 2, 1, 11), RawNvLink(1, False, 0, 0, 0)),
    )
    assert g1.health is not None and g1.health.nvlinks == () and g1.health.pcie_link_gen == 5


def test_fixed_figures_and_the_nvlink_count_are_asked_once_per_session(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.set_nvlink(0, 2)  # links 0, 1 and 2
    fake_nvml.set_thermal(1, memory_temp=None, memory_max=None)
    reader = NvmlReader(pynvml)

    first = reader.read(health=True)
    second = reader.read(health=True)

    assert first.gpus[0].health == second.gpus[0].health and len(second.gpus[0].health.nvlinks) == 3
    assert fake_nvml.calls(0, "nvmlDeviceGetMaxClockInfo") == 2  # SM and memory, once
    assert fake_nvml.calls(0, "nvmlDeviceGetTemperatureThreshold") == 4
    # GPU 0: links 0-2 and the index that ended them, then links 0-2 again; GPU 1: link 0 once
    assert fake_nvml.calls(0, "nvmlDeviceGetNvLinkState") == 4 + 3
    assert fake_nvml.calls(1, "nvmlDeviceGetNvLinkState") == 1
    g1 = second.gpus[1]
    assert g1.memory_temperature_c is None and g1.health.memory_temperature_max_c is None and second.errors == ()
    assert fake_nvml.calls(1, "nvmlDeviceGetFieldValues") == 1  # no memory sensor: not asked again


def test_unsupported_fields_are_none_without_a_note(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.fail(0, "nvmlDeviceGetRemappedRows", NOT_SUPPORTED)
    fake_nvml.fail(0, "nvmlDeviceGetRetiredPagesPendingStatus", NOT_SUPPORTED)
    fake_nvml.fail(1, "nvmlDeviceGetPowerUsage", NO_PERMISSION)
    reader = NvmlReader(pynvml)

    first, second = reader.read(), reader.read()

    assert first.errors == second.errors == ()
    g0, g1 = second.gpus
    assert (g0.retired_pages_pending, g0.remapped_rows_pending, g0.remapped_rows_failed) == (None, None, None)
    assert g0.power_mw == 612_345 and g0.compute_mode == 3
    assert g1.power_mw is None and g1.power_limit_mw == 700_000
    # a property of the GPU: not asked again in this session
    assert fake_nvml.calls(0, "nvmlDeviceGetRemappedRows") == 1 and fake_nvml.calls(1, "nvmlDeviceGetPowerUsage") == 1


def test_a_gpu_lost_mid_sample_is_marked_and_the_others_fully_read(fake_nvml):
    _busy_node(fake_nvml, gpus=3)
    reader = NvmlReader(pynvml)
    reader.read()
    fake_nvml.fail(1, "nvmlDeviceGetMemoryInfo_v2", GPU_IS_LOST)
    temperature_reads = fake_nvml.calls(1, "nvmlDeviceGetTemperature")

    reading = reader.read()

    assert reading.errors == ("gpu 1: NVMLError_GpuIsLost",)
    g0, g1, g2 = reading.gpus
    assert g1.lost and g1.uuid == "GPU-fake-1" and g1.utilization_gpu_pct == 0
    assert g1.memory_used_bytes is None and g1.temperature_c is None and g1.compute_mode is None
    assert fake_nvml.calls(1, "nvmlDeviceGetTemperature") == temperature_reads  # nothing asked after the loss
    assert not g0.lost and g0.compute_mode == 3 and g0.memory_used_bytes == 20 * GIB and len(g0.processes) == 2
    assert not g2.lost and g2.memory_total_bytes == 80 * GIB and g2.remapped_rows_failed is False


def test_a_gpu_off_the_bus_before_the_first_read(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.lose_gpu(1)

    reading = NvmlReader(pynvml).read()

    assert reading.errors == ("gpu 1: NVMLError_GpuIsLost",)
    assert reading.gpus[1] == RawGpu(index=1, lost=True)
    assert reading.gpus[0].temperature_c == 67


def test_an_unknown_error_is_a_note_naming_gpu_and_query(fake_nvml):
    _busy_node(fake_nvml)
    fake_nvml.fail(1, "nvmlDeviceGetTemperature", UNKNOWN)
    fake_nvml.fail(0, "nvmlDeviceGetTotalEccErrors", UNKNOWN)
    reader = NvmlReader(pynvml)

    reading = reader.read()

    assert reading.errors == (
        "gpu 0 ecc uncorrected: NVMLError_Unknown",
        "gpu 0 ecc corrected: NVMLError_Unknown",
        "gpu 1 temperature: NVMLError_Unknown",
    )
    assert reading.gpus[1].temperature_c is None and reading.gpus[1].power_mw == 70_000
    assert reading.gpus[0].ecc_uncorrected_volatile is None and reading.gpus[0].compute_mode == 3
    # a fault, unlike NotSupported, is asked about again (and noted again) at the next read
    assert reader.read().errors == reading.errors


def test_driver_not_loaded_then_loaded(fake_nvml, caplog):
    _busy_node(fake_nvml)
    fake_nvml.set_init_error(DRIVER_NOT_LOADED)
    reader = NvmlReader(pynvml)

    with caplog.at_level("WARNING", logger="node_sampler.nvml"):
        first, second = reader.read(), reader.read()
    fake_nvml.set_init_error(0)
    third = reader.read()

    assert first == second
    assert first.gpus == () and first.errors == ("NVML unavailable: NVMLError_DriverNotLoaded",)
    assert len([r for r in caplog.records if "NVML unavailable" in r.getMessage()]) == 1
    assert len(third.gpus) == 2 and third.errors == () and third.gpus[0].temperature_c == 67
    assert fake_nvml.init_count() == 1


def test_library_not_found_then_installed(fake_nvml, monkeypatch):
    """pynvml's own loader: CDLL("libnvidia-ml.so.1") fails until the driver is installed."""
    _busy_node(fake_nvml)
    installed = False

    def cdll(name, *args, **kwargs):
        assert name == "libnvidia-ml.so.1"
        if not installed:
            raise OSError(f"{name}: cannot open shared object file")
        return fake_nvml.cdll

    monkeypatch.setattr(pynvml, "nvmlLib", None)
    monkeypatch.setattr(pynvml, "CDLL", cdll)
    reader = NvmlReader(pynvml)

    assert reader.read().errors == ("NVML unavailable: NVMLError_LibraryNotFound",)
    installed = True
    reading = reader.read()

    assert reading.errors == ()
    assert [g.uuid for g in reading.gpus] == ["GPU-5f1c2d3e-0000-4a4a-9b9b-000000000000", "GPU-fake-1"]


def test_a_warm_read_of_eight_gpus_makes_one_call_per_query(fake_nvml):
    fake_nvml.set_gpu_count(8)
    reader = NvmlReader(pynvml)
    reader.read()
    before = sum(fake_nvml.calls(gpu) for gpu in range(-1, 8))

    reader.read()

    assert sum(fake_nvml.calls(gpu) for gpu in range(-1, 8)) - before == 1 + 8 * QUERIES_PER_WARM_GPU
    assert fake_nvml.calls(3, "nvmlDeviceGetUUID") == 1 and fake_nvml.calls(3, "nvmlDeviceGetHandleByIndex_v2") == 1
    # with no processes the size query answers SUCCESS: one C call a read (two when there are some)
    assert fake_nvml.calls(3, "nvmlDeviceGetComputeRunningProcesses_v3") == 2


def test_an_xid_reaches_on_xid_with_gpu_index_and_uuid(fake_nvml, watchers):
    _busy_node(fake_nvml)
    seen: list[XidReading] = []
    watcher = XidWatcher(pynvml, seen.append, wait_ms=100)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: fake_nvml.registered(0) and fake_nvml.registered(1))

    sent_at = time.monotonic()
    assert fake_nvml.push_xid(1, 79) == 1
    assert fake_nvml.push_xid(0, 48) == 1

    assert until(lambda: len(seen) == 2)
    # the event wakes the blocked wait: no need to sit out its timeout
    assert time.monotonic() - sent_at < 0.09
    assert seen == [
        XidReading(xid=79, gpu_index=1, gpu_uuid="GPU-fake-1"),
        XidReading(xid=48, gpu_index=0, gpu_uuid="GPU-5f1c2d3e-0000-4a4a-9b9b-000000000000"),
    ]
    # the event's device pointer is matched against the registered handles, with no driver call
    assert fake_nvml.calls(0, "nvmlDeviceGetIndex") == fake_nvml.calls(1, "nvmlDeviceGetIndex") == 0


def test_stop_returns_within_the_wait_and_gives_nvml_back(fake_nvml, watchers):
    _busy_node(fake_nvml)
    watcher = XidWatcher(pynvml, lambda r: None, wait_ms=500)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: fake_nvml.registered(1))
    assert fake_nvml.init_count() == 1 and fake_nvml.live_sets() == 1
    time.sleep(0.05)  # let it block in nvmlEventSetWait_v2

    started = time.monotonic()
    watcher.stop()

    assert time.monotonic() - started < 0.8
    assert not watcher.running
    assert fake_nvml.live_sets() == 0 and fake_nvml.calls(-1, "nvmlEventSetFree") == 1
    assert fake_nvml.init_count() == 0 and fake_nvml.calls(-1, "nvmlShutdown") == 1
    assert pynvml._nvmlLib_refcount == 0


def test_the_watcher_leaves_the_readers_session_alone(fake_nvml, watchers):
    _busy_node(fake_nvml)
    reader = NvmlReader(pynvml)
    reader.read()
    watcher = XidWatcher(reader, lambda r: None, wait_ms=50)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: fake_nvml.registered(0))

    watcher.stop()

    assert fake_nvml.init_count() == 1
    assert reader.read().errors == ()


def test_xid_watcher_without_nvml_says_so_once_then_starts(fake_nvml, watchers, caplog):
    _busy_node(fake_nvml)
    fake_nvml.set_init_error(DRIVER_NOT_LOADED)
    seen: list[XidReading] = []
    watcher = XidWatcher(pynvml, seen.append, wait_ms=50, retry_init_s=0.02)
    watchers.append(watcher)

    with caplog.at_level(logging.INFO, logger="node_sampler.nvml"):
        watcher.start()
        assert until(lambda: fake_nvml.calls(-1, "nvmlInitWithFlags") >= 4)
        fake_nvml.set_init_error(0)
        assert until(lambda: fake_nvml.registered(0))
        fake_nvml.push_xid(0, 31)
        assert until(lambda: len(seen) == 1)

    off = [r for r in caplog.records if r.getMessage().startswith("XID events off")]
    assert [(r.levelname, r.getMessage()) for r in off] == [
        ("WARNING", "XID events off until NVML loads: NVMLError_DriverNotLoaded")
    ]
    assert seen[0].xid == 31


def test_a_gpu_refusing_xid_events_is_skipped(fake_nvml, watchers):
    _busy_node(fake_nvml)
    fake_nvml.fail(0, "nvmlDeviceRegisterEvents", NOT_SUPPORTED)
    seen: list[XidReading] = []
    watcher = XidWatcher(pynvml, seen.append, wait_ms=50)
    watchers.append(watcher)
    watcher.start()
    assert until(lambda: fake_nvml.registered(1))

    assert not fake_nvml.registered(0)
    fake_nvml.push_xid(1, 94)
    assert until(lambda: len(seen) == 1)
    assert seen == [XidReading(xid=94, gpu_index=1, gpu_uuid="GPU-fake-1")]


def test_a_failing_wait_backs_off_and_recovers(fake_nvml, watchers, caplog):
    _busy_node(fake_nvml)
    fake_nvml.fail(-1, "nvmlEventSetWait_v2", UNKNOWN)
    seen: list[XidReading] = []
    watcher = XidWatcher(pynvml, seen.append, wait_ms=50, backoff_s=0.1)
    watchers.append(watcher)

    with caplog.at_level(logging.WARNING, logger="node_sampler.nvml"):
        watcher.start()
        time.sleep(0.45)
        waits = fake_nvml.calls(-1, "nvmlEventSetWait_v2")
        fake_nvml.fail(-1, "nvmlEventSetWait_v2", 0)
        fake_nvml.push_xid(0, 48)
        assert until(lambda: len(seen) == 1)

    assert 2 <= waits <= 6
    assert [r.getMessage() for r in caplog.records if "wait failed" in r.getMessage()] == [
        "XID event wait failed (NVMLError_Unknown); retrying"
    ]


def test_the_fake_keeps_pynvmls_struct_layouts(fake_nvml):
    """The wrappers the reader does not go through but the watcher's data relies on."""
    _busy_node(fake_nvml)
    pynvml.nvmlInit()
    try:
        handle = pynvml.nvmlDeviceGetHandleByIndex(1)
        assert pynvml.nvmlDeviceGetIndex(handle) == 1
        event_set = pynvml.nvmlEventSetCreate()
        pynvml.nvmlDeviceRegisterEvents(handle, pynvml.nvmlEventTypeXidCriticalError, event_set)
        with pytest.raises(pynvml.NVMLError_Timeout):
            pynvml.nvmlEventSetWait_v2(event_set, 1)
        fake_nvml.push_xid(1, 119)
        data = pynvml.nvmlEventSetWait_v2(event_set, 1000)
        assert (data.eventType, data.eventData) == (pynvml.nvmlEventTypeXidCriticalError, 119)
        address = ctypes.cast(data.device, ctypes.c_void_p).value
        assert address == ctypes.cast(handle, ctypes.c_void_p).value
        pynvml.nvmlEventSetFree(event_set)
        assert str(pynvml.NVMLError(NOT_SUPPORTED)) == "Not Supported"
    finally:
        pynvml.nvmlShutdown()
