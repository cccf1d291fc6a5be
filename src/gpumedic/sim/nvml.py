"""A pynvml stand-in over a simulated node, so the real node-sampler code reads it unchanged.

It has the function names node_sampler.nvml calls and raises the real `pynvml.NVMLError`
subclasses for faults, exactly as the binding does on a real node; values come back in the
binding's units (bytes, percent) and shapes (objects with .gpu/.memory, .used/.total, .pid/
.usedGpuMemory).
"""

from __future__ import annotations

from types import SimpleNamespace

import pynvml

from gpumedic.sim.state import NodeState, SimGpu

MIB = 1024 * 1024

NVMLError = pynvml.NVMLError


class SimNvml:
    """The NVML of one simulated node."""

    NVMLError = pynvml.NVMLError

    def __init__(self, node: NodeState) -> None:
        self._node = node
        self._initialized = False

    def nvmlInit(self) -> None:
        if self._node.nvml_missing:
            raise pynvml.NVMLError_LibraryNotFound()
        self._initialized = True

    def nvmlShutdown(self) -> None:
        self._check_init()
        self._initialized = False

    def nvmlDeviceGetCount(self) -> int:
        self._check_init()
        return len(self._node.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> SimGpu:
        self._check_init()
        if not 0 <= index < len(self._node.gpus):
            raise pynvml.NVMLError_InvalidArgument()
        return self._node.gpus[index]

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
            SimpleNamespace(pid=p.pid, usedGpuMemory=p.used_mib * MIB)
            for p in self._node.live_processes(handle.index)
        ]

    def _check_init(self) -> None:
        if not self._initialized:
            raise pynvml.NVMLError_Uninitialized()

    def _check(self, handle: SimGpu, function: str) -> None:
        self._check_init()
        if handle.lost:
            raise pynvml.NVMLError_GpuIsLost()
        failure = handle.failing.get(function)
        if failure is not None:
            raise failure()
