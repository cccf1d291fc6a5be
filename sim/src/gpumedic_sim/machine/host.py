"""The simulated node's host beside its GPUs: memory, swap, load, CPUs and disks.

It stands where /proc/meminfo, /proc/loadavg, statvfs and /sys/class/infiniband stand for the
node-sampler's `HostReader`, with the same `read()`. Plain attributes, so a scenario (or a test) sets what it
needs; `fill_disk` is the one fault it scripts. Hundreds of these live in one process: a read
is a few attribute lookups.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from gpumedic_events import IbPort
from node_sampler.readings import HostReading, RawDisk

GIB_KIB = 1024 * 1024
"""KiB in a GiB."""
TIB = 1024**4
DOCKER_ROOT = "/var/lib/docker"
DOCKER_KINDS = ("Images", "Containers", "Local Volumes", "Build Cache")
"""What `docker system df` lists, in its order."""
DOCKER_JUNK_SHARE = 0.3
"""How much of a /var/lib/docker that filled up is what a prune frees (old images, build cache)."""


def _default_disks() -> dict[str, tuple[int, int]]:
    """A GPU node's usual mounts: path -> (total bytes, used bytes)."""
    return {
        "/": (960 * 1024**3, 212 * 1024**3),
        "/var/lib/docker": (3 * TIB + TIB // 2, 1 * TIB + 300 * 1024**3),
        "/data": (28 * TIB, 11 * TIB),
    }


@dataclass
class SimIbPort:
    """One InfiniBand port of the node's fabric: up at 400 Gb/s (NDR) unless a fault says otherwise.
    Its faults are set as times (monotonic), so each read shows the port as it is then."""

    device: str
    down_at: float | None = None
    """From then on the port is DOWN (Polling): its cable pulled."""
    never_up: bool = False
    """A port nobody cabled: DOWN (Disabled) from the start."""
    flaps_from: float | None = None
    flap_every_s: float = 20.0
    """From `flaps_from`, the link goes down and back every `flap_every_s` (link_downed counts it)."""
    link_downed: int = 0
    symbol_error: int = 0

    def read(self, now: float) -> IbPort:
        down = self.never_up or (self.down_at is not None and now >= self.down_at)
        flaps = int((now - self.flaps_from) // self.flap_every_s) if self.flaps_from is not None and now >= self.flaps_from else 0
        return IbPort(
            device=self.device, port=1, state="DOWN" if down else "ACTIVE",
            phys_state=("Disabled" if self.never_up else "Polling") if down else "LinkUp", rate_gbps=None if down else 400.0,
            link_layer="InfiniBand", link_downed=self.link_downed + flaps, link_error_recovery=0, symbol_error=self.symbol_error + 40 * flaps,
            port_rcv_errors=0, local_link_integrity_errors=0, excessive_buffer_overrun_errors=0, port_xmit_discards=0,
        )


class SimHost:
    """`SimHost()`: a big 8-GPU node (2 TiB RAM, 224 CPUs, /, /var/lib/docker and /data)."""

    def __init__(
        self,
        *,
        memory_total_kib: int = 2048 * GIB_KIB,
        memory_available_kib: int = 1536 * GIB_KIB,
        swap_total_kib: int = 0,
        swap_free_kib: int = 0,
        load: tuple[float, float, float] = (38.4, 36.9, 35.2),
        cpus: int = 224,
        disks: dict[str, tuple[int, int]] | None = None,
    ) -> None:
        self.memory_total_kib = memory_total_kib
        self.memory_available_kib = memory_available_kib
        self.swap_total_kib = swap_total_kib
        self.swap_free_kib = swap_free_kib
        self.load = load
        self.cpus = cpus
        self.disks: dict[str, tuple[int, int]] = _default_disks() if disks is None else dict(disks)
        """Mount path -> (total bytes, used bytes)."""
        self.docker_reclaimable: dict[str, int] = dict.fromkeys(DOCKER_KINDS, 0)
        """What a prune of each kind would free under /var/lib/docker, in bytes."""
        self.ib_ports: dict[str, SimIbPort] = {}
        """Its InfiniBand fabric: none until a scenario gives it one (`fabric`)."""

    def read(self) -> HostReading:
        """What `HostReader.read()` would return on such a node now."""
        return HostReading(
            memory_total_kib=self.memory_total_kib,
            memory_available_kib=self.memory_available_kib,
            swap_total_kib=self.swap_total_kib,
            swap_free_kib=self.swap_free_kib,
            load=self.load,
            cpus=self.cpus,
            disks=tuple(
                RawDisk(path=path, total_bytes=total, used_bytes=used, available_bytes=max(0, total - used))
                for path, (total, used) in self.disks.items()
            ),
            ib_ports=tuple(p.read(time.monotonic()) for p in self.ib_ports.values()),
        )

    def fabric(self, ports: int = 4) -> dict[str, SimIbPort]:
        """The node's InfiniBand ports (mlx5_0 ...), given it now if it had none: all up."""
        if not self.ib_ports:
            self.ib_ports = {f"mlx5_{i}": SimIbPort(f"mlx5_{i}") for i in range(ports)}
        return self.ib_ports

    def fill_disk(self, path: str, pct: float = 100.0) -> None:
        """The file system at `path` is `pct` % full from now on."""
        if path not in self.disks:
            raise ValueError(f"no disk at {path}: the node has {', '.join(self.disks)}")
        if not 0.0 <= pct <= 100.0:
            raise ValueError("pct is 0 to 100")
        total, used = self.disks[path]
        filled = int(total * pct / 100.0)
        self.disks[path] = (total, filled)
        if path == DOCKER_ROOT and filled > used:
            # What fills Docker's disk is mostly what it keeps around: images and build cache.
            junk = min(filled - used, int(total * DOCKER_JUNK_SHARE))
            self.docker_reclaimable["Images"] += junk * 2 // 3
            self.docker_reclaimable["Build Cache"] += junk - junk * 2 // 3

    def docker_prune(self, kind: str) -> int:
        """Free what a prune of `kind` (one of DOCKER_KINDS) frees; the bytes freed."""
        freed = self.docker_reclaimable[kind]
        self.docker_reclaimable[kind] = 0
        if DOCKER_ROOT in self.disks:
            total, used = self.disks[DOCKER_ROOT]
            self.disks[DOCKER_ROOT] = (total, max(0, used - freed))
        return freed
