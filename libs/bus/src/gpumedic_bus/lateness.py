"""How late this process runs: its event loop's lag, and the kernel's word on CPU pressure.

A service that times something (an SSH login, a peer's answer, a node's silence) measures its own
starvation when its event loop runs late: a 10 s timeout it "saw" may be a 2 s answer that waited
8 s for the loop. `LoopLag` measures that lateness the plain way, a timer asked for every
`PROBE_EVERY_S` and how much later it fired, and keeps the recent worst; a measurement taken while
it was past `LAGGING_AFTER_S` judges nothing. The kernel's pressure stall information (PSI, the
kernel's `accounting/psi` page) says the same of the host or of one cgroup: the share of the last
10 s that some (or every) runnable task waited for a CPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from pathlib import Path

from gpumedic_events import CpuPressure

log = logging.getLogger(__name__)

PROBE_EVERY_S = 0.25
"""How often the loop's lateness is measured (one timer: a few microseconds each)."""
KEPT_S = 120.0
"""How long the measurements are kept: enough for the longest timeout any service waits for."""
LAGGING_AFTER_S = 1.0
"""A loop later than this times nothing to trust: an answer can be judged late by the time it waited
for the loop, and a timeout the service measured says nothing of what it timed."""

HOST_PRESSURE = Path("/proc/pressure/cpu")


class LoopLag:
    """`lag = LoopLag(); task = asyncio.create_task(lag.run())`; then `lag.worst_since(t0)`."""

    def __init__(self, *, every_s: float = PROBE_EVERY_S, clock=time.monotonic) -> None:
        self.every_s = every_s
        self._clock = clock
        self._seen: deque[tuple[float, float]] = deque()
        """(when it fired, how late), over the last KEPT_S."""
        self._waiting_since: float | None = None
        """When the timer under way should have fired: a loop blocked now is late by now - this."""

    async def run(self) -> None:
        while True:
            due = self._clock() + self.every_s
            self._waiting_since = due
            await asyncio.sleep(self.every_s)
            now = self._clock()
            self.note(now, max(0.0, now - due))

    def note(self, at: float, late_s: float) -> None:
        """One measurement (also how a test or a simulated starvation says the loop was late)."""
        self._seen.append((at, late_s))
        while self._seen and at - self._seen[0][0] > KEPT_S:
            self._seen.popleft()

    def worst_since(self, since: float) -> float:
        """The worst lateness measured from `since` (monotonic) to now, the timer under way included."""
        now = self._clock()
        pending = now - self._waiting_since if self._waiting_since is not None and self._waiting_since >= since else 0.0
        return max([pending, *(late for at, late in self._seen if at >= since)])

    def worst(self, within_s: float = 10.0) -> float:
        """The worst lateness over the last `within_s`: what the heartbeat says."""
        return self.worst_since(self._clock() - within_s)

    def lagging_since(self, since: float) -> bool:
        """Whether the loop was later than LAGGING_AFTER_S at any time from `since`: what was timed
        meanwhile (a timeout above all) judges nothing."""
        return self.worst_since(since) > LAGGING_AFTER_S


def parse_pressure(text: str) -> CpuPressure | None:
    """`some avg10=61.20 avg60=... total=...` (and a `full` line on newer kernels) as a CpuPressure;
    None where there is no valid `some` line."""
    found: dict[str, float] = {}
    for line in text.splitlines():
        kind, _, rest = line.partition(" ")
        for field in rest.split():
            name, _, value = field.partition("=")
            if name == "avg10" and kind in ("some", "full"):
                try:
                    number = float(value)
                except ValueError:
                    break
                if 0.0 <= number <= 100.0:  # also refuses nan
                    found[kind] = number
                break
    if "some" not in found:
        return None
    return CpuPressure(some_avg10_pct=found["some"], full_avg10_pct=found.get("full"))


def read_pressure(path: Path | str = HOST_PRESSURE) -> CpuPressure | None:
    """The CPU pressure in a PSI file (the host's, or a cgroup's `cpu.pressure`); None where there is
    none (a kernel without PSI, or booted with psi=0: reading it then fails with EOPNOTSUPP)."""
    try:
        with open(path, "rb", buffering=0) as f:
            return parse_pressure(f.read(4096).decode("ascii", errors="replace"))
    except OSError:
        return None


def own_cgroup_pressure(proc_self_cgroup: Path | str = "/proc/self/cgroup", cgroup_root: Path | str = "/sys/fs/cgroup") -> Path | None:
    """The `cpu.pressure` file of this process's own cgroup v2 group (`0::/path` in /proc/self/cgroup),
    where there is one; None at the root (the host's own figure is the node's) or on cgroup v1."""
    try:
        text = Path(proc_self_cgroup).read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("0::"):
            group = line[3:].strip().strip("/")
            if not group or ".." in group.split("/"):
                return None
            path = Path(cgroup_root) / group / "cpu.pressure"
            return path if path.exists() else None
    return None
