"""The process table: who a pid is (start time and command line), read from /proc.

The start time (/proc/PID/stat field 22) is what makes a pid an identity: the remediator
refuses to kill a pid whose start time no longer matches the sample, so a recycled pid is
never hit. Readers here never raise: a process may vanish between NVML listing it and /proc
being read, and that must cost one note in the sample, not the sample.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path
from typing import Protocol

STAT_STARTTIME_FIELD = 22
"""1-based field number of `starttime` in /proc/PID/stat (see proc(5))."""


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


def parse_cmdline(raw: bytes) -> str:
    """/proc/PID/cmdline's NUL-separated arguments, joined by spaces as `ps` shows them."""
    args = raw.split(b"\0")
    if args and args[-1] == b"":
        args.pop()
    return " ".join(a.decode("utf-8", errors="replace") for a in args)


class ProcFsTable:
    """The real process table under a proc root (`/proc`, or a copy of it in tests)."""

    def __init__(self, root: Path | str = "/proc") -> None:
        self.root = Path(root)

    def describe(self, pid: int, errors: list[str] | None = None) -> ProcessInfo | None:
        base = self.root / str(pid)
        try:
            stat = (base / "stat").read_bytes().decode("utf-8", errors="replace")
            cmdline = (base / "cmdline").read_bytes()
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
        return ProcessInfo(pid=pid, start_ticks=start_ticks, command=parse_cmdline(cmdline))

    def pids(self, errors: list[str] | None = None) -> list[int]:
        try:
            names = os.listdir(self.root)
        except OSError as exc:
            _note(errors, f"{self.root}: unreadable ({type(exc).__name__})")
            return []
        return sorted(int(n) for n in names if n.isdigit())


def _note(errors: list[str] | None, text: str) -> None:
    if errors is not None:
        errors.append(text)
