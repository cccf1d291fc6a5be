"""The host beside the GPUs: memory, swap, load, CPUs and their pressure, the configured disks and
the RDMA ports.

A GPU job that dies of a full /var/lib/docker or a swapping host looks, from NVML alone, like
a GPU problem; these readings tell the two apart. Read every second on real nodes, so each read
is a handful of syscalls: two small /proc files and one statvfs per configured disk. Nothing
here raises: a file or disk that cannot be read costs its fields and a note in `errors`.
statvfs of a hung network mount blocks, so `read` belongs in a worker thread like the rest.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

from gpumedic_bus.lateness import read_pressure

from node_sampler.nics import SYS_CLASS_INFINIBAND, NicReader
from node_sampler.readings import HostReading, RawDisk

DOCKER_ROOT = "/var/lib/docker"
"""Docker's data directory: images, container layers and logs fill it, not always `/`."""


def watched_disks(
    given: Sequence[str] | None, *, docker_root: str = DOCKER_ROOT, device_of: Callable[[str], int] = lambda p: os.stat(p).st_dev
) -> list[str]:
    """The file systems each sample reports: those the operator named, else `/` and Docker's data
    directory where Docker is there on a file system of its own (on `/` it is `/`'s figure)."""
    if given is not None:
        return list(given)
    try:
        own = device_of(docker_root) != device_of("/")
    except OSError:  # no Docker here
        own = False
    return ["/", docker_root] if own else ["/"]

MEMINFO_KEYS = ("MemTotal", "MemAvailable", "SwapTotal", "SwapFree")
"""The /proc/meminfo fields read, in KiB."""


def parse_meminfo(text: str, errors: list[str] | None = None) -> dict[str, int]:
    """The `MEMINFO_KEYS` found in /proc/meminfo text ("MemTotal:  2113431552 kB" lines).

    A line that is not "Name: number [kB]" is skipped with a note; a missing field is simply
    absent from the result.
    """
    found: dict[str, int] = {}
    for line in text.splitlines():
        if not line:
            continue
        key, sep, rest = line.partition(":")
        fields = rest.split()
        if not sep or not fields or not fields[0].isdigit():
            _note(errors, f"meminfo: malformed line {line[:80]!r} skipped")
            continue
        if key in MEMINFO_KEYS:
            found[key] = int(fields[0])
    return found


def parse_loadavg(text: str) -> tuple[float, float, float] | None:
    """The 1, 5 and 15 minute load averages from /proc/loadavg, or None if it is not one."""
    fields = text.split()
    if len(fields) < 3:
        return None
    try:
        one, five, fifteen = (float(f) for f in fields[:3])
    except ValueError:
        return None
    if not all(v >= 0 for v in (one, five, fifteen)):  # also rejects nan
        return None
    return one, five, fifteen


def cpu_count() -> int | None:
    """The node's CPUs (all of them: load averages are host-wide), or those this process may use."""
    count = os.cpu_count()
    if count:
        return count
    try:
        return len(os.sched_getaffinity(0)) or None
    except (AttributeError, OSError):
        return None


class HostReader:
    """`HostReader("/proc", ["/", "/var/lib/docker"]).read()`: one `HostReading` of the host now."""

    def __init__(
        self,
        proc_root: str | os.PathLike[str] = "/proc",
        disk_paths: Sequence[str] = (),
        *,
        statvfs: Callable[[str], Any] = os.statvfs,
        ib_root: str | os.PathLike[str] = SYS_CLASS_INFINIBAND,
    ) -> None:
        root = os.fspath(proc_root).rstrip("/") or "/"
        self._meminfo = f"{root}/meminfo"
        self._loadavg = f"{root}/loadavg"
        self._pressure = f"{root}/pressure/cpu"
        self.disk_paths = tuple(os.fspath(p) for p in disk_paths)
        self._statvfs = statvfs
        self.nics = NicReader(ib_root)

    def read(self) -> HostReading:
        errors: list[str] = []
        memory: dict[str, int] = {}
        text = self._read(self._meminfo, errors)
        if text is not None:
            memory = parse_meminfo(text, errors)
            missing = [k for k in MEMINFO_KEYS if k not in memory]
            if missing:
                errors.append(f"meminfo: no {', '.join(missing)}")
        load = None
        text = self._read(self._loadavg, errors)
        if text is not None:
            load = parse_loadavg(text)
            if load is None:
                errors.append(f"loadavg: malformed {text.strip()[:80]!r}")
        nics = self.nics.read()
        errors.extend(nics.errors)
        return HostReading(
            memory_total_kib=memory.get("MemTotal"),
            memory_available_kib=memory.get("MemAvailable"),
            swap_total_kib=memory.get("SwapTotal"),
            swap_free_kib=memory.get("SwapFree"),
            load=load,
            cpus=cpu_count(),
            cpu_pressure=read_pressure(self._pressure),
            disks=tuple(d for d in (self._disk(p, errors) for p in self.disk_paths) if d is not None),
            errors=tuple(errors),
            ib_ports=nics.ports,
        )

    def _disk(self, path: str, errors: list[str]) -> RawDisk | None:
        try:
            st = self._statvfs(path)
        except OSError as exc:
            errors.append(f"disk {path}: {type(exc).__name__} ({exc.strerror or exc})")
            return None
        frsize = st.f_frsize or st.f_bsize
        return RawDisk(
            path=path,
            total_bytes=st.f_blocks * frsize,
            used_bytes=max(0, st.f_blocks - st.f_bfree) * frsize,
            available_bytes=st.f_bavail * frsize,
        )

    @staticmethod
    def _read(path: str, errors: list[str]) -> str | None:
        try:
            with open(path, "rb", buffering=0) as f:
                return f.read().decode("ascii", errors="replace")
        except OSError as exc:
            errors.append(f"{path}: unreadable ({type(exc).__name__})")
            return None


def _note(errors: list[str] | None, text: str) -> None:
    if errors is not None:
        errors.append(text)
