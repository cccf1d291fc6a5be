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
from typing import Any, Protocol

import pynvml

from gpumedic_sim.machine.parts import SimGpu, SimProcess

MIB = 1024 * 1024
TEMPERATURE_RISE_AT_FULL_LOAD_C = 45
"""How far above its idle `temperature_c` a GPU runs at 100 % utilisation."""
BUSY_LOAD = 0.9
"""The load of a GPU a process computes on, for temperature and power."""
NO_INSTANCE = 0xFFFFFFFF
"""gpuInstanceId / computeInstanceId of an event outside MIG."""
IDLE_SM_CLOCK_MHZ = 345
"""An idle H100's or H200's SM clock (docs/real-nvml.md)."""
SLOWDOWN_CLOCK_SHARE = 0.5
"""A hardware slowdown halves the clocks or worse (NVIDIA's clocks event reasons documentation)."""
SLOWDOWNS = 0x8 | 0x20 | 0x40 | 0x80
"""HW slowdown, SW thermal slowdown, HW thermal slowdown, HW power brake."""
SW_POWER_CAP = 0x4
HW_THERMAL_SLOWDOWN = 0x8 | 0x40
"""HW slowdown with its thermal cause, as nvidia-smi lists it (HW Slowdown: HW Thermal Slowdown)."""
CAPPED_CLOCK_SHARE = 0.7
"""A busy GPU under a lower power cap runs its SM clock lower (an H200 at its 700 W: 0.75 of max)."""
MEMORY_BELOW_CORE_C = 7
"""HBM ran 7 C below the core on a busy H200 (docs/real-nvml.md)."""

NVMLError = pynvml.NVMLError


class SimEventSet:
    """nvmlEventSetCreate's result: which GPUs' XIDs it was registered for."""

    def __init__(self) -> None:
        self.gpus: set[int] = set()
        self.freed = False


class NvmlNode(Protocol):
    """What NVML reads of its node (`NodeState`'s)."""

    gpus: list[SimGpu]
    nvml_missing: bool
    xid_queue: queue.Queue[tuple[int, int]]

    def live_processes(self, gpu: int | None = None) -> list[SimProcess]: ...
    def utilization(self, gpu: int) -> tuple[int, int]: ...
    def memory_used_mib(self, gpu: int) -> int: ...


class SimNvml:
    """The NVML of one simulated node."""

    NVMLError = pynvml.NVMLError

    def __init__(self, node: NvmlNode) -> None:
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

    def nvmlDeviceGetMemoryInfo(self, handle: SimGpu, version: int | None = None) -> SimpleNamespace:
        """Either version: the simulated driver reserves nothing, so both say the same."""
        self._check(handle, "nvmlDeviceGetMemoryInfo_v2" if version else "nvmlDeviceGetMemoryInfo")
        used = self._node.memory_used_mib(handle.index) * MIB
        total = handle.total_mib * MIB
        return SimpleNamespace(used=used, total=total, free=total - used, reserved=0)

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
        return self._temperature(handle)

    def nvmlDeviceGetPowerUsage(self, handle: SimGpu) -> int:
        """mW: idle power plus the utilised share of the headroom up to the limit (a cap the
        operator set included: the GPU then runs at lower clocks to stay under it)."""
        self._check(handle, "nvmlDeviceGetPowerUsage")
        watts = handle.idle_power_w + (handle.power_limit_w - handle.idle_power_w) * self._load(handle) * handle.pace
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

    # --- health: clocks, thresholds, the PCIe link, NVLinks ----------------------------------

    def nvmlDeviceGetClockInfo(self, handle: SimGpu, clock_type: int) -> int:
        """SM: idle clocks when nothing computes, the maximum when busy, held down by a fault's
        hardware slowdown; memory: its one clock."""
        self._check(handle, "nvmlDeviceGetClockInfo")
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return handle.memory_clock_mhz
        if clock_type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise pynvml.NVMLError_InvalidArgument()
        if not self._load(handle):
            return IDLE_SM_CLOCK_MHZ
        reasons = self._reasons(handle)
        share = SLOWDOWN_CLOCK_SHARE if reasons & SLOWDOWNS else CAPPED_CLOCK_SHARE if reasons & SW_POWER_CAP else 1.0
        return round(handle.sm_clock_max_mhz * share * handle.pace)

    def nvmlDeviceGetMaxClockInfo(self, handle: SimGpu, clock_type: int) -> int:
        self._check(handle, "nvmlDeviceGetMaxClockInfo")
        if clock_type == pynvml.NVML_CLOCK_MEM:
            return handle.memory_clock_mhz
        if clock_type not in (pynvml.NVML_CLOCK_SM, pynvml.NVML_CLOCK_GRAPHICS):
            raise pynvml.NVMLError_InvalidArgument()
        return handle.sm_clock_max_mhz

    def nvmlDeviceGetCurrentClocksEventReasons(self, handle: SimGpu) -> int:
        """GPU idle when nothing computes, plus whatever a fault holds the clocks down with."""
        self._check(handle, "nvmlDeviceGetCurrentClocksEventReasons")
        return self._reasons(handle)

    def nvmlDeviceGetTemperatureThreshold(self, handle: SimGpu, threshold: int) -> int:
        self._check(handle, "nvmlDeviceGetTemperatureThreshold")
        thresholds = {
            pynvml.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN: handle.temperature_shutdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN: handle.temperature_slowdown_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_MEM_MAX: handle.memory_temperature_max_c,
            pynvml.NVML_TEMPERATURE_THRESHOLD_GPU_MAX: handle.temperature_max_operating_c,
        }
        if threshold not in thresholds:
            raise pynvml.NVMLError_NotSupported()
        return thresholds[threshold]

    def nvmlDeviceGetFieldValues(self, handle: SimGpu, field_ids: list[int]) -> list[SimpleNamespace]:
        """The memory (HBM) temperature, which runs a little below the core's; nothing else."""
        self._check(handle, "nvmlDeviceGetFieldValues")
        memory = self._temperature(handle) - MEMORY_BELOW_CORE_C
        return [
            SimpleNamespace(
                fieldId=field_id,
                nvmlReturn=pynvml.NVML_SUCCESS if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP else pynvml.NVML_ERROR_NOT_SUPPORTED,
                valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT,
                value=SimpleNamespace(uiVal=memory if field_id == pynvml.NVML_FI_DEV_MEMORY_TEMP else 0),
            )
            for field_id in field_ids
        ]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetCurrPcieLinkGeneration")
        return handle.pcie_link_gen

    def nvmlDeviceGetMaxPcieLinkGeneration(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetMaxPcieLinkGeneration")
        return handle.pcie_link_gen_max

    def nvmlDeviceGetCurrPcieLinkWidth(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetCurrPcieLinkWidth")
        return handle.pcie_link_width

    def nvmlDeviceGetMaxPcieLinkWidth(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetMaxPcieLinkWidth")
        return handle.pcie_link_width_max

    def nvmlDeviceGetPcieReplayCounter(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetPcieReplayCounter")
        return handle.pcie_replays

    def nvmlDeviceGetFanSpeed(self, handle: SimGpu) -> int:
        self._check(handle, "nvmlDeviceGetFanSpeed")
        raise pynvml.NVMLError_NotSupported()  # an SXM board is cooled by the chassis

    def nvmlDeviceGetRetiredPages(self, handle: SimGpu, cause: int) -> list[int]:
        """The pages retired for multiple single-bit errors (cause 0); none for double-bit ones."""
        self._check(handle, "nvmlDeviceGetRetiredPages")
        if handle.retired_pages is None:
            raise pynvml.NVMLError_NotSupported()  # remaps rows instead
        return [0x1F000 + page for page in range(handle.retired_pages)] if cause == 0 else []

    def nvmlDeviceGetNvLinkState(self, handle: SimGpu, link: int) -> int:
        self._check(handle, "nvmlDeviceGetNvLinkState")
        if not 0 <= link < len(handle.nvlinks):
            raise pynvml.NVMLError_NotSupported()
        return pynvml.NVML_FEATURE_ENABLED if handle.nvlinks[link].up else pynvml.NVML_FEATURE_DISABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, handle: SimGpu, link: int, counter: int) -> int:
        """Replay, recovery, CRC flit (all the CRC errors here), CRC data (none)."""
        self._check(handle, "nvmlDeviceGetNvLinkErrorCounter")
        if not 0 <= link < len(handle.nvlinks) or counter not in (0, 1, 2, 3):
            raise pynvml.NVMLError_NotSupported()
        state = handle.nvlinks[link]
        return (state.replay_errors, state.recovery_errors, state.crc_errors, 0)[counter]

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

    def _reasons(self, handle: SimGpu) -> int:
        """Idle; or busy at a cap the operator set; hot past the slowdown temperature (the GPU
        slows itself down); and whatever a fault holds the clocks down with."""
        busy = bool(self._load(handle))
        reasons = handle.clock_event_reasons | (SW_POWER_CAP if busy and handle.power_capped else 0)
        if not busy:
            reasons |= pynvml.nvmlClocksEventReasonGpuIdle
        if self._temperature(handle) >= handle.temperature_slowdown_c:
            reasons |= HW_THERMAL_SLOWDOWN
        return reasons

    def _temperature(self, handle: SimGpu) -> int:
        return handle.temperature_c + handle.heat_c + round(TEMPERATURE_RISE_AT_FULL_LOAD_C * self._load(handle))

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
