"""The simulated node's kernel log: a FIFO standing in for /dev/kmsg.

The node-sampler's real `KernelLogWatcher` reads it as it reads /dev/kmsg on a real node, so an
OOM kill scripted here travels the whole path: kernel lines, parser, event. Records are written
in /dev/kmsg's format ("prio,seq,usec,-;message\\n") with the lines the kernel writes for the
event (mm/oom_kill.c, arch/x86/mm/fault.c). The writer end is non-blocking and never waits for
a reader: a full pipe (nobody reading) drops the record and counts it in `dropped`, so hundreds
of nodes in one process are never held up by their logs.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path

MAX_MESSAGE = 1000
"""Longer messages are cut, as the kernel cuts a printk line (about 1 KiB)."""

KERN_ERR, KERN_WARNING, KERN_INFO = 3, 4, 6


class SimKernelLog:
    """`SimKernelLog(dir / "kmsg")`: creates the FIFO; `oom_kill(...)` logs an OOM kill into it.

    `boot` is the node's boot on the monotonic clock (NodeState._boot): the records' timestamps
    are microseconds since then, as /dev/kmsg's are since the node booted.
    """

    def __init__(self, path: Path | str, *, boot: float | None = None) -> None:
        self.path = Path(path)
        try:
            os.mkfifo(self.path)
        except FileExistsError:
            if not stat.S_ISFIFO(os.stat(self.path).st_mode):
                raise
        # O_RDWR: a FIFO opened for writing alone would fail (ENXIO) while no reader is there
        self._fd: int | None = os.open(self.path, os.O_RDWR | os.O_NONBLOCK | os.O_CLOEXEC)
        self._boot = time.monotonic() if boot is None else boot
        self._lock = threading.Lock()
        self._seq = 0
        self._last_usec = 0
        self.written = 0
        self.dropped = 0
        """Records not written: the pipe was full (nobody reading), or the log was closed."""

    def write(self, message: str, prio: int = KERN_ERR, *, fields: Mapping[str, str] | None = None) -> bool:
        """Log `message` (each of its lines one record, as printk does); False if any was dropped.

        `fields` become the record's dictionary (" KEY=value" continuation lines), as a device
        driver's messages carry them ("SUBSYSTEM=pci", "DEVICE=+pci:0000:18:00.0").
        """
        dictionary = "".join(f" {k}={v}\n" for k, v in fields.items()) if fields else ""
        ok = True
        with self._lock:
            for line in message.split("\n"):
                usec = max(self._last_usec, int((time.monotonic() - self._boot) * 1_000_000))
                self._last_usec = usec
                record = f"{prio},{self._seq},{usec},-;{line[:MAX_MESSAGE]}\n{dictionary}"
                self._seq += 1
                ok = self._put(record) and ok
        return ok

    def write_record(self, record: str) -> bool:
        """Write one record already in /dev/kmsg format (a `NodeState.kernel_listeners` entry)."""
        with self._lock:
            return self._put(record if record.endswith("\n") else record + "\n")

    def oom_kill(
        self, pid: int, name: str, uid: int = 1000, container_id: str = "", anon_rss_kib: int = 31_457_280
    ) -> tuple[str, ...]:
        """The lines of the OOM killer ending `pid`: in its container's memory cgroup when it has
        one (the container hit its memory limit), else host-wide. Returns the messages written."""
        comm = name[:15]
        file_rss, shmem_rss = 187_316, 8_192
        total_vm = anon_rss_kib + file_rss + shmem_rss + 4_718_592
        pgtables = max(4, anon_rss_kib // 480)
        if container_id:
            scope = f"docker-{container_id}.scope"
            cgroup = f"/system.slice/{scope}"
            context = f"CONSTRAINT_MEMCG,nodemask=(null),cpuset={scope},mems_allowed=0-1,oom_memcg={cgroup}"
            headline = "Memory cgroup out of memory"
        else:
            cgroup = f"/user.slice/user-{uid}.slice/session-1.scope"
            context = "CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0-1,global_oom"
            headline = "Out of memory"
        lines = (
            f"{comm} invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0",
            f"oom-kill:constraint={context},task_memcg={cgroup},task={comm},pid={pid},uid={uid}",
            f"{headline}: Killed process {pid} ({comm}) total-vm:{total_vm}kB, anon-rss:{anon_rss_kib}kB, "
            f"file-rss:{file_rss}kB, shmem-rss:{shmem_rss}kB, UID:{uid} pgtables:{pgtables}kB oom_score_adj:0",
        )
        self.write(lines[0], KERN_WARNING)
        self.write(lines[1], KERN_INFO)
        self.write(lines[2], KERN_ERR)
        return lines

    def segfault(self, pid: int, name: str) -> str:
        """The kernel's line for `pid` dying of SIGSEGV (a NULL read in the CUDA driver library)."""
        mix = (pid * 0x9E3779B1) & 0xFFFFFFFF
        base = 0x7F0000000000 + ((mix & 0xFFFFF) << 12)
        ip = base + 0x1F3000 + (mix >> 20) * 16
        sp = 0x7FFC00000000 + ((mix >> 4) & 0xFFFFFF) * 16
        cpu = mix % 64
        line = (
            f"{name[:15]}[{pid}]: segfault at 0 ip {ip:016x} sp {sp:016x} error 4 in libcuda.so.1[{base:x}+2b5e000]"
            f" likely on CPU {cpu} (core {cpu}, socket 0)"
        )
        self.write(line, KERN_INFO)
        return line

    def close(self) -> None:
        """Close the writer and remove the FIFO; later writes are dropped."""
        with self._lock:
            if self._fd is None:
                return
            os.close(self._fd)
            self._fd = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    def _put(self, record: str) -> bool:
        if self._fd is None:
            self.dropped += 1
            return False
        data = record.encode("utf-8", errors="replace")
        try:
            # a record is at most ~1 KiB, under PIPE_BUF: written whole or not at all
            os.write(self._fd, data)
        except BlockingIOError:
            self.dropped += 1
            return False
        except OSError as exc:
            if exc.errno not in (errno.EPIPE, errno.EBADF):
                raise
            self.dropped += 1
            return False
        self.written += 1
        return True
