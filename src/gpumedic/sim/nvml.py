"""A pynvml stand-in over a simulated node, so the real node-sampler code reads it unchanged.

It has the function names node_sampler.nvml calls and raises the real `pynvml.NVMLError`
subclasses for faults, exactly as the binding does on a real node; values come back in the
binding's units (bytes, percent, milliwatts, degrees C) and shapes (objects with .gpu/.memory,
.used/.total, .pid/.usedGpuMemory; a 4-tuple from nvmlDeviceGetRemappedRows). Init is
reference-counted as in the binding, so the sampler's reader and its XID watcher can share one.

The event set answers the XID watcher: nvmlEventSetWait_v2 blocks on the node's `xid_queue`
and raises NVMLError_Timeout when nothing came, as the binding does. Like an H100, a simulated
GPU has row remapping and no page retirement: nvmlDeviceGetRetiredPagesPendingStatus raises
NVMLError_NotSupported.
"""

from __future__ import annotations

import queue
import threading
import time
from types import SimpleNamespace
from typing import Any

import pynvml

from gpumedic.sim.state import NodeState, SimGpu

MIB = 1024 * 1024
TEMPERATURE_RISE_AT_FULL_LOAD_C = 45
"""How far above its idle `temperature_c` a GPU runs at 100 % utilisation."""
BUSY_LOAD = 0.9
"""The load of a GPU a process computes on, for temperature and power."""
NO_INSTANCE = 0xFFFFFFFF
"""gpuInstanceId / computeInstanceId of an event outside MIG."""

NVMLError = pynvml.NVMLError


class SimEventSet:
    """nvmlEventSetCreate's result: which GPUs' XIDs it was registered for."""

    def __init__(self) -> None:
        self.gpus: set[int] = set()
        self.freed = False


class SimNvml:
    """The NVML of one simulated node."""

    NVMLError = pynvml.NVMLError

    def __init__(self, node: NodeState) -> None:
        self._node = node
        self._init_count = 0
        self._init_lock = threading.Lock()

    def nvmlInit(self) -> None:
        if self._node.nvml_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        with self._init_lock:
            self._init_count += 1

    def nvmlShutdown(self) -> None:
        with self._init_lock:
            if self._init_count == 0:
                raise pynvml.NVMLError_Uninitialized()
            self._init_count -= 1

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        self._check_init()
        if not 0 <= index < len(self._node.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self._node.gpus[index]

    def nvmlDeviceGetIndex(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetIndex")
        return handle.index

    def nvmlDeviceGetUUID(self, handle: SimGpu) -> str:
        self._check(handle, "nvmlDeviceGetUUID")
        return handle.uuid

    def nvmlDeviceGetName(self, handle: SimGpu) -> str:
        self._check(handle, "nvmlDeviceGetName")
        return handle.name

    def nvmlDeviceGetUtilizationRates(self, handle: SimGpu) -> SimpleNamespace:
        self._check(handle, "nvmlDeviceGetUtilizationRates")
        gpu, memory = self._node.utilization(handle.index)
        return SimpleNamespace(gpu=gpu, memory=memory)

    def nvmlDeviceGetMemoryInfo(self, handle: SimGpu) -> SimpleNamespace:
        self._check(handle, "nvmlDeviceGetMemoryInfo")
        used = self._node.memory_used_mib(handle.index) * MIB
        total = handle.total_mib * MIB
        return SimpleNamespace(used=used, total=total, free=total - used)

    def nvmlDeviceGetComputeRunningProcesses(self, handle: SimGpu) -> list[SimpleNamespace]:
        self._check(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_mib * MIB) for p in self._node.live_processes(handle.index)
        ]

    def nvmlDeviceGetTemperature(self, handle: SimGpu, sensor: int) -> int:
        """`temperature_c` is the idle temperature; load heats the GPU up to 45 C above it."""
        self._check(handle, "nvmlDeviceGetTemperature")
        if sensor != pynvml.NVML_TEMPERATURE_GPU:
            raise pynvml.NVMLError_InvalidArgument()
        return handle.temperature_c + round(TEMPERATURE_RISE_AT_FULL_LOAD_C * self._load(handle))

    def nvmlDeviceGetPowerUsage(self, handle: SimGpu) -> int:
        """mW: idle power plus the utilised share of the headroom up to the limit."""
        self._check(handle, "nvmlDeviceGetPowerUsage")
        watts = handle.idle_power_w + (handle.power_limit_w - handle.idle_power_w) * self._load(handle)
        return int(watts * 1000)

    def nvmlDeviceGetEnforcedPowerLimit(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetEnforcedPowerLimit")
        return int(handle.power_limit_w * 1000)

    def nvmlDeviceGetTotalEccErrors(self, handle: SimGpu, error_type: int, counter_type: int) -> int:
        """Volatile and aggregate counters are the same here (no reboot in a simulation)."""
        self._check(handle, "nvmlDeviceGetTotalEccErrors")
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_UNCORRECTED:
            return handle.ecc_uncorrected
        if error_type == pynvml.NVML_MEMORY_ERROR_TYPE_CORRECTED:
            return handle.ecc_corrected
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetRetiredPagesPendingStatus(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetRetiredPagesPendingStatus")
        raise pynvml.NVMLError_NotSupported()

    def nvmlDeviceGetRemappedRows(self, handle: SimGpu) -> tuple[int, int, int, int]:
        """(corrected rows, uncorrected rows, remapping pending, remapping failed)."""
        self._check(handle, "nvmlDeviceGetRemappedRows")
        return 0, 0, int(handle.remapped_rows_pending), int(handle.remapped_rows_failed)

    def nvmlDeviceGetComputeMode(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetComputeMode")
        return handle.compute_mode

    # --- events -----------------------------------------------------------------------------

    def nvmlEventSetCreate(self) -> SimEventSet:
        self._check_init()
        return SimEventSet()

    def nvmlDeviceRegisterEvents(self, handle: SimGpu, event_types: int, event_set: SimEventSet) -> None:
        self._check(handle, "nvmlDeviceRegisterEvents")
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        if event_types & pynvml.nvmlEventTypeXidCriticalError:
            event_set.gpus.add(handle.index)

    def nvmlEventSetWait_v2(self, event_set: SimEventSet, timeout_ms: int) -> SimpleNamespace:
        """The next XID of a registered GPU from the node's `xid_queue`; others are dropped, as
        NVML delivers no event to a set that did not ask for it."""
        self._check_init()
        if event_set.freed:
            raise pynvml.NVMLError_InvalidArgument()
        deadline = time.monotonic() + timeout_ms / 1000
        while True:
            try:
                index, xid = self._node.xid_queue.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise pynvml.NVMLError_Timeout() from None
            if index in event_set.gpus and 0 <= index < len(self._node.gpus):
                return SimpleNamespace(
                    device=self._node.gpus[index],
                    eventType=pynvml.nvmlEventTypeXidCriticalError,
                    eventData=xid,
                    gpuInstanceId=NO_INSTANCE,
                    computeInstanceId=NO_INSTANCE,
                )

    def nvmlEventSetWait(self, event_set: SimEventSet, timeout_ms: int) -> SimpleNamespace:
        return self.nvmlEventSetWait_v2(event_set, timeout_ms)

    def nvmlEventSetFree(self, event_set: SimEventSet) -> None:
        self._check_init()
        event_set.freed = True

    # --- helpers ----------------------------------------------------------------------------

    def _load(self, handle: SimGpu) -> float:
        """0.9 while a process computes on the GPU (utilization reads 85-95 %), else 0; drawn
        from no random numbers, so reading temperature and power leaves the node's seed alone."""
        return BUSY_LOAD if any(p.producing for p in self._node.live_processes(handle.index)) else 0.0

    def _check_init(self) -> None:
        if self._init_count == 0:
            raise pynvml.NVMLError_Uninitialized()
        if self._node.nvml_missing:
            # the driver went away under a running session (a bad upgrade, a crashed module)
            raise pynvml.NVMLError_DriverNotLoaded()

    def _check(self, handle: Any, function: str) -> None:
        self._check_init()
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        failure = handle.failing.get(function)
        if failure is not None:
            raise failure()
