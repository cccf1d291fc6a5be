"""Each running container's CPU and memory from its cgroup (cgroup v2), as `docker stats` reads
them: runbook 004's "Docker container stats" every 30 s.

The engine puts a container in `system.slice/docker-<id>.scope` (the systemd cgroup driver) or
`docker/<id>` (cgroupfs). Three small files are read per container: `memory.current` (what is
charged to it, page cache included, as the OOM killer counts it), `memory.max` (its limit, `max`
when none) and `cpu.stat`'s `usage_usec`, whose growth between two looks is its CPU use. A node
without cgroup v2 there (or without containers) reports none.
"""

from __future__ import annotations

import re
from pathlib import Path

from gpumedic_events import ContainerUsage

MAX_CONTAINERS = 64
_SCOPES = (("system.slice", re.compile(r"docker-([0-9a-f]{64})\.scope")), ("docker", re.compile(r"([0-9a-f]{64})")))


class ContainerCgroups:
    """Looks at every container's cgroup under `root` (/sys/fs/cgroup, or where the host's is mounted)."""

    def __init__(self, root: Path = Path("/sys/fs/cgroup")) -> None:
        self.root = root
        self._last: dict[str, int] = {}
        """container id -> its cpu.stat usage_usec at the last look."""

    def read(self, elapsed_s: float, notes: list[str] | None = None) -> tuple[ContainerUsage, ...]:
        """Every running container's usage now, its CPU % over the `elapsed_s` since the last look
        (0 at the first), the largest memory first."""
        found: list[ContainerUsage] = []
        seen: dict[str, int] = {}
        for parent, name in _SCOPES:
            try:
                entries = list((self.root / parent).iterdir())
            except OSError:
                continue
            for entry in entries:
                match = name.fullmatch(entry.name)
                if match is None:
                    continue
                cid = match.group(1)
                try:
                    memory = int(_read(entry / "memory.current"))
                    limit_text = _read(entry / "memory.max")
                    usec = _usage_usec(_read(entry / "cpu.stat"))
                except (OSError, ValueError):
                    continue  # it stopped while looked at, or a controller is off: nothing to say of it
                seen[cid] = usec
                before = self._last.get(cid)
                cpu = 100.0 * (usec - before) / 1e6 / elapsed_s if before is not None and elapsed_s > 0 and usec >= before else 0.0
                found.append(ContainerUsage(
                    container_id=cid, cpu_pct=round(cpu, 1), memory_mib=memory >> 20,
                    memory_limit_mib=None if limit_text == "max" else int(limit_text) >> 20,
                ))
        self._last = seen
        return tuple(sorted(found, key=lambda c: -c.memory_mib)[:MAX_CONTAINERS])


def _read(path: Path) -> str:
    with open(path, encoding="ascii") as f:
        return f.read(4096).strip()


def _usage_usec(text: str) -> int:
    for line in text.splitlines():
        key, _, value = line.partition(" ")
        if key == "usage_usec":
            return int(value)
    raise ValueError("no usage_usec in cpu.stat")
