"""A pynvml-like fake for the sampler tests: the binding's function names, units and exceptions."""

from __future__ import annotations

import queue
import time
from collections import Counter
from dataclasses import dataclass, field
from types import SimpleNamespace

import pynvml

from node_sampler.procs import ProcessInfo

MIB = 1024 * 1024


@dataclass
class FakeGpu:
    uuid: str
    name: str = "NVIDIA H100 80GB HBM3"
    util: int = 93
    mem_util: int = 41
    used_mib: int = 20480
    total_mib: int = 81559
    processes: list[tuple[int, int | None]] = field(default_factory=list)
    """(pid, used MiB or None) per compute process."""
    temp: int = 61
    power_mw: int = 412_345
    power_limit_mw: int = 700_000
    ecc_uncorrected: int = 0
    ecc_corrected: int = 7
    retired_pending: bool = False
    remapped_rows: tuple[int, int, int, int] = (0, 0, 0, 0)
    """(corrected, uncorrected, pending, failure occurred), as nvmlDeviceGetRemappedRows returns."""
    compute_mode: int = 0
    lost: bool = False
    """Every call about it raises NVMLError_GpuIsLost."""
    reserved_mib: int = 616
    """What the driver reserves: nvmlMemory_v2 says it apart, the first version counts it as used."""
    sm_clock: int = 1755
    sm_clock_max: int = 1980
    mem_clock: int = 2619
    mem_clock_max: int = 2619
    clock_event_reasons: int = 0x4
    """SW power cap, as a busy GPU at its power limit shows."""
    memory_temp: int | None = 52
    """None: no memory sensor (the field answers NOT_SUPPORTED)."""
    thresholds: dict[int, int] = field(default_factory=lambda: {0: 95, 1: 89, 2: 95, 3: 87})
    """NVML_TEMPERATURE_THRESHOLD_* -> Celsius; a missing one is not supported."""
    pcie: tuple[int, int, int, int] = (5, 5, 16, 16)
    """(generation, maximum generation, width, maximum width)."""
    pcie_replay: int = 0
    ecc_aggregate: tuple[int, int] = (7, 0)
    """(corrected, uncorrected) over the GPU's life."""
    nvlinks: list[tuple[bool, int, int, int, int]] = field(default_factory=list)
    """Per link: (up, replay, recovery, CRC flit, CRC data)."""


class FakeNvml:
    """`failures[(gpu index, function name)]` is the NVMLError class that call raises; index -1
    for calls about no GPU (nvmlEventSetCreate, nvmlEventSetWait_v2). `calls` counts every call
    by (gpu index or -1, function name). `xids.put((gpu, xid))` is an XID for the event set."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, as_bytes: bool = False, missing: bool = False) -> None:
        self.gpus = gpus
        self.as_bytes = as_bytes
        self.missing = missing
        self.failures: dict[tuple[int, str], type[Exception]] = {}
        self.calls: Counter[tuple[int, str]] = Counter()
        self.init_calls = 0
        self.shutdown_calls = 0
        self.sessions = 0
        """Successful nvmlInit calls not yet matched by nvmlShutdown (NVML's init is refcounted)."""
        self.xids: queue.Queue[tuple[int, int]] = queue.Queue()
        self.event_sets: list[SimpleNamespace] = []

    def nvmlInit(self):
        self.init_calls += 1
        if self.missing:
            raise pynvml.NVMLError_LibraryNotFound()
        self.sessions += 1

    def nvmlShutdown(self):
        self.shutdown_calls += 1
        if self.sessions == 0:
            raise pynvml.NVMLError_Uninitialized()
        self.sessions -= 1

    def nvmlDeviceGetCount(self):
        self._enter(-1, "nvmlDeviceGetCount")
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._enter(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetIndex(self, handle):
        self._enter(handle, "nvmlDeviceGetIndex")
        return handle

    def nvmlDeviceGetUUID(self, handle):
        self._enter(handle, "nvmlDeviceGetUUID")
        return self._text(self.gpus[handle].uuid)

    def nvmlDeviceGetName(self, handle):
        self._enter(handle, "nvmlDeviceGetName")
        return self._text(self.gpus[handle].name)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._enter(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.gpus[handle].util, memory=self.gpus[handle].mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle, version=None):
        self._enter(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        g = self.gpus[handle]
        free = (g.total_mib - g.used_mib - g.reserved_mib) * MIB
        if version:
            return SimpleNamespace(used=g.used_mib * MIB, reserved=g.reserved_mib * MIB, total=g.total_mib * MIB, free=free)
        return SimpleNamespace(used=(g.used_mib + g.reserved_mib) * MIB, total=g.total_mib * MIB, free=free)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._enter(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
            for pid, mib in self.gpus[handle].processes
        ]

    def nvmlDeviceGetTemperature(self, handle, sensor):
        self._enter(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return self.gpus[handle].temp

    def nvmlDeviceGetPowerUsage(self, handle):
        self._enter(handle, "nvmlDeviceGetPowerUsage")
        return self.gpus[handle].power_mw

    def nvmlDeviceGetEnforcedPowerLimit(self, handle):
        self._enter(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return self.gpus[handle].power_limit_mw

    def nvmlDeviceGetTotalEccErrors(self, handle, error_type, counter_type):
        self._enter(handle, "nvmlDeviceGetTotalEccErrors")
        g = self.gpus[handle]
        if counter_type == pynvml.NVML_AGGREGATE_ECC:
            corrected, uncorrected = g.ecc_aggregate
        elif counter_type == pynvml.NVML_VOLATILE_ECC:
            corrected, uncorrected = g.ecc_corrected, g.ecc_uncorrected
        else:
            raise pynvml.NVMLError_InvalidArgument()
        return {pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: uncorrected, pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: corrected}[
            error_type
        ]

    def nvmlDeviceGetClockInfo(self, handle, clock_type):
        self._enter(handle, "nvmlDeviceGetClockInfo")
        g = self.gpus[handle]
        return {pynvml.NVML_CLOCK_SM: g.sm_clock, pynvml.NVML_CLOCK_GRAPHICS: g.sm_clock, pynvml.NVML_CLOCK_MEM: g.mem_clock}[
            clock_type
        ]

    def nvmlDeviceGetMaxClockInfo(self, handle, clock_type):
        self._enter(handle, "nvmlDeviceGetMaxClockInfo")
        g = self.gpus[handle]
        return {pynvml.NVML_CLOCK_SM: g.sm_clock_max, pynvml.NVML_CLOCK_MEM: g.mem_clock_max}[clock_type]

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle):
        self._enter(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return self.gpus[handle].clock_event_reasons

    def nvmlDeviceGetTemperatureThreshold(self, handle, threshold):
        self._enter(handle, "nvmlDeviceGetTemperatureThreshold")
        value = self.gpus[handle].thresholds.get(threshold)
        if value is None:
            raise pynvml.NVMLError_NotSupported()
        return value

    def nvmlDeviceGetFieldValues(self, handle, field_ids):
        """Only the memory temperature is known; each value answers on its own, as NVML's do."""
        self._enter(handle, "nvmlDeviceGetFieldValues")
        temp = self.gpus[handle].memory_temp
        values = []
        for field_id in field_ids:
            known = field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP and temp is not None
            values.append(
                SimpleNamespace(
                    fieldId=field_id,
                    nvmlReturn=pynvml.NVML_SUCCESS if known else pynvml.NVML_ERROR_NOT_SUPPORTED,
                    valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                    value=SimpleNamespace(uiVal=temp if known else 0),
                )
            )
        return values

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle):
        self._enter(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
        return self.gpus[handle].pcie[0]

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle):
        self._enter(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        return self.gpus[handle].pcie[1]

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle):
        self._enter(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        return self.gpus[handle].pcie[2]

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle):
        self._enter(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        return self.gpus[handle].pcie[3]

    def nvmlDeviceGetPcieReplayCounter(self, handle):
        self._enter(handle, "nvmlDeviceGetPcieReplayCounter")
        return self.gpus[handle].pcie_replay

    def nvmlDeviceGetFanSpeed(self, handle):
        self._enter(handle, "nvmlDeviceGetFanSpeed")
        raise pynvml.NVMLError_NotSupported()  # an SXM board's fans are the chassis's

    def nvmlDeviceGetRetiredPages(self, handle, cause):
        self._enter(handle, "nvmlDeviceGetRetiredPages")
        raise pynvml.NVMLError_NotSupported()  # Hopper remaps rows instead

    def nvmlDeviceGetNvLinkState(self, handle, link):
        self._enter(handle, "nvmlDeviceGetNvLinkState")
        links = self.gpus[handle].nvlinks
        if link >= len(links):
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED if links[link][0] else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle, link, counter):
        self._enter(handle, "nvmlDeviceGetNvLinkErrorCounter")
        links = self.gpus[handle].nvlinks
        if link >= len(links) or not 0 <= counter <= 3:
            raise pynvml.NVMLError_NotSupported()
        return links[link][1 + counter]

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle):
        self._enter(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        return pynvml.NVML_FEATURE_ENABLED if self.gpus[handle].retired_pending else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetRemappedRows(self, handle):
        self._enter(handle, "nvmlDeviceGetRemappedRows")
        return self.gpus[handle].remapped_rows

    def nvmlDeviceGetComputeMode(self, handle):
        self._enter(handle, "nvmlDeviceGetComputeMode")
        return self.gpus[handle].compute_mode

    # the event set: XIDs come from `xids`, only for GPUs registered on the set
    def nvmlEventSetCreate(self):
        self._enter(-1, "nvmlEventSetCreate")
        event_set = SimpleNamespace(gpus=set(), freed=False)
        self.event_sets.append(event_set)
        return event_set

    def nvmlDeviceRegisterEvents(self, handle, event_types, event_set):
        self._enter(handle, "nvmlDeviceRegisterEvents")
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            event_set.gpus.add(handle)

    def nvmlEventSetWait_v2(self, event_set, timeout_ms):
        self._enter(-1, "nvmlEventSetWait_v2")
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                gpu, xid = self.xids.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise pynvml.NVMLError_Timeout() from None
            if gpu in event_set.gpus:
                return SimpleNamespace(device=gpu, eventType=pynvml.nvmlEventTypeXidCriticalError, eventData=xid)

    def nvmlEventSetFree(self, event_set):
        self._enter(-1, "nvmlEventSetFree")
        event_set.freed = True

    def _enter(self, index, function):
        self.calls[(index, function)] += 1
        if index >= 0 and self.gpus[index].lost:
            raise pynvml.NVMLError_GpuIsLost()
        failure = self.failures.get((index, function))
        if failure is not None:
            raise failure()

    def _text(self, value: str):
        return value.encode() if self.as_bytes else value


class FakeProcessTable:
    def __init__(
        self, processes: dict[int, ProcessInfo] | None = None, holders: dict[int, tuple[str, ...]] | None = None
    ) -> None:
        self.processes = processes or {}
        self.holders = holders or {}
        """pid -> the /dev/nvidia* files it holds open."""
        self.usages: dict = {}
        """pid -> ProcessUsage: what `usage` answers."""

    def describe(self, pid, errors=None):
        info = self.processes.get(pid)
        if info is None and errors is not None:
            errors.append(f"pid {pid}: gone")
        return info

    def pids(self, errors=None):
        return sorted(self.processes)

    def device_holders(self, errors=None):
        return dict(self.holders)

    def usage(self, errors=None):
        return dict(self.usages)


def two_gpus(**kwargs) -> FakeNvml:
    return FakeNvml(
        [
            FakeGpu(uuid="GPU-aaaa", processes=[(41230, 20480)]),
            FakeGpu(uuid="GPU-bbbb", util=0, mem_util=0, used_mib=8192, processes=[(41999, 8192), (42000, None)]),
        ],
        **kwargs,
    )


def table_for_two_gpus() -> FakeProcessTable:
    return FakeProcessTable(
        {
            41230: ProcessInfo(41230, 8812345, "python train.py --epochs 90"),
            41999: ProcessInfo(41999, 8899999, "python -m selfplay --gpu 1"),
            42000: ProcessInfo(42000, 8900000, "python helper.py"),
        }
    )


def until(predicate, timeout_s: float = 2.0) -> bool:
    """Poll `predicate` (a watcher thread works meanwhile) until true or the time is up."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.005)
    return predicate()
