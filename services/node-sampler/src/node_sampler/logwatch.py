"""The operator's log patterns: regular expressions counted over named log files, the systemd
journal and containers' logs, each pattern's count a fact in every sample (runbook 001: "look for
recurring error patterns": "Authentication failed", "Failed to reset orphaned tasks", "SSH
connection failed"; runbook 004: "check with docker stats and docker logs").

Only lines written since the sampler started count. A file is followed as `tail -F` does: from
its end, again from its start when it was rotated (another inode) or truncated, at most
`MAX_READ` bytes a round, so a log that floods costs a bounded read. The journal is followed
with `journalctl --follow` (of one unit, or all), one process per journal source. A container's
log is followed through the Docker engine (`logs?follow=1`), by name, so the container that
replaces a stopped one of that name is followed too. The detector judges the counts: so many
matches within a window is an incident of the pattern.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import LogMatches
from gpumedic_events.action import UNIT_PATTERN
from gpumedic_events.node import CHECK_NAME
from gpumedic_events.redact import redact
from pydantic import BaseModel, ConfigDict, Field, field_validator

from node_sampler import http
from node_sampler.docker_logs import LogTail

MAX_PATTERNS = 32
MAX_READ = 1 << 20
MAX_LINE = 65536
MAX_CONTAINER_LINES = 4096
"""Lines of a container's log held between two reads of its stream (a flood beyond that is not counted whole)."""
JOURNAL = "journal"
CONTAINER = "container"
CONTAINER_NAME = re.compile(r"[a-zA-Z0-9][a-zA-Z0-9_.-]{0,127}")
"""A container name as the engine allows them."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")


class LogPattern(BaseModel):
    """One pattern: its name (as the policy's `kinds.log_pattern.patterns` names it), the regular
    expression a line must contain a match of, and where to look: absolute file paths, `journal`
    (the whole journal), `journal:UNIT` (one systemd unit's) or `container:NAME` (a container's log)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    name: str = Field(pattern=CHECK_NAME)
    regex: str = Field(min_length=1, max_length=500)
    sources: tuple[str, ...] = Field(min_length=1, max_length=16)

    @field_validator("regex")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a regular expression: {exc}") from None
        return value

    @field_validator("sources")
    @classmethod
    def _sources(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for source in value:
            unit = source.removeprefix(f"{JOURNAL}:")
            if source == JOURNAL or (source.startswith(f"{JOURNAL}:") and re.fullmatch(UNIT_PATTERN, unit)):
                continue
            if source.startswith(f"{CONTAINER}:") and CONTAINER_NAME.fullmatch(source.partition(":")[2]):
                continue
            if not source.startswith("/") or "\x00" in source:
                raise ValueError(f"{source[:100]!r}: give an absolute file path, journal, journal:UNIT.service or container:NAME")
        return value


@dataclass
class _Count:
    pattern: LogPattern
    compiled: re.Pattern[str]
    count: int = 0
    last: str = ""
    errors: dict[str, str] = field(default_factory=dict)
    """source -> why it cannot be read now."""


@dataclass
class _File:
    offset: int | None = None
    inode: tuple[int, int] | None = None
    partial: bytes = b""


class LogPatterns:
    """Counts `patterns` over their sources, every `interval_s` for the files, as lines come for the
    journal; files are read under `root` (where the node's file system is mounted for the sampler)."""

    def __init__(self, patterns: Sequence[LogPattern], *, interval_s: float = 5.0, root: Path = Path("/"),
                 docker_socket: Path | None = None) -> None:
        if len(patterns) > MAX_PATTERNS:
            raise ValueError(f"at most {MAX_PATTERNS} log patterns, not {len(patterns)}")
        if len({p.name for p in patterns}) != len(patterns):
            raise ValueError("two log patterns have one name")
        self.interval_s = interval_s
        self.root = root
        self.counts = [_Count(p, re.compile(p.regex)) for p in patterns]
        self._files: dict[str, _File] = {s: _File() for p in patterns for s in p.sources if s.startswith("/")}
        self._journals = sorted({s for p in patterns for s in p.sources if s.startswith(JOURNAL)})
        self._containers = sorted({s for p in patterns for s in p.sources if s.startswith(f"{CONTAINER}:")})
        self.docker_socket = docker_socket
        self._tasks: list[asyncio.Task] = []

    def observe(self) -> tuple[LogMatches, ...]:
        """Each pattern's count so far; the first call starts following the sources."""
        if not self._tasks:
            loop = asyncio.get_running_loop()
            self._tasks = [loop.create_task(self._follow_files(), name="log-files")] if self._files else []
            self._tasks += [loop.create_task(self._follow_journal(source), name=f"log-{source}") for source in self._journals]
            self._tasks += [loop.create_task(self._follow_container(source), name=f"log-{source}") for source in self._containers]
        return tuple(
            LogMatches(name=c.pattern.name, count=c.count, last_line=c.last, error="; ".join(c.errors.values())[:300] or None)
            for c in self.counts
        )

    async def close(self) -> None:
        await stop_tasks(self._tasks)

    def feed(self, source: str, lines: Sequence[str]) -> None:
        """Count `lines` of `source` against the patterns that look there."""
        for c in self.counts:
            if source not in c.pattern.sources:
                continue
            matched = [line for line in lines if c.compiled.search(line)]
            if matched:
                c.count += len(matched)
                c.last = redact(_CONTROL.sub(" ", matched[-1]).strip())[:256]

    def _error(self, source: str, why: str | None) -> None:
        for c in self.counts:
            if source in c.pattern.sources:
                if why is None:
                    c.errors.pop(source, None)
                else:
                    c.errors[source] = f"{source}: {why}"

    async def _follow_files(self) -> None:
        while True:
            for source, state in self._files.items():
                try:
                    lines = await asyncio.to_thread(self._read_new, source, state)
                    self._error(source, None)
                except OSError as exc:
                    state.offset = 0  # when it is back, it is a new file: read it from its start
                    self._error(source, exc.strerror or str(exc))
                    continue
                if lines:
                    self.feed(source, lines)
            await asyncio.sleep(self.interval_s)

    def _read_new(self, source: str, state: _File) -> list[str]:
        """The whole lines written to `source` since the last read (none on the first: history does not count)."""
        with open(self.root / source.lstrip("/"), "rb") as f:
            info = os.fstat(f.fileno())
            inode = (info.st_dev, info.st_ino)
            if state.offset is None:
                state.offset, state.inode = info.st_size, inode
                return []
            if inode != state.inode or info.st_size < state.offset:  # rotated, or truncated
                state.offset, state.inode, state.partial = 0, inode, b""
            f.seek(state.offset)
            data = f.read(MAX_READ)
        state.offset += len(data)
        *lines, rest = (state.partial + data).split(b"\n")
        state.partial = rest[-MAX_LINE:]
        return [line.decode("utf-8", "replace") for line in lines]

    async def _follow_journal(self, source: str) -> None:
        unit = source.partition(":")[2]
        command = ["journalctl", "--follow", "--lines=0", "--output=cat", "--quiet", *([f"--unit={unit}"] if unit else [])]
        while True:
            try:
                process = await asyncio.create_subprocess_exec(
                    *command, stdin=asyncio.subprocess.DEVNULL, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL,
                    limit=MAX_LINE, start_new_session=True,
                )
            except OSError as exc:
                self._error(source, f"journalctl cannot run: {exc.strerror or exc}")
                await asyncio.sleep(60)
                continue
            self._error(source, None)
            try:
                while (line := await _line(process.stdout)) is not None:
                    self.feed(source, [line])
            finally:
                with contextlib.suppress(OSError):
                    os.killpg(process.pid, signal.SIGKILL)  # and anything it started that holds the pipe
                await process.wait()
            self._error(source, f"journalctl ended (exit {process.returncode})")
            await asyncio.sleep(self.interval_s)


    async def _follow_container(self, source: str) -> None:
        """A container's log through the engine, from now; again, from where it left off, once the
        container (or the one that replaced it under its name) runs again."""
        if self.docker_socket is None:
            self._error(source, "no Docker engine socket configured")
            return
        name = source.partition(":")[2]
        client = http.client(socket_path=str(self.docker_socket), headers={"User-Agent": "gpumedic-node-sampler"})
        since = time.time()
        try:
            while True:
                target = f"http://docker/containers/{name}/logs?follow=1&stdout=1&stderr=1&tail=0&since={since:.6f}"
                try:
                    async with http.stream(client, target, error=LogSourceError) as (status, headers, pieces):
                        if status != 200:
                            raise LogSourceError("no such container" if status == 404 else f"the engine answers HTTP {status}")
                        self._error(source, None)
                        tail = LogTail(MAX_CONTAINER_LINES, multiplexed="raw-stream" not in headers.get("content-type", ""))
                        async for piece in pieces:
                            tail.feed(piece)
                            if lines := tail.take():
                                self.feed(source, lines)
                    self._error(source, "the container stopped; followed again when it runs")
                except (OSError, TimeoutError, LogSourceError) as exc:
                    self._error(source, str(exc) or type(exc).__name__)
                since = time.time()
                await asyncio.sleep(self.interval_s)
        finally:
            await client.aclose()


class LogSourceError(Exception):
    """A log source answered something that cannot be read; the message says why."""


async def _line(stream: asyncio.StreamReader | None) -> str | None:
    """The next line, None at the end; a line longer than MAX_LINE is dropped ('')."""
    if stream is None:
        return None
    try:
        data = await stream.readline()
    except ValueError:  # longer than the limit: the reader dropped it
        return ""
    return data.decode("utf-8", "replace").rstrip("\n") if data else None
