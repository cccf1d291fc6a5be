"""The fake libnvidia-ml.so.1 (fake_nvml.c): building it, and driving it from a test.

`build(directory)` compiles it with gcc; `FakeNvmlLib(path)` loads it and wraps its fake_*
control functions. Install it as `pynvml.nvmlLib` (the `fake_nvml` fixture does) and the real
pynvml wrappers call into it exactly as they call into NVIDIA's library.
"""

from __future__ import annotations

import ctypes
import shutil
import subprocess
from pathlib import Path

import pynvml

SOURCE = Path(__file__).with_name("fake_nvml.c")
LIBRARY_NAME = "libnvidia-ml.so.1"
GIB = 1024**3
NOT_AVAILABLE = 2**64 - 1
"""usedGpuMemory the driver could not tell; pynvml turns it into None."""


class BuildError(RuntimeError):
    pass


def build(directory: Path) -> Path:
    """Compile fake_nvml.c into `directory`/libnvidia-ml.so.1. Raises BuildError without gcc."""
    gcc = shutil.which("gcc")
    if gcc is None:
        raise BuildError(
            "gcc not found: the NVML library tests build a fake libnvidia-ml.so.1 with it (apt-get install gcc)"
        )
    target = directory / LIBRARY_NAME
    command = [gcc, "-shared", "-fPIC", "-O2", "-o", str(target), str(SOURCE), "-lpthread"]
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise BuildError(f"{' '.join(command)} failed:\n{result.stderr}")
    return target


class FakeNvmlLib:
    """The loaded fake and its controls. GPU indices are ints; `gpu=-1` means a call about no device."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.cdll = ctypes.CDLL(str(path))
        c = self.cdll
        u, ull, i, s = ctypes.c_uint, ctypes.c_ulonglong, ctypes.c_int, ctypes.c_char_p
        c.fake_set_gpu.argtypes = [u, u, u, ull, ull, u, u, u]
        c.fake_set_health.argtypes = [u, ull, ull, i, u, u, u, u, i]
        c.fake_set_ids.argtypes = [u, s, s]
        c.fake_set_clocks.argtypes = [u, u, u, u, u, ull]
        c.fake_set_thermal.argtypes = [u, i, u, u, u, u]
        c.fake_set_pcie.argtypes = [u, u, u, u, u, u]
        c.fake_set_ecc_aggregate.argtypes = [u, ull, ull]
        c.fake_set_nvlink.argtypes = [u, u, i, ull, ull, ull, ull]
        c.fake_add_process.argtypes = [u, u, ull]
        c.fake_fail.argtypes = [i, s, i]
        c.fake_push_xid.argtypes = [u, ull]
        c.fake_calls.argtypes = [i, s]
        c.fake_calls.restype = u

    def reset(self) -> None:
        self.cdll.fake_reset()

    def set_gpu_count(self, n: int) -> None:
        """n GPUs "GPU-fake-<i>", idle, 80 GiB total, 35 C, 70 W of a 700 W limit, no errors."""
        self.cdll.fake_set_gpu_count(n)

    def set_gpu(
        self,
        index: int,
        *,
        util: int = 0,
        mem_util: int = 0,
        used_bytes: int = 0,
        total_bytes: int = 80 * GIB,
        temp: int = 35,
        power_mw: int = 70_000,
        power_limit_mw: int = 700_000,
    ) -> None:
        self.cdll.fake_set_gpu(index, util, mem_util, used_bytes, total_bytes, temp, power_mw, power_limit_mw)

    def set_health(
        self,
        index: int,
        *,
        ecc_uncorrected: int = 0,
        ecc_corrected: int = 0,
        retired_pending: bool = False,
        remapped_corrected: int = 0,
        remapped_uncorrected: int = 0,
        remap_pending: bool = False,
        remap_failed: bool = False,
        compute_mode: int = 0,
    ) -> None:
        self.cdll.fake_set_health(
            index,
            ecc_uncorrected,
            ecc_corrected,
            int(retired_pending),
            remapped_corrected,
            remapped_uncorrected,
            int(remap_pending),
            int(remap_failed),
            compute_mode,
        )

    def set_clocks(
        self, index: int, *, sm: int, sm_max: int = 1980, memory: int = 3201, memory_max: int = 3201, reasons: int = 0
    ) -> None:
        """Clocks in MHz; `reasons` the clocks event reasons bit set."""
        self.cdll.fake_set_clocks(index, sm, sm_max, memory, memory_max, reasons)

    def set_thermal(
        self,
        index: int,
        *,
        memory_temp: int | None = 30,
        shutdown: int | None = 95,
        slowdown: int | None = 89,
        memory_max: int | None = 95,
        gpu_max: int | None = 87,
    ) -> None:
        """Memory temperature and thresholds, Celsius; None: the GPU answers NOT_SUPPORTED."""
        self.cdll.fake_set_thermal(
            index, -1 if memory_temp is None else memory_temp, shutdown or 0, slowdown or 0, memory_max or 0, gpu_max or 0
        )

    def set_pcie(self, index: int, *, gen: int = 5, gen_max: int = 5, width: int = 16, width_max: int = 16, replay: int = 0) -> None:
        self.cdll.fake_set_pcie(index, gen, gen_max, width, width_max, replay)

    def set_ecc_aggregate(self, index: int, *, corrected: int = 0, uncorrected: int = 0) -> None:
        self.cdll.fake_set_ecc_aggregate(index, corrected, uncorrected)

    def set_nvlink(
        self, index: int, link: int, *, up: bool = True, replay: int = 0, recovery: int = 0, crc_flit: int = 0, crc_data: int = 0
    ) -> None:
        """Link `link` of GPU `index` exists from now on, with these counters (and every link below it)."""
        self.cdll.fake_set_nvlink(index, link, int(up), replay, recovery, crc_flit, crc_data)

    def set_ids(self, index: int, uuid: str, name: str) -> None:
        self.cdll.fake_set_ids(index, uuid.encode(), name.encode())

    def add_process(self, index: int, pid: int, used_bytes: int | None) -> None:
        self.cdll.fake_add_process(index, pid, NOT_AVAILABLE if used_bytes is None else used_bytes)

    def fail(self, gpu: int, function: str, error: int | type[pynvml.NVMLError]) -> None:
        """The C function `function` about `gpu` returns `error` (a code or an NVMLError class) until healed with 0."""
        code = error if isinstance(error, int) else _code(error)
        self.cdll.fake_fail(gpu, function.encode(), code)

    def lose_gpu(self, index: int) -> None:
        """Every later call about GPU `index` returns NVML_ERROR_GPU_IS_LOST."""
        self.cdll.fake_lose_gpu(index)

    def set_init_error(self, code: int) -> None:
        """nvmlInitWithFlags returns `code` (0: succeeds)."""
        self.cdll.fake_set_init_error(code)

    def push_xid(self, index: int, xid: int) -> int:
        """An XID on GPU `index`: queued on every event set registered for it; how many were."""
        return self.cdll.fake_push_xid(index, xid)

    def registered(self, index: int) -> bool:
        return bool(self.cdll.fake_registered(index))

    def live_sets(self) -> int:
        return self.cdll.fake_live_sets()

    def init_count(self) -> int:
        """nvmlInit calls not yet matched by nvmlShutdown."""
        return self.cdll.fake_init_count()

    def calls(self, gpu: int, function: str | None = None) -> int:
        """How often `function` (None: any function) was called about `gpu` (-1: about no device)."""
        return self.cdll.fake_calls(gpu, None if function is None else function.encode())


def _code(error: type[pynvml.NVMLError]) -> int:
    for code, cls in pynvml.NVMLError._valClassMapping.items():
        if cls is error:
            return code
    raise ValueError(f"{error} is no NVMLError subclass")
