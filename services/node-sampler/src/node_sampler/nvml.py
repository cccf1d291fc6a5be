"""Reads every GPU through a pynvml-like module: the real `pynvml` or the simulated node's fake.

Every NVML call is guarded on its own. A query the driver does not support on this GPU (or lets
this process not read) is a property of the GPU, not a fault: its field stays None, said once in
the log and never again asked until NVML is initialised anew. Any other failure of one query
costs that one field and a note in the sample ("gpu 1 temperature: NVMLError_Unknown"), never
the sample. A GPU that has fallen off the bus (NVMLError_GpuIsLost) is marked `lost`, noted
once ("gpu 1: NVMLError_GpuIsLost") and asked nothing more in that read; the other GPUs are read
as usual. A partial sample is exactly what the detectors need to see a failing GPU.

The calls block (they go into the driver), so the sampler runs `read` in a worker thread. XID
errors are not polled: `XidWatcher` waits on NVML's event set in a thread of its own.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from node_sampler.logic import NvmlReading, RawGpu, RawProcess, XidReading

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML's enum values (nvml.h); stable ABI, so a pynvml-like module need not export them
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_FEATURE_ENABLED = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
"""pynvml.nvmlEventTypeXidCriticalError"""

LOST = "NVMLError_GpuIsLost"
ABSENT = {"NVMLError_NotSupported": logging.DEBUG, "NVMLError_NoPermission": logging.INFO}
"""Failures that mean "this GPU has no such reading here", with the level they are logged at once."""
SESSION_GONE = {"NVMLError_Uninitialized", "NVMLError_DriverNotLoaded", "NVMLError_LibRmVersionMismatch"}
"""Failures of the device count after which NVML is initialised again at the next read."""


class _GpuLost(Exception):
    """A call about the GPU being read raised NVMLError_GpuIsLost."""


@dataclass
class _Known:
    """What never changes about a GPU while NVML stays initialised."""

    handle: Any
    uuid: str | None = None
    name: str | None = None


class NvmlReader:
    """One node's NVML session over a pynvml-like module object.

    Handles, UUIDs and names are kept per index after their first successful read, and queries
    a GPU does not support are not asked again; both are forgotten when NVML is initialised
    anew. With 8 GPUs a read is one device count plus 11 calls per GPU.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        self._initialized = False
        self._unavailable: str | None = None
        self._known: dict[int, _Known] = {}
        self._absent: set[tuple[int, str]] = set()
        # a read in a worker thread and shutdown at service stop must not interleave in the driver
        self._lock = threading.Lock()

    @property
    def nvml(self) -> Any:
        """The pynvml-like module this reader calls."""
        return self._nvml

    def read(self) -> NvmlReading:
        """All GPUs now. Blocking."""
        with self._lock:
            if not self._ensure_init():
                return NvmlReading(errors=(f"NVML unavailable: {self._unavailable}",), unavailable=self._unavailable)
            errors: list[str] = []
            try:
                count = self._nvml.nvmlDeviceGetCount()
            except Exception as exc:
                errors.append(f"device count: {_name(exc)}")
                if _name(exc) in SESSION_GONE:
                    # the driver went away under us: start over at the next read
                    self._end_session()
                    return NvmlReading(errors=tuple(errors), unavailable=f"the driver went away ({_name(exc)})")
                return NvmlReading(errors=tuple(errors))
            gpus = tuple(self._read_gpu(i, errors) for i in range(count or 0))
            return NvmlReading(gpus=gpus, errors=tuple(errors))

    def shutdown(self) -> None:
        with self._lock:
            if self._initialized:
                self._end_session()

    def _end_session(self) -> None:
        self._initialized = False
        self._known.clear()
        self._absent.clear()
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
        self._known.clear()
        self._absent.clear()
        self._initialized = True
        return True

    def _read_gpu(self, index: int, errors: list[str]) -> RawGpu:
        nvml = self._nvml
        fields: dict[str, Any] = {}
        known = self._known.get(index)
        try:
            if known is None:
                handle = self._call(errors, index, "handle", nvml.nvmlDeviceGetHandleByIndex, index)
                if handle is None:
                    return RawGpu(index=index)
                known = self._known[index] = _Known(handle)
            handle = known.handle
            if known.uuid is None:
                known.uuid = _text(self._call(errors, index, "uuid", nvml.nvmlDeviceGetUUID, handle))
            if known.name is None:
                known.name = _text(self._call(errors, index, "name", nvml.nvmlDeviceGetName, handle))
            fields.update(uuid=known.uuid, name=known.name)

            rates = self._call(errors, index, "utilization", nvml.nvmlDeviceGetUtilizationRates, handle)
            fields.update(
                utilization_gpu_pct=_int_attr(rates, "gpu"), utilization_memory_pct=_int_attr(rates, "memory")
            )
            memory = self._call(errors, index, "memory", nvml.nvmlDeviceGetMemoryInfo, handle)
            fields.update(memory_used_bytes=_int_attr(memory, "used"), memory_total_bytes=_int_attr(memory, "total"))
            procs = self._call(errors, index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs is not None:
                fields["processes"] = tuple(_raw_process(p) for p in procs if _int_attr(p, "pid"))
            fields["temperature_c"] = _int(
                self._call(errors, index, "temperature", nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU)
            )
            fields["power_mw"] = _int(self._call(errors, index, "power", nvml.nvmlDeviceGetPowerUsage, handle))
            fields["power_limit_mw"] = _int(
                self._call(errors, index, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            )
            fields["ecc_uncorrected_volatile"] = _int(
                self._call(
                    errors,
                    index,
                    "ecc uncorrected",
                    nvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    NVML_MEMORY_ERROR_TYPE_UNCORRECTED,
                    NVML_VOLATILE_ECC,
                )
            )
            fields["ecc_corrected_volatile"] = _int(
                self._call(
                    errors,
                    index,
                    "ecc corrected",
                    nvml.nvmlDeviceGetTotalEccErrors,
                    handle,
                    NVML_MEMORY_ERROR_TYPE_CORRECTED,
                    NVML_VOLATILE_ECC,
                )
            )
            pending = _int(
                self._call(errors, index, "retired pages", nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            )
            fields["retired_pages_pending"] = None if pending is None else pending == NVML_FEATURE_ENABLED
            rows = self._call(errors, index, "remapped rows", nvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                try:
                    _, _, rows_pending, rows_failed = rows
                    fields.update(remapped_rows_pending=bool(rows_pending), remapped_rows_failed=bool(rows_failed))
                except (TypeError, ValueError):
                    errors.append(f"gpu {index} remapped rows: unexpected {type(rows).__name__}")
            fields["compute_mode"] = _int(
                self._call(errors, index, "compute mode", nvml.nvmlDeviceGetComputeMode, handle)
            )
        except _GpuLost:
            errors.append(f"gpu {index}: {LOST}")
            return RawGpu(index=index, lost=True, **fields)
        return RawGpu(index=index, **fields)

    def _call(self, errors: list[str], gpu: int, what: str, fn: Callable[..., T], *args: Any) -> T | None:
        """fn(*args), guarded: None and a note on failure; raises _GpuLost for a lost GPU."""
        if (gpu, what) in self._absent:
            return None
        try:
            return fn(*args)
        except Exception as exc:
            # NVMLError subclasses name the fault (NVMLError_GpuIsLost); anything else from a
            # binding is guarded the same way, since one field must never abort the sample
            reason = _name(exc)
            if reason == LOST:
                raise _GpuLost from None
            level = ABSENT.get(reason)
            if level is not None:
                self._absent.add((gpu, what))
                log.log(level, "gpu %d %s: %s; left out of samples from now on", gpu, what, reason)
                return None
            errors.append(f"gpu {gpu} {what}: {reason}")
            return None


class XidWatcher:
    """Waits for XID errors on NVML's event set and hands each one to `on_xid`.

    It runs in a daemon thread of its own (`start`, `stop`), not in an executor: a simulated
    fleet runs hundreds of these in one process. `on_xid` is called FROM THAT THREAD; a caller
    on asyncio marshals the reading itself, e.g.
    ``XidWatcher(nvml, lambda r: loop.call_soon_threadsafe(queue.put_nowait, r))``.

    `nvml` is a pynvml-like module or an `NvmlReader` (its module is used). The watcher
    initialises NVML itself (init is reference-counted in the binding, so the reader's session is
    untouched) and registers XidCriticalError events on every GPU; a GPU that refuses is logged
    once and skipped. While NVML cannot be initialised it says so once and tries again every
    `retry_init_s`. A failing wait is logged once per kind of failure and retried after
    `backoff_s`. `stop()` returns within about `wait_ms`, after the thread has freed the event
    set and shut its NVML session down.
    """

    def __init__(
        self,
        nvml: Any,
        on_xid: Callable[[XidReading], None],
        *,
        wait_ms: int = 500,
        retry_init_s: float = 30.0,
        backoff_s: float = 1.0,
    ) -> None:
        if wait_ms <= 0:
            raise ValueError("wait_ms must be positive")
        self._nvml = nvml.nvml if isinstance(nvml, NvmlReader) else nvml
        self._on_xid = on_xid
        self._wait_ms = int(wait_ms)
        self._retry_init_s = retry_init_s
        self._backoff_s = backoff_s
        self._stopping = threading.Event()
        self._thread: threading.Thread | None = None
        # owned by the watcher thread
        self._initialized = False
        self._set: Any = None
        self._devices: list[tuple[Any, int, str | None]] = []
        self._said: set[str] = set()

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        if self.running:
            return
        self._stopping.clear()
        self._thread = threading.Thread(target=self._run, name="nvml-xid-watcher", daemon=True)
        self._thread.start()

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread and wait for it; it frees the event set and shuts NVML down."""
        thread = self._thread
        if thread is None:
            return
        self._stopping.set()
        thread.join(self._wait_ms / 1000 + 2.0 if timeout_s is None else timeout_s)
        if thread.is_alive():
            log.warning("XID watcher still blocked in NVML after stop; left behind as a daemon thread")
        else:
            self._thread = None

    # --- the watcher thread -----------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping.is_set():
                if self._set is None and not self._open():
                    self._stopping.wait(self._retry_init_s)
                    continue
                self._wait_once()
        except Exception:  # a bug here must not end XID watching silently
            log.exception("XID watcher failed")
        finally:
            self._close()

    def _open(self) -> bool:
        nvml = self._nvml
        try:
            nvml.nvmlInit()
        except Exception as exc:
            self._once("init", logging.WARNING, "XID events off until NVML loads: %s", _name(exc))
            return False
        self._initialized = True
        try:
            event_set = nvml.nvmlEventSetCreate()
        except Exception as exc:
            self._once("create " + _name(exc), logging.WARNING, "XID events off: nvmlEventSetCreate: %s", _name(exc))
            self._close()
            return False
        self._set = event_set
        try:
            count = nvml.nvmlDeviceGetCount()
        except Exception as exc:
            self._once("count " + _name(exc), logging.WARNING, "XID events off: device count: %s", _name(exc))
            self._close()
            return False
        devices = []
        for index in range(count):
            try:
                handle = nvml.nvmlDeviceGetHandleByIndex(index)
                nvml.nvmlDeviceRegisterEvents(handle, NVML_EVENT_TYPE_XID_CRITICAL_ERROR, event_set)
            except Exception as exc:
                level = logging.INFO if _name(exc) in ABSENT else logging.WARNING
                self._once(f"register {index}", level, "gpu %d: no XID events (%s)", index, _name(exc))
                continue
            try:
                uuid = _text(nvml.nvmlDeviceGetUUID(handle))
            except Exception:
                uuid = None
            devices.append((handle, index, uuid))
        self._devices = devices
        # a failure that comes back after a recovery is worth saying again
        self._said = {key for key in self._said if key.startswith("register")}
        log.info("XID events on for GPUs %s", [index for _, index, _ in devices])
        return True

    def _wait_once(self) -> None:
        try:
            data = self._nvml.nvmlEventSetWait_v2(self._set, self._wait_ms)
        except Exception as exc:
            reason = _name(exc)
            if reason == "NVMLError_Timeout":
                return
            self._once("wait " + reason, logging.WARNING, "XID event wait failed (%s); retrying", reason)
            if reason == "NVMLError_Uninitialized":
                self._close()  # someone shut NVML down under us: open again
            self._stopping.wait(self._backoff_s)
            return
        event_type = _int(getattr(data, "eventType", NVML_EVENT_TYPE_XID_CRITICAL_ERROR))
        if event_type is not None and not event_type & NVML_EVENT_TYPE_XID_CRITICAL_ERROR:
            return
        xid = _int(getattr(data, "eventData", None))
        if xid is None:
            return
        index, uuid = self._identify(getattr(data, "device", None))
        try:
            self._on_xid(XidReading(xid=xid, gpu_index=index, gpu_uuid=uuid))
        except Exception:
            log.exception("on_xid failed for XID %d on gpu %s", xid, index)

    def _identify(self, device: Any) -> tuple[int | None, str | None]:
        for handle, index, uuid in self._devices:
            if _same_handle(handle, device):
                return index, uuid
        try:
            index = int(self._nvml.nvmlDeviceGetIndex(device))
        except Exception:
            return None, None
        return index, next((uuid for _, i, uuid in self._devices if i == index), None)

    def _close(self) -> None:
        nvml = self._nvml
        if self._set is not None:
            try:
                nvml.nvmlEventSetFree(self._set)
            except Exception as exc:
                log.debug("nvmlEventSetFree failed: %s", _name(exc))
            self._set = None
            self._devices = []
        if self._initialized:
            self._initialized = False
            try:
                nvml.nvmlShutdown()
            except Exception as exc:
                log.debug("nvmlShutdown failed: %s", _name(exc))

    def _once(self, key: str, level: int, message: str, *args: Any) -> None:
        if key not in self._said:
            self._said.add(key)
            log.log(level, message, *args)


def _same_handle(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, ctypes._Pointer) and isinstance(b, ctypes._Pointer):
        # pynvml hands out a new pointer object per call: compare what they point at
        return ctypes.cast(a, ctypes.c_void_p).value == ctypes.cast(b, ctypes.c_void_p).value
    try:
        return bool(a == b)
    except Exception:
        return False


def _raw_process(p: Any) -> RawProcess:
    return RawProcess(pid=int(p.pid), used_memory_bytes=_int_attr(p, "usedGpuMemory"))


def _text(value: Any) -> str | None:
    if value is None:
        return None
    # older bindings return bytes
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="replace")
    return str(value)


def _int(value: Any) -> int | None:
    if value is None or isinstance(value, bool):
        return None
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


def _int_attr(obj: Any, attr: str) -> int | None:
    return _int(getattr(obj, attr, None))


def _name(exc: BaseException) -> str:
    return type(exc).__name__
