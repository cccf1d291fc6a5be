"""Kernel OOM-killer events, read from /dev/kmsg as the kernel logs them.

A job killed by the OOM killer vanishes from NVML between two samples exactly like a job that
finished; only the kernel log says it was killed, which process it was and in which container.
The kernel writes two lines that matter (mm/oom_kill.c, Linux 5.x and later):

    oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=docker-<id>.scope,mems_allowed=0,
        oom_memcg=/system.slice/docker-<id>.scope,task_memcg=/system.slice/docker-<id>.scope,
        task=python3,pid=4242,uid=1000                                     (dump_oom_summary)
    Memory cgroup out of memory: Killed process 4242 (python3) total-vm:..kB, anon-rss:..kB,
        file-rss:..kB, shmem-rss:..kB, UID:1000 pgtables:..kB oom_score_adj:0  (__oom_kill_process)

(the first as one line; "Out of memory:" instead for a host-wide OOM). Kernels before 4.19 write
no oom-kill: line and a bare "Killed process 4242 (python3) total-vm:..kB, anon-rss:..kB, ..." line.

/dev/kmsg hands out one record per read ("prio,seq,usec,flags;message\\n" and continuation lines
starting with a space) and needs CAP_SYSLOG where dmesg is restricted; without it the events are
off and the sampler says so once. The simulated node writes the same records into a FIFO.
"""

from __future__ import annotations

import asyncio
import errno
import logging
import os
import re
from collections.abc import Callable
from typing import NamedTuple

from node_sampler.immediate import OomKillReading
from node_sampler.procs import container_id_from_cgroup

log = logging.getLogger(__name__)

KMSG = "/dev/kmsg"
READ_SIZE = 16384
"""Larger than any /dev/kmsg record (the kernel's limit is 8 KiB with its dictionary)."""
MAX_PENDING = 65536
"""A FIFO line longer than this without a newline is garbage: it is dropped, not buffered on."""
RETRY_S = 1.0
"""How long to wait after end of file (a FIFO without writer, a regular file) before reading on."""

_SUMMARY_TASK = re.compile(r",task=(?P<task>.*),pid=(?P<pid>\d+),uid=(?P<uid>\d+)\s*$")
_SUMMARY_CONSTRAINT = re.compile(r"oom-kill:constraint=(?P<constraint>[^,]*)")
_SUMMARY_MEMCG = re.compile(r",task_memcg=(?P<memcg>.*?),task=")
_KILLED = re.compile(
    # ", UID 1000," after the name: RHEL 7's kernels
    r"Killed process (?P<pid>\d+) \((?P<name>.*)\),? (?:UID (?P<old_uid>\d+), )?"
    r"total-vm:\d+kB, anon-rss:(?P<anon>\d+)kB"
    r"(?:.*?\bUID:(?P<uid>\d+))?"
)
_ESCAPE = re.compile(r"\\x([0-9a-fA-F]{2})")


def split_kmsg_record(record: str) -> tuple[int, str] | None:
    """(sequence number, message) of one /dev/kmsg record, or None if it has no such header.

    The record is "prio,seq,ts_usec,flags[,more];message", possibly followed by continuation
    lines (" KEY=value", which are dropped). The kernel writes non-printable bytes of the message
    as \\xNN; they are turned back.
    """
    header, sep, rest = record.partition(";")
    if not sep:
        return None
    fields = header.split(",")
    if len(fields) < 3 or not (fields[0].isdigit() and fields[1].isdigit() and fields[2].isdigit()):
        return None
    message = rest.split("\n", 1)[0]
    if "\\x" in message:
        message = _ESCAPE.sub(lambda m: chr(int(m.group(1), 16)), message)
    return int(fields[1]), message


def parse_kmsg_record(record: str) -> str | None:
    """The message of one /dev/kmsg record, or None if it is not one (the caller notes it)."""
    parsed = split_kmsg_record(record)
    return parsed[1] if parsed is not None else None


class OomParser:
    """Turns kernel log messages, fed in order, into OOM kills.

    It remembers the last oom-kill: summary line and merges it into the Killed process line
    that follows for the same pid. A line that mentions "Killed process" but does not parse is
    logged (a kernel format this parser does not know) and counted in `malformed`.
    """

    def __init__(self) -> None:
        self._summary: _Summary | None = None
        self.malformed = 0

    def feed(self, message: str) -> OomKillReading | None:
        if message.startswith("oom-kill:") or "oom-kill:constraint=" in message:
            self._summary = _parse_summary(message)
            return None
        if "Killed process" not in message:
            return None
        m = _KILLED.search(message)
        if m is None:
            self.malformed += 1
            log.warning("unrecognised OOM-kill line: %s", message[:200])
            return None
        pid = int(m.group("pid"))
        summary, self._summary = self._summary, None
        if summary is not None and summary.pid != pid:
            summary = None  # the summary of another kill
        uid = m.group("uid") or m.group("old_uid")
        if uid is None and summary is not None:
            uid = summary.uid
        cgroup = summary.cgroup if summary is not None else ""
        return OomKillReading(
            pid=pid,
            process_name=m.group("name"),
            uid=int(uid) if uid is not None else None,
            constraint=summary.constraint if summary is not None else "",
            cgroup=cgroup,
            container_id=container_id_from_cgroup(cgroup),
            anon_rss_kib=int(m.group("anon")),
            kernel_lines=(summary.line, message) if summary is not None else (message,),
        )


class _Summary(NamedTuple):
    pid: int
    uid: str
    constraint: str
    cgroup: str
    line: str


def _parse_summary(message: str) -> _Summary | None:
    """dump_oom_summary's one line; task_memcg is absent on kernels without memory cgroups."""
    task = _SUMMARY_TASK.search(message)
    if task is None:
        return None
    constraint = _SUMMARY_CONSTRAINT.search(message)
    memcg = _SUMMARY_MEMCG.search(message)
    return _Summary(
        pid=int(task.group("pid")),
        uid=task.group("uid"),
        constraint=constraint.group("constraint") if constraint else "",
        cgroup=memcg.group("memcg") if memcg else "",
        line=message,
    )


class KernelLogWatcher:
    """Watches the kernel log for OOM kills until cancelled: `await watcher.run()`.

    `on_oom` is called on the event loop, once per kill. With `skip_backlog` (the default) the
    kills logged before the watcher started are not reported again after a sampler restart.
    """

    def __init__(
        self,
        path: str | os.PathLike[str] = KMSG,
        on_oom: Callable[[OomKillReading], None] | None = None,
        *,
        skip_backlog: bool = True,
        retry_s: float = RETRY_S,
    ) -> None:
        if on_oom is None:
            raise TypeError("KernelLogWatcher needs on_oom")
        self.path = os.fspath(path)
        self.on_oom = on_oom
        self.skip_backlog = skip_backlog
        self.retry_s = retry_s
        self.parser = OomParser()
        self.records = 0
        """Records read and parsed."""
        self.bad_records = 0
        """Records without a /dev/kmsg header."""
        self.lost_records = 0
        """Records the kernel overwrote before they were read (EPIPE), as far as known."""
        self.active = False
        """True while the log is open and watched."""
        self._fd: int | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending = b""
        self._last_seq: int | None = None
        self._overran = False
        self._retry: asyncio.TimerHandle | None = None
        self._reading = False
        self._stopped: asyncio.Future[None] | None = None

    @property
    def malformed_records(self) -> int:
        """Records that could not be used: no header, or a "Killed process" line not understood."""
        return self.bad_records + self.parser.malformed

    async def run(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        except OSError as exc:
            hint = "; the sampler needs CAP_SYSLOG or root for them" if isinstance(exc, PermissionError) else ""
            log.warning("OOM-kill events off: cannot read %s (%s)%s", self.path, type(exc).__name__, hint)
            return
        if self.skip_backlog:
            try:
                os.lseek(fd, 0, os.SEEK_END)
            except OSError as exc:
                if exc.errno != errno.ESPIPE:  # a FIFO: nothing to skip
                    log.debug("%s: cannot skip the backlog (%s)", self.path, type(exc).__name__)
        self._fd, self._loop = fd, loop
        self._stopped = loop.create_future()
        self.active = True
        try:
            self._watch()
            await self._stopped
        finally:
            self.active = False
            if self._retry is not None:
                self._retry.cancel()
            if self._reading:
                loop.remove_reader(fd)
                self._reading = False
            self._fd = None
            os.close(fd)

    # --- on the event loop ----------------------------------------------------------------

    def _watch(self) -> None:
        """Read when the log is readable; a regular file (epoll refuses it) is polled instead."""
        self._retry = None
        assert self._loop is not None and self._fd is not None
        try:
            self._loop.add_reader(self._fd, self._on_readable)
        except (PermissionError, ValueError):
            self._on_readable()  # reads what is there, then waits retry_s at its end
        else:
            self._reading = True

    def _on_readable(self) -> None:
        fd, loop = self._fd, self._loop
        if fd is None or loop is None:
            return
        while True:
            try:
                chunk = os.read(fd, READ_SIZE)
            except BlockingIOError:
                return
            except InterruptedError:
                continue
            except OSError as exc:
                if exc.errno == errno.EPIPE:
                    # /dev/kmsg: the records we were due to read were overwritten; reading on
                    # continues at the oldest record still there
                    self._overran = True
                    continue
                log.warning("OOM-kill events off: reading %s failed (%s)", self.path, exc)
                self._stop()
                return
            if not chunk:
                # end of file: a FIFO whose writer went away, or the end of a regular file. The
                # fd stays readable at EOF, so stop watching it for a while instead of spinning.
                if self._reading:
                    loop.remove_reader(fd)
                    self._reading = False
                self._retry = loop.call_later(self.retry_s, self._watch)
                return
            self._take(chunk)

    def _take(self, chunk: bytes) -> None:
        data = self._pending + chunk if self._pending else chunk
        lines = data.split(b"\n")
        self._pending = lines.pop()
        if len(self._pending) > MAX_PENDING:
            self._pending = b""
            self.bad_records += 1
        for line in lines:
            if not line or line[0] == 0x20:  # continuation line (" KEY=value") or blank
                continue
            self._record(line.decode("utf-8", errors="replace"))

    def _record(self, record: str) -> None:
        parsed = split_kmsg_record(record)
        if parsed is None:
            self.bad_records += 1
            if self.bad_records == 1:
                log.warning("%s: record without a kmsg header: %s", self.path, record[:200])
            return
        seq, message = parsed
        self.records += 1
        if self._overran:
            self._overran = False
            lost = seq - self._last_seq - 1 if self._last_seq is not None and seq > self._last_seq else None
            if lost:
                self.lost_records += lost
                log.warning("kernel log overran: %d records lost", lost)
            else:
                log.warning("kernel log overran: records lost")
        self._last_seq = seq
        reading = self.parser.feed(message)
        if reading is not None:
            try:
                self.on_oom(reading)
            except Exception:
                log.exception("on_oom failed for pid %d", reading.pid)

    def _stop(self) -> None:
        if self._stopped is not None and not self._stopped.done():
            self._stopped.set_result(None)
