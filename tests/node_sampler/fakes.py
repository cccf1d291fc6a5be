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

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._enter(handle, "nvmlDeviceGetMemoryInfo")
        g = self.gpus[handle]
        return SimpleNamespace(used=g.used_mib * MIB, total=g.total_mib * MIB, free=(g.total_mib - g.used_mib) * MIB)

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
        if counter_type != pynvml.NVML_VOLATILE_ECC:
            raise pynvml.NVMLError_InvalidArgument()
        g = self.gpus[handle]
        return {
            pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED: g.ecc_uncorrected,
            pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED: g.ecc_corrected,
        }[error_type]

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

    def describe(self, pid, errors=None):
        info = self.processes.get(pid)
        if info is None and errors is not None:
            errors.append(f"pid {pid}: gone")
        return info

    def pids(self, errors=None):
        return sorted(self.processes)

    def device_holders(self, errors=None):
        return dict(self.holders)


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
