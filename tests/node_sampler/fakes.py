"""A pynvml-like fake for the sampler tests: the binding's function names, units and exceptions."""

from __future__ import annotations

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


class FakeNvml:
    """`failures[(gpu index, function name)]` is the NVMLError class that call raises."""

    NVMLError = pynvml.NVMLError

    def __init__(self, gpus: list[FakeGpu], *, as_bytes: bool = False, missing: bool = False) -> None:
        self.gpus = gpus
        self.as_bytes = as_bytes
        self.missing = missing
        self.failures: dict[tuple[int, str], type[Exception]] = {}
        self.init_calls = 0
        self.shutdown_calls = 0

    def nvmlInit(self):
        self.init_calls += 1
        if self.missing:
            raise pynvml.NVMLError_LibraryNotFound()

    def nvmlShutdown(self):
        self.shutdown_calls += 1

    def nvmlDeviceGetCount(self):
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index):
        self._fail(index, "nvmlDeviceGetHandleByIndex")
        return index

    def nvmlDeviceGetUUID(self, handle):
        self._fail(handle, "nvmlDeviceGetUUID")
        return self._text(self.gpus[handle].uuid)

    def nvmlDeviceGetName(self, handle):
        self._fail(handle, "nvmlDeviceGetName")
        return self._text(self.gpus[handle].name)

    def nvmlDeviceGetUtilizationRates(self, handle):
        self._fail(handle, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=self.gpus[handle].util, memory=self.gpus[handle].mem_util)

    def nvmlDeviceGetMemoryInfo(self, handle):
        self._fail(handle, "nvmlDeviceGetMemoryInfo")
        g = self.gpus[handle]
        return SimpleNamespace(used=g.used_mib * MIB, total=g.total_mib * MIB, free=(g.total_mib - g.used_mib) * MIB)

    def nvmlDeviceGetComputeRunningProcesses(self, handle):
        self._fail(handle, "nvmlDeviceGetComputeRunningProcesses")
        return [
            SimpleNamespace(pid=pid, usedGpuMemory=None if mib is None else mib * MIB)
            for pid, mib in self.gpus[handle].processes
        ]

    def _fail(self, index, function):
        failure = self.failures.get((index, function))
        if failure is not None:
            raise failure()

    def _text(self, value: str):
        return value.encode() if self.as_bytes else value


class FakeProcessTable:
    def __init__(self, processes: dict[int, ProcessInfo] | None = None) -> None:
        self.processes = processes or {}

    def describe(self, pid, errors=None):
        info = self.processes.get(pid)
        if info is None and errors is not None:
            errors.append(f"pid {pid}: gone")
        return info

    def pids(self, errors=None):
        return sorted(self.processes)


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
