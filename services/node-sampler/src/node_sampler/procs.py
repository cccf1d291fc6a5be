"""The process table: who a pid is (start time, command line, user, container), read from /proc.

The start time (/proc/PID/stat field 22) is what makes a pid an identity: the remediator
refuses to kill a pid whose start time no longer matches the sample, so a recycled pid is
never hit. Readers here never raise: a process may vanish between NVML listing it and /proc
being read, and that must cost one note in the sample, not the sample.

`device_holders` finds every process holding a /dev/nvidia* file open, including those NVML does
not list (a leftover process that only holds /dev/nvidiactl still blocks a GPU reset). It scans
every process's open files, so it is written for nodes with hundreds of processes.
"""

from __future__ import annotations

import os
import pwd
import re
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Protocol

from node_sampler.jobenv import MAX_ENVIRON_BYTES, JobEnv, parse_environ

STAT_STARTTIME_FIELD = 22
"""1-based field number of `starttime` in /proc/PID/stat (see proc(5)); utime, stime and rss are 14, 15, 24."""
OWNER_TTL_S = 60.0
"""How long a process's user and cgroup, once read, are taken as they were."""
MAX_OWNERS = 4096


@dataclass(frozen=True)
class ProcessInfo:
    """What the node knows about one live process."""

    pid: int
    start_ticks: int | None
    command: str
    user: str = ""
    """User name, or the numeric uid when it has no name; empty if unread."""
    cgroup: str = ""
    container_id: str = ""
    """From the cgroup path (docker, containerd, cri-o, podman); empty if not in a container."""
    started_at: datetime | None = None
    """Boot time + start ticks / CLK_TCK, in UTC."""
    write_bytes: int | None = None
    """/proc/PID/io write_bytes: what it has written to storage so far; None if unreadable."""
    job: JobEnv | None = None
    """The job it is a rank of, from its launcher's environment; None if none or unreadable."""


class ProcessTable(Protocol):
    """The node's processes. The real one reads /proc; the simulated node has its own."""

    def describe(self, pid: int, errors: list[str] | None = None) -> ProcessInfo | None:
        """The process, or None (with a short note appended to `errors`) if it cannot be read."""
        ...

    def pids(self, errors: list[str] | None = None) -> list[int]:
        """Every pid the table can see right now."""
        ...

    def device_holders(self, errors: list[str] | None = None) -> dict[int, tuple[str, ...]]:
        """pid -> the /dev/nvidia* files it holds open, for every process holding any."""
        ...

    def usage(self, errors: list[str] | None = None) -> dict[int, ProcessUsage]:
        """Every process's CPU time so far and resident memory now: what `top` ranks by."""
        ...


@dataclass(frozen=True)
class ProcessUsage:
    """One process's counters from /proc/PID/stat."""

    pid: int
    start_ticks: int | None
    cpu_s: float
    """utime + stime: seconds it has spent on CPUs since it started."""
    rss_kib: int


def parse_start_ticks(stat: str) -> int | None:
    """The start time from one /proc/PID/stat line, or None if the line is not one.

    comm (field 2) is free text in parentheses that may itself hold spaces and parens, so the
    fields after it are found after the LAST ')'.
    """
    _, sep, rest = stat.rpartition(")")
    if not sep:
        return None
    fields = rest.split()
    # `rest` starts at field 3 (state)
    index = STAT_STARTTIME_FIELD - 3
    if len(fields) <= index:
        return None
    try:
        ticks = int(fields[index])
    except ValueError:
        return None
    return ticks if ticks >= 0 else None


def parse_usage(pid: int, stat: str, *, page_kib: int, clk_tck: int) -> ProcessUsage | None:
    """CPU time (utime + stime) and resident memory from one /proc/PID/stat line, or None."""
    _, sep, rest = stat.rpartition(")")
    fields = rest.split()
    if not sep or len(fields) <= 24 - 3:
        return None
    try:
        utime, stime, start, rss = (int(fields[n - 3]) for n in (14, 15, STAT_STARTTIME_FIELD, 24))
    except ValueError:
        return None
    if min(utime, stime, start) < 0:
        return None
    return ProcessUsage(pid=pid, start_ticks=start, cpu_s=(utime + stime) / clk_tck, rss_kib=max(0, rss) * page_kib)


def parse_cmdline(raw: bytes) -> str:
    """/proc/PID/cmdline's NUL-separated arguments, joined by spaces as `ps` shows them."""
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    return " ".join(a.decode("utf-8", errors="replace") for a in args)


def parse_uid(status: str) -> int | None:
    """The real uid from /proc/PID/status ("Uid:\t<real>\t<effective>\t<saved>\t<fs>"), or None."""
    for line in status.splitlines():
        if line.startswith("Uid:"):
            fields = line[4:].split()
            if fields and fields[0].isdigit():
                return int(fields[0])
            return None
    return None


def parse_write_bytes(text: str) -> int | None:
    """`write_bytes` from /proc/PID/io ("write_bytes: 1234" among other counters), or None."""
    for line in text.splitlines():
        name, _, value = line.partition(":")
        if name == "write_bytes":
            value = value.strip()
            return int(value) if value.isdigit() else None
    return None


def parse_cgroup(text: str) -> str:
    """The process's cgroup path from /proc/PID/cgroup ("hierarchy:controllers:path" lines).

    The cgroup v2 line ("0::path") when there is one, else the v1 memory controller's line,
    else the first line. On a hybrid host whose v2 line is just "/" while the memory controller
    places the process deeper (the container runtime only manages v1), the memory line wins:
    it is the one naming the container. "" if the text holds no such line.
    """
    unified = memory = first = None
    for line in text.splitlines():
        hierarchy, sep1, rest = line.partition(":")
        controllers, sep2, path = rest.partition(":")
        if not (sep1 and sep2) or not path:
            continue
        if first is None:
            first = path
        if hierarchy == "0" and controllers == "":
            unified = path
        elif memory is None and "memory" in controllers.split(","):
            memory = path
    if unified is not None and not (unified == "/" and memory not in (None, "/")):
        return unified
    if memory is not None:
        return memory
    return first or ""


_CONTAINER_PATTERNS = (
    # systemd cgroup driver: docker-<id>.scope, cri-containerd-<id>.scope, crio-<id>.scope,
    # libpod-<id>.scope (their "-conmon-" siblings are the runtime's monitor, not the container)
    re.compile(r"(?:^|/)(?:docker|cri-containerd|crio|libpod)-([0-9a-f]{12,64})\.scope(?=/|$)"),
    # cgroupfs driver: /docker/<id>, /kubepods/<qos>/pod<uid>/<id>, /libpod_parent/libpod-<id>
    re.compile(r"(?:^|/)(?:libpod-)?([0-9a-f]{64})(?=/|$)"),
)


def container_id_from_cgroup(path: str) -> str:
    """The container id in a cgroup path (docker, containerd/Kubernetes, cri-o, podman), or "".

    The innermost match wins, so a container nested in another (systemd or docker inside a
    container) is named by its own id.
    """
    best_at, best = -1, ""
    for pattern in _CONTAINER_PATTERNS:
        for m in pattern.finditer(path):
            if m.start(1) > best_at:
                best_at, best = m.start(1), m.group(1)
    return best


def parse_btime(stat: str) -> int | None:
    """Boot time (seconds since the epoch) from /proc/stat's "btime" line, or None."""
    for line in stat.splitlines():
        if line.startswith("btime "):
            value = line[6:].strip()
            return int(value) if value.isdigit() else None
    return None


def is_nvidia_device(target: str) -> bool:
    """Whether an fd's link target is one of the NVIDIA driver's device files."""
    if not target.startswith("/dev/nvidia"):
        return False
    rest = target[11:]
    return rest.isdigit() or rest in _NVIDIA_NAMES or (rest.startswith("-caps/") and len(rest) > 6)


_NVIDIA_NAMES = frozenset({"ctl", "-uvm", "-uvm-tools", "-modeset"})


class ProcFsTable:
    """The real process table under a proc root (`/proc`, or a copy of it in tests).

    `boot_time` (seconds since the epoch) and `clk_tck` default to /proc/stat's btime (read
    once, on first use) and sysconf(SC_CLK_TCK).
    """

    def __init__(
        self, root: Path | str = "/proc", *, boot_time: float | None = None, clk_tck: int | None = None, job_label: str = ""
    ) -> None:
        self.root = Path(root)
        self._root = str(root).rstrip("/") or "/"
        self._boot_time = boot_time
        self._boot_time_read = boot_time is not None
        self._clk_tck = clk_tck or os.sysconf("SC_CLK_TCK")
        self._job_label = job_label
        self._users: dict[int, str] = {}
        self._owners: dict[tuple[int, int | None], tuple[float, str, str, JobEnv | None]] = {}
        """(pid, start ticks) -> (read at, user, cgroup, job): a process keeps its user, cgroup and
        launch environment (an exec keeps the first two, and a job's launcher sets the third once;
        its command line is read every time), so status, cgroup and environ are read again only
        after OWNER_TTL_S: 3 of the 6 files per GPU process and sample."""

    def describe(self, pid: int, errors: list[str] | None = None) -> ProcessInfo | None:
        base = f"{self._root}/{pid}"
        try:
            stat = _read(f"{base}/stat").decode("utf-8", errors="replace")
            cmdline = _read(f"{base}/cmdline")
        except FileNotFoundError:
            _note(errors, f"pid {pid}: not in {self.root} (exited, or another pid namespace)")
            return None
        except OSError as exc:
            # ProcessLookupError (ESRCH) is what reading a process that just exited can give
            _note(errors, f"pid {pid}: unreadable ({type(exc).__name__})")
            return None
        start_ticks = parse_start_ticks(stat)
        if start_ticks is None:
            _note(errors, f"pid {pid}: malformed stat line")
        user, cgroup, job = self._owner(pid, start_ticks, base, errors)
        return ProcessInfo(
            pid=pid,
            start_ticks=start_ticks,
            command=parse_cmdline(cmdline),
            user=user,
            cgroup=cgroup,
            container_id=container_id_from_cgroup(cgroup),
            started_at=self._started_at(start_ticks, errors),
            write_bytes=self._write_bytes(base),
            job=job,
        )

    def _owner(
        self, pid: int, start_ticks: int | None, base: str, errors: list[str] | None
    ) -> tuple[str, str, JobEnv | None]:
        """The process's user, cgroup and job, read again after OWNER_TTL_S (only what read cleanly is kept)."""
        now = time.monotonic()
        known = self._owners.get((pid, start_ticks))
        if known is not None and now - known[0] < OWNER_TTL_S:
            return known[1], known[2], known[3]
        user, cgroup = "", ""
        status = self._read_more(pid, base, "status", errors)
        if status is not None:
            uid = parse_uid(status)
            if uid is None:
                _note(errors, f"pid {pid}: malformed status (no Uid line)")
            else:
                user = self._user(uid)
        text = self._read_more(pid, base, "cgroup", errors)
        if text is not None:
            cgroup = parse_cgroup(text)
            if not cgroup:
                _note(errors, f"pid {pid}: malformed cgroup file")
        job = self._job(base)
        clean = status is not None and text is not None and bool(user) and bool(cgroup)
        if clean and start_ticks is not None:
            if len(self._owners) >= MAX_OWNERS:  # processes come and go: forget the oldest reads
                for key, _ in sorted(self._owners.items(), key=lambda item: item[1][0])[: MAX_OWNERS // 2]:
                    del self._owners[key]
            self._owners[(pid, start_ticks)] = (now, user, cgroup, job)
        return user, cgroup, job

    def _job(self, base: str) -> JobEnv | None:
        # Another user's environment needs root (ptrace read access), as its io counters do:
        # None says "cannot tell", without a note per process and sample.
        try:
            with open(f"{base}/environ", "rb") as f:
                return parse_environ(f.read(MAX_ENVIRON_BYTES), self._job_label)
        except OSError:
            return None

    @staticmethod
    def _write_bytes(base: str) -> int | None:
        # Another user's io counters need root (ptrace read access): None says "cannot tell",
        # without a note per process and sample.
        try:
            return parse_write_bytes(_read(f"{base}/io").decode("ascii", errors="replace"))
        except OSError:
            return None

    def pids(self, errors: list[str] | None = None) -> list[int]:
        try:
            names = os.listdir(self._root)
        except OSError as exc:
            _note(errors, f"{self.root}: unreadable ({type(exc).__name__})")
            return []
        return sorted(int(n) for n in names if n.isdigit())

    def usage(self, errors: list[str] | None = None) -> dict[int, ProcessUsage]:
        """One read of each process's stat line; a process that exits meanwhile is left out unnoted."""
        page_kib = os.sysconf("SC_PAGE_SIZE") // 1024
        found: dict[int, ProcessUsage] = {}
        for pid in self.pids(errors):
            try:
                stat = _read(f"{self._root}/{pid}/stat").decode("utf-8", errors="replace")
            except OSError:
                continue
            if (usage := parse_usage(pid, stat, page_kib=page_kib, clk_tck=self._clk_tck)) is not None:
                found[pid] = usage
        return found

    def device_holders(self, errors: list[str] | None = None) -> dict[int, tuple[str, ...]]:
        root = self._root
        try:
            names = os.listdir(root)
        except OSError as exc:
            _note(errors, f"{self.root}: unreadable ({type(exc).__name__})")
            return {}
        holders: dict[int, tuple[str, ...]] = {}
        unreadable: list[str] = []
        # one open of the fd directory, then readlink relative to it: no path walk per fd
        open_, close, listdir, readlink, is_device = os.open, os.close, os.listdir, os.readlink, is_nvidia_device
        flags = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
        for name in names:
            if not name.isdigit():
                continue
            try:
                dir_fd = open_(f"{root}/{name}/fd", flags)
            except (FileNotFoundError, ProcessLookupError):
                continue  # exited since the listing
            except OSError:
                unreadable.append(name)
                continue
            held: set[str] | None = None
            try:
                for fd in listdir(dir_fd):
                    try:
                        target = readlink(fd, dir_fd=dir_fd)
                    except (FileNotFoundError, ProcessLookupError):
                        continue  # closed, or the process exited, since the listing
                    except OSError:
                        # the directory lists but its links are not ours to read (ptrace access)
                        unreadable.append(name)
                        break
                    if target.startswith("/dev/nvidia") and is_device(target):
                        if held is None:
                            held = set()
                        held.add(target)
            except OSError:
                continue  # the process exited while its directory was being listed
            finally:
                close(dir_fd)
            if held:
                holders[int(name)] = tuple(sorted(held))
        if unreadable:
            whose = "process's" if len(unreadable) == 1 else "processes'"
            pids = ", ".join(unreadable[:5]) + (", ..." if len(unreadable) > 5 else "")
            # as root, what still refuses is the kernel or a sandbox (a VM's agent), not our rights
            advice = "refused even to root" if os.geteuid() == 0 else "run as root to see every /dev/nvidia* holder"
            _note(errors, f"{len(unreadable)} {whose} open files unreadable (pid {pids}): {advice}")
        return holders

    def _read_more(self, pid: int, base: str, name: str, errors: list[str] | None) -> str | None:
        """A further file of a process already read once: gone now means it exited meanwhile."""
        try:
            return _read(f"{base}/{name}").decode("utf-8", errors="replace")
        except (FileNotFoundError, ProcessLookupError):
            _note(errors, f"pid {pid}: exited while being read ({name} gone)")
        except OSError as exc:
            _note(errors, f"pid {pid}: {name} unreadable ({type(exc).__name__})")
        return None

    def _user(self, uid: int) -> str:
        name = self._users.get(uid)
        if name is None:
            try:
                name = pwd.getpwuid(uid).pw_name
            except KeyError:
                name = str(uid)
            self._users[uid] = name
        return name

    def _started_at(self, start_ticks: int | None, errors: list[str] | None) -> datetime | None:
        if start_ticks is None:
            return None
        if not self._boot_time_read:
            self._boot_time_read = True
            try:
                self._boot_time = parse_btime(_read(f"{self._root}/stat").decode("ascii", errors="replace"))
            except OSError as exc:
                _note(errors, f"{self.root}/stat: unreadable ({type(exc).__name__}): start times left out")
            else:
                if self._boot_time is None:
                    _note(errors, f"{self.root}/stat: no btime line: start times left out")
        if self._boot_time is None:
            return None
        return datetime.fromtimestamp(self._boot_time + start_ticks / self._clk_tck, UTC)


def _read(path: str) -> bytes:
    with open(path, "rb", buffering=0) as f:
        return f.read()


def _note(errors: list[str] | None, text: str) -> None:
    if errors is not None:
        errors.append(text)
