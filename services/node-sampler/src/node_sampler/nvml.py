"""Reads every GPU through a pynvml-like module: the real `pynvml` or the simulated node's fake.

Every NVML call is guarded on its own. A GPU that falls off the bus mid-sample, or a driver that
does not support one query, costs that one field and a note in the sample ("gpu 1 utilization:
NVMLError_GpuIsLost"), never the sample: a partial sample is exactly what the detectors need to
see a failing GPU. The calls block (they go into the driver), so the sampler runs `read` in a
worker thread.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from node_sampler.logic import NvmlReading, RawGpu, RawProcess

log = logging.getLogger(__name__)

T = TypeVar("T")


class NvmlReader:
    """One node's NVML session over a pynvml-like module object."""

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._initialized = False
        self._unavailable: str | None = None
        # a read in a worker thread and shutdown at service stop must not interleave in the driver
        self._lock = threading.Lock()

    def read(self) -> NvmlReading:
        """All GPUs now. Blocking."""
        with self._lock:
            if not self._ensure_init():
                return NvmlReading(errors=(f"NVML unavailable: {self._unavailable}",))
            errors: list[str] = []
            count = self._call(errors, "device count", self._nvml.nvmlDeviceGetCount)
            gpus = tuple(self._read_gpu(i, errors) for i in range(count or 0))
            return NvmlReading(gpus=gpus, errors=tuple(errors))

    def shutdown(self) -> None:
        with self._lock:
            if not self._initialized:
                return
            self._initialized = False
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", _name(exc))

    def _ensure_init(self) -> bool:
        """Initialise once; while NVML is missing, try again each interval (a driver may load
        later) but log only when the state changes, not every interval."""
        if self._initialized:
            return True
        try:
            self._nvml.nvmlInit()
        except Exception as exc:
            reason = _name(exc)
            if reason != self._unavailable:
                log.warning("NVML unavailable (%s): samples carry no GPUs until it is", reason)
            self._unavailable = reason
            return False
        if self._unavailable is not None:
            log.info("NVML available again")
        self._unavailable = None
        self._initialized = True
        return True

    def _read_gpu(self, index: int, errors: list[str]) -> RawGpu:
        where = f"gpu {index}"
        nvml = self._nvml
        handle = self._call(errors, f"{where} handle", nvml.nvmlDeviceGetHandleByIndex, index)
        if handle is None:
            return RawGpu(index=index)
        uuid = self._call(errors, f"{where} uuid", nvml.nvmlDeviceGetUUID, handle)
        name = self._call(errors, f"{where} name", nvml.nvmlDeviceGetName, handle)
        rates = self._call(errors, f"{where} utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
        memory = self._call(errors, f"{where} memory", nvml.nvmlDeviceGetMemoryInfo, handle)
        procs = self._call(errors, f"{where} processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
        return RawGpu(
            index=index,
            uuid=_text(uuid),
            name=_text(name),
            utilization_gpu_pct=_int_attr(rates, "gpu"),
            utilization_memory_pct=_int_attr(rates, "memory"),
            memory_used_bytes=_int_attr(memory, "used"),
            memory_total_bytes=_int_attr(memory, "total"),
            processes=None if procs is None else tuple(_raw_process(p) for p in procs if _int_attr(p, "pid")),
        )

    @staticmethod
    def _call(errors: list[str], what: str, fn: Callable[..., T], *args: Any) -> T | None:
        try:
            return fn(*args)
        except Exception as exc:
            # NVMLError subclasses name the fault (NVMLError_GpuIsLost); anything else from a
            # binding is guarded the same way, since one field must never abort the sample
            errors.append(f"{what}: {_name(exc)}")
            return None


def _raw_process(p: Any) -> RawProcess:
    return RawProcess(pid=int(p.pid), used_memory_bytes=_int_attr(p, "usedGpuMemory"))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    # older bindings return bytes
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _int_attr(obj: Any, attr: str) -> int | None:
    value = getattr(obj, attr, None)
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _name(exc: BaseException) -> str:
    return type(exc).__name__
