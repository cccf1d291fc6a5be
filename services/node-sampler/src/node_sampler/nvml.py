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

What a sample reads, and what only `read(health=True)` reads, follows what each costs on a real
GPU (measured on an H200 with driver 580, docs/real-nvml.md): the per-sample calls take 1-30 µs
each; the maximum clocks (~1.3 ms each) and temperature thresholds (~0.2 ms) never change and are
read once per NVML session; the PCIe replay counter (~0.1 ms) and the NVLink counters go with
the slower health read; PCIe throughput (~20 ms) and energy (~2.5 ms) are not read at all.
"""

from __future__ import annotations

import ctypes
import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from node_sampler.immediate import XidReading
from node_sampler.readings import NvmlReading, RawGpu, RawHealth, RawNvLink, RawProcess

log = logging.getLogger(__name__)

T = TypeVar("T")

# NVML's enum values (nvml.h); stable ABI, so a pynvml-like module need not export them
NVML_TEMPERATURE_GPU = 0
NVML_MEMORY_ERROR_TYPE_CORRECTED = 0
NVML_MEMORY_ERROR_TYPE_UNCORRECTED = 1
NVML_VOLATILE_ECC = 0
NVML_AGGREGATE_ECC = 1
NVML_FEATURE_ENABLED = 1
NVML_EVENT_TYPE_XID_CRITICAL_ERROR = 0x8
"""pynvml.nvmlEventTypeXidCriticalError"""
NVML_MEMORY_V2 = 0x02000028
"""nvmlMemory_v2: its `used` leaves out the driver's reserved memory, as nvidia-smi's Used does."""
NVML_CLOCK_SM = 1
NVML_CLOCK_MEM = 2
NVML_TEMPERATURE_THRESHOLD_SHUTDOWN = 0
NVML_TEMPERATURE_THRESHOLD_SLOWDOWN = 1
NVML_TEMPERATURE_THRESHOLD_MEM_MAX = 2
NVML_TEMPERATURE_THRESHOLD_GPU_MAX = 3
NVML_FI_DEV_MEMORY_TEMP = 82
NVML_PAGE_RETIREMENT_CAUSES = (0, 1)
"""Multiple single-bit errors, a double-bit error."""
NVML_NVLINK_MAX_LINKS = 18
NVML_NVLINK_ERROR_DL_REPLAY = 0
NVML_NVLINK_ERROR_DL_RECOVERY = 1
NVML_NVLINK_ERROR_DL_CRC_FLIT = 2
NVML_NVLINK_ERROR_DL_CRC_DATA = 3
NVML_SUCCESS = 0
NVML_ERROR_NOT_SUPPORTED = 3

LOST = "NVMLError_GpuIsLost"
ABSENT = {
    "NVMLError_NotSupported": logging.DEBUG,
    "NVMLError_FunctionNotFound": logging.DEBUG,  # a driver older than the query
    "NVMLError_ArgumentVersionMismatch": logging.DEBUG,  # a driver older than the struct's version
    "NVMLError_NoPermission": logging.INFO,
}
"""Failures that mean "this GPU has no such reading here", with the level they are logged at once."""
NO_LINK = {"NVMLError_NotSupported", "NVMLError_InvalidArgument", "NVMLError_FunctionNotFound"}
"""What NVML answers for an NVLink index the GPU does not have."""
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
    fixed: dict[str, int] = field(default_factory=dict)
    """Maxima and thresholds read so far (a failed read is asked again at the next health read)."""
    nvlinks: int | None = None
    """How many NVLinks the GPU has; None until counted."""


FIXED = (
    ("sm_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (NVML_CLOCK_SM,)),
    ("memory_clock_max_mhz", "nvmlDeviceGetMaxClockInfo", (NVML_CLOCK_MEM,)),
    ("temperature_slowdown_c", "nvmlDeviceGetTemperatureThreshold", (NVML_TEMPERATURE_THRESHOLD_SLOWDOWN,)),
    ("temperature_shutdown_c", "nvmlDeviceGetTemperatureThreshold", (NVML_TEMPERATURE_THRESHOLD_SHUTDOWN,)),
    ("temperature_max_operating_c", "nvmlDeviceGetTemperatureThreshold", (NVML_TEMPERATURE_THRESHOLD_GPU_MAX,)),
    ("memory_temperature_max_c", "nvmlDeviceGetTemperatureThreshold", (NVML_TEMPERATURE_THRESHOLD_MEM_MAX,)),
    ("pcie_link_gen_max", "nvmlDeviceGetMaxPcieLinkGeneration", ()),
    ("pcie_link_width_max", "nvmlDeviceGetMaxPcieLinkWidth", ()),
)
"""GpuHealth's figures that do not change while NVML stays initialised: field, NVML call, arguments."""
VARYING = (
    ("memory_clock_mhz", "nvmlDeviceGetClockInfo", (NVML_CLOCK_MEM,)),
    ("pcie_link_gen", "nvmlDeviceGetCurrPcieLinkGeneration", ()),
    ("pcie_link_width", "nvmlDeviceGetCurrPcieLinkWidth", ()),
    ("pcie_replay_count", "nvmlDeviceGetPcieReplayCounter", ()),
    ("ecc_corrected_aggregate", "nvmlDeviceGetTotalEccErrors", (NVML_MEMORY_ERROR_TYPE_CORRECTED, NVML_AGGREGATE_ECC)),
    ("ecc_uncorrected_aggregate", "nvmlDeviceGetTotalEccErrors", (NVML_MEMORY_ERROR_TYPE_UNCORRECTED, NVML_AGGREGATE_ECC)),
    ("fan_speed_pct", "nvmlDeviceGetFanSpeed", ()),
)
"""GpuHealth's figures read anew at each health read."""

class NvmlReader:
    """One node's NVML session over a pynvml-like module object.

    Handles, UUIDs, names, maxima and thresholds are kept per index after their first successful
    read, and queries a GPU does not support are not asked again; all are forgotten when NVML is
    initialised anew. With 8 GPUs a read is one device count plus 14 calls per GPU; a health read
    adds about 10 per GPU, and 5 per NVLink.
    """

    def __init__(self, nvml: Any) -> None:
        self._nvml = nvml
        # the binding renamed "throttle" reasons to "clocks event" reasons (driver 535)
        self._reasons: Callable[[Any], int] | None = getattr(
            nvml, "nvmlDeviceGetCurrentClocksEventReasons", None
        ) or getattr(nvml, "nvmlDeviceGetCurrentClocksThrottleReasons", None)
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

    def read(self, health: bool = False) -> NvmlReading:
        """All GPUs now, with their slowly changing figures if `health`. Blocking."""
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
            gpus = tuple(self._read_gpu(i, errors, health) for i in range(count or 0))
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

    def _read_gpu(self, index: int, errors: list[str], health: bool) -> RawGpu:
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
            memory = self._memory(errors, index, handle)
            fields.update(memory_used_bytes=_int_attr(memory, "used"), memory_total_bytes=_int_attr(memory, "total"))
            procs = self._call(errors, index, "processes", nvml.nvmlDeviceGetComputeRunningProcesses, handle)
            if procs is not None:
                fields["processes"] = tuple(_raw_process(p) for p in procs if _int_attr(p, "pid"))
            fields["temperature_c"] = _int(
                self._call(errors, index, "temperature", nvml.nvmlDeviceGetTemperature, handle, NVML_TEMPERATURE_GPU)
            )
            fields["memory_temperature_c"] = self._field(errors, index, handle, "memory temperature", NVML_FI_DEV_MEMORY_TEMP)
            fields["power_mw"] = _int(self._call(errors, index, "power", nvml.nvmlDeviceGetPowerUsage, handle))
            fields["power_limit_mw"] = _int(
                self._call(errors, index, "power limit", nvml.nvmlDeviceGetEnforcedPowerLimit, handle)
            )
            fields["sm_clock_mhz"] = _int(
                self._call(errors, index, "SM clock", nvml.nvmlDeviceGetClockInfo, handle, NVML_CLOCK_SM)
            )
            if self._reasons is not None:
                fields["clock_event_reasons"] = _int(self._call(errors, index, "clock event reasons", self._reasons, handle))
            for what, error_type in (
                ("ecc uncorrected", NVML_MEMORY_ERROR_TYPE_UNCORRECTED),
                ("ecc corrected", NVML_MEMORY_ERROR_TYPE_CORRECTED),
            ):
                fields[what.replace(" ", "_") + "_volatile"] = _int(
                    self._call(errors, index, what, nvml.nvmlDeviceGetTotalEccErrors, handle, error_type, NVML_VOLATILE_ECC)
                )
            pending = _int(
                self._call(errors, index, "retired pages", nvml.nvmlDeviceGetRetiredPagesPendingStatus, handle)
            )
            fields["retired_pages_pending"] = None if pending is None else pending == NVML_FEATURE_ENABLED
            remapped: tuple[int | None, int | None] = (None, None)
            rows = self._call(errors, index, "remapped rows", nvml.nvmlDeviceGetRemappedRows, handle)
            if rows is not None:
                try:
                    rows_corrected, rows_uncorrected, rows_pending, rows_failed = rows
                    fields.update(remapped_rows_pending=bool(rows_pending), remapped_rows_failed=bool(rows_failed))
                    remapped = (_int(rows_corrected), _int(rows_uncorrected))
                except (TypeError, ValueError):
                    errors.append(f"gpu {index} remapped rows: unexpected {type(rows).__name__}")
            fields["compute_mode"] = _int(
                self._call(errors, index, "compute mode", nvml.nvmlDeviceGetComputeMode, handle)
            )
            if health:
                fields["health"] = self._health(errors, index, known, remapped)
        except _GpuLost:
            errors.append(f"gpu {index}: {LOST}")
            return RawGpu(index=index, lost=True, **fields)
        return RawGpu(index=index, **fields)

    def _memory(self, errors: list[str], index: int, handle: Any) -> Any:
        """nvmlMemory_v2 where the driver has it (Used as nvidia-smi shows it), else the first one."""
        if (index, "memory") not in self._absent:
            memory = self._call(errors, index, "memory", self._nvml.nvmlDeviceGetMemoryInfo, handle, NVML_MEMORY_V2)
            if memory is not None or (index, "memory") not in self._absent:
                return memory
        return self._call(errors, index, "memory v1", self._nvml.nvmlDeviceGetMemoryInfo, handle)

    def _field(self, errors: list[str], index: int, handle: Any, what: str, field_id: int) -> int | None:
        """One NVML field value (nvmlDeviceGetFieldValues); a field the GPU lacks counts as absent."""
        values = self._call(errors, index, what, self._nvml.nvmlDeviceGetFieldValues, handle, [field_id])
        if not values:
            return None
        value = values[0]
        status = _int(getattr(value, "nvmlReturn", None))
        if status == NVML_ERROR_NOT_SUPPORTED:
            self._absent.add((index, what))
            log.debug("gpu %d %s: not supported; left out of samples from now on", index, what)
            return None
        if status != NVML_SUCCESS:
            errors.append(f"gpu {index} {what}: NVML error {status}")
            return None
        return _field_number(value)

    def _health(
        self, errors: list[str], index: int, known: _Known, remapped: tuple[int | None, int | None]
    ) -> RawHealth:
        nvml, handle = self._nvml, known.handle
        for name, call, args in FIXED:
            if name not in known.fixed:
                value = _int(self._call(errors, index, name.replace("_", " "), getattr(nvml, call), handle, *args))
                if value is not None:
                    known.fixed[name] = value
        figures: dict[str, Any] = dict(known.fixed)
        for name, call, args in VARYING:
            figures[name] = _int(self._call(errors, index, name.replace("_", " "), getattr(nvml, call), handle, *args))
        pages = [
            self._call(errors, index, "retired pages list", nvml.nvmlDeviceGetRetiredPages, handle, cause)
            for cause in NVML_PAGE_RETIREMENT_CAUSES
        ]
        if all(p is not None for p in pages):
            figures["retired_pages"] = sum(len(p) for p in pages)
        figures["remapped_rows_corrected"], figures["remapped_rows_uncorrected"] = remapped
        links = self._nvlinks(errors, index, known)
        return RawHealth(**figures, nvlink_count=known.nvlinks, nvlinks=links)

    def _nvlinks(self, errors: list[str], index: int, known: _Known) -> tuple[RawNvLink, ...]:
        """Each NVLink's state and counters. The links are counted once: NVML numbers them from 0,
        and the first index it does not know ends them (a PCIe-only GPU has none)."""
        nvml, handle = self._nvml, known.handle
        links: list[RawNvLink] = []
        for link in range(NVML_NVLINK_MAX_LINKS if known.nvlinks is None else known.nvlinks):
            try:
                up = _int(nvml.nvmlDeviceGetNvLinkState(handle, link)) == NVML_FEATURE_ENABLED
            except Exception as exc:
                reason = _name(exc)
                if reason == LOST:
                    raise _GpuLost from None
                if known.nvlinks is None and reason in NO_LINK:
                    break
                errors.append(f"gpu {index} NVLink {link} state: {reason}")
                continue
            counters = [
                self._link_counter(errors, index, link, counter)
                for counter in (
                    NVML_NVLINK_ERROR_DL_REPLAY,
                    NVML_NVLINK_ERROR_DL_RECOVERY,
                    NVML_NVLINK_ERROR_DL_CRC_FLIT,
                    NVML_NVLINK_ERROR_DL_CRC_DATA,
                )
            ]
            flit, data = counters[2], counters[3]
            crc = None if flit is None and data is None else (flit or 0) + (data or 0)
            links.append(RawNvLink(link, up, replay_errors=counters[0], recovery_errors=counters[1], crc_errors=crc))
        if known.nvlinks is None:
            known.nvlinks = len(links)
            log.debug("gpu %d: %d NVLinks", index, known.nvlinks)
        return tuple(links)

    def _link_counter(self, errors: list[str], index: int, link: int, counter: int) -> int | None:
        call = self._nvml.nvmlDeviceGetNvLinkErrorCounter
        return _int(self._call(errors, index, f"NVLink {link} counter {counter}", call, self._known[index].handle, link, counter))

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


def _field_number(value: Any) -> int | None:
    """The number in an nvmlFieldValue_t, by its valueType (double, uint, ulong, ulonglong,
    slonglong, sint, ushort)."""
    kind = _int(getattr(value, "valueType", None))
    member = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}.get(kind or 0)
    number = getattr(getattr(value, "value", None), member or "", None)
    if isinstance(number, float):
        return None if number != number else round(number)
    return _int(number)


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
