"""NCCL's RAS, asked on the node when a job's ranks here sit idle: which ranks does the job miss?

Since NCCL 2.24 every NCCL process runs a RAS thread; together they keep each other alive and
answer on the node's loopback (port 28028 unless NCCL_RAS_ADDR moves it) with a view of the whole
job: its communicators, and the ranks and processes that did not answer (unresponsive, or dead
after 60 s). That is the one place that can name a rank which stopped without exiting (a process
stopped or stuck in the kernel) while every other rank waits in the collective. The protocol
(NCCL's user guide, Troubleshooting, RAS, and its `ncclras` client) is text lines:
`CLIENT PROTOCOL 2` (answered `SERVER PROTOCOL n`), `SET FORMAT json` (answered OK from 2.28.7, an
ERROR line before, when the answer is text), then `VERBOSE STATUS`, whose answer ends when RAS
closes the connection. A hung job's answer may take seconds (RAS waits on the process that does
not answer), so it is asked in the background and its latest answer rides in the samples.

Only what ties a missing rank to a node is kept (its rank, communicator size, host, pid, GPU);
a value that is not a plain number or host is dropped. Asking is read-only, and only when a
tagged rank's GPU has idled for `after_s`, then every `every_s` while it stays idle.
"""

from __future__ import annotations

import asyncio
import json
import logging
import re
import time
from collections.abc import Awaitable, Callable, Mapping
from datetime import UTC, datetime
from typing import Any

from gpumedic_events import NcclRasAnswer, NodeSampled, RasRank
from gpumedic_events.node import RAS_HOST_PATTERN
from pydantic import ValidationError

log = logging.getLogger(__name__)

PORT = 28028
"""NCCL_RAS_ADDR's default port."""
PROTOCOL = 2
MAX_ANSWER_BYTES = 4 << 20
MAX_LISTED = 64

_HOST = re.compile(RAS_HOST_PATTERN)
_VERSION = re.compile(r"^NCCL version (\d+\.\d+\.\d+[0-9A-Za-z.+~-]*)")
_GROUP_ROW = re.compile(r"^\s*(\d+)\s+(\d+)\s+(\d+)\s+(\S+)\s+(\d+)\s+(\d+)\s+\S+\s+\S+\s*$")
_PROCESS = re.compile(r"^\s+Process (\d+) on node (\S+) managing GPUs? (\d+)")
_COMM = re.compile(r"^#(\d+)-\d+ \([0-9a-fA-F]+\) (\S+)")
_RANK = re.compile(r"^\s+Rank (\d+) -- (?:GPU (\d+)(?: \(NVML (\d+)\))? managed by process (\d+) on node (\S+))?")
_RANK_LIST = re.compile(r"^\s+The missing ranks?: ([\d, ]+)")
_RANK_COUNT = re.compile(r"^\s+Missing communicator data from (\d+) ranks?$")


class RasError(Exception):
    """RAS could not be asked, or answered what is not its output: the message says which."""


async def ask(host: str, port: int, timeout_s: float) -> NcclRasAnswer:
    """Ask the RAS listening on host:port for the job's status; an answer with `error` set when
    nothing could be learned (never raises for the node's sake)."""
    asked_at = datetime.now(UTC)
    try:
        output, text = await asyncio.wait_for(_converse(host, port), timeout_s)
    except TimeoutError:
        return _failed(asked_at, f"NCCL RAS on {host}:{port} did not answer within {timeout_s:.0f}s (the process holding "
                                 "its port may be stopped itself)")
    except ConnectionRefusedError:
        return _failed(asked_at, f"nothing listens on {host}:{port}: NCCL older than 2.24, RAS off (NCCL_RAS_ENABLE=0), "
                                 "NCCL_RAS_ADDR on another interface, or the sampler outside the jobs' network namespace")
    except (OSError, RasError) as e:
        return _failed(asked_at, f"NCCL RAS on {host}:{port}: {e}")
    try:
        return (parse_json if output == "json" else parse_text)(text, asked_at)
    except RasError as e:
        return _failed(asked_at, f"NCCL RAS on {host}:{port} answered what is not its {output} output: {e}")


async def _converse(host: str, port: int) -> tuple[str, str]:
    reader, writer = await asyncio.open_connection(host, port, limit=MAX_ANSWER_BYTES)
    try:
        greeting = await _say(reader, writer, f"CLIENT PROTOCOL {PROTOCOL}")
        if not greeting.upper().startswith("SERVER PROTOCOL "):
            raise RasError(f"it greeted with {greeting[:80]!r}, not SERVER PROTOCOL")
        output = "json" if (await _say(reader, writer, "SET FORMAT json")).upper() == "OK" else "text"
        writer.write(b"VERBOSE STATUS\n")
        await writer.drain()
        chunks, size = [], 0
        while chunk := await reader.read(1 << 16):  # until RAS closes the connection
            size += len(chunk)
            if size > MAX_ANSWER_BYTES:
                raise RasError(f"its answer exceeds {MAX_ANSWER_BYTES} bytes")
            chunks.append(chunk)
        return output, b"".join(chunks).decode("utf-8", "replace")
    finally:
        writer.close()
        try:
            await writer.wait_closed()
        except OSError:
            pass


async def _say(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, line: str) -> str:
    writer.write(line.encode() + b"\n")
    await writer.drain()
    answer = await reader.readline()
    if not answer:
        raise RasError("it closed the connection")
    return answer.decode("utf-8", "replace").strip()


def parse_json(text: str, asked_at: datetime) -> NcclRasAnswer:
    """RAS's JSON status (NCCL 2.28.7 and later): a rank in `missing_ranks` counts when it was
    unresponsive or is considered dead (the others are a communicator's set-up or tear-down)."""
    try:
        document = json.loads(text)
    except (ValueError, RecursionError) as e:
        raise RasError(f"not JSON ({e})") from None
    communicators = document.get("communicators") if isinstance(document, dict) else None
    if not isinstance(communicators, list):
        raise RasError("no communicators list")
    missing: list[RasRank] = []
    for communicator in communicators:
        if not isinstance(communicator, dict):
            continue
        size = _number(communicator.get("size"))
        for entry in communicator.get("missing_ranks") or ():
            if not isinstance(entry, dict):
                continue
            status = entry.get("status") if isinstance(entry.get("status"), dict) else {}
            if status.get("unresponsive") is True or status.get("considered_dead") is True:
                missing.append(_rank(entry.get("rank"), size, entry.get("host"), entry.get("pid"), entry.get("nvml_dev"),
                                     status.get("considered_dead") is True))
    return _answer(asked_at, _version(document.get("nccl_version")), "json", len(communicators), missing)


def parse_text(text: str, asked_at: datetime) -> NcclRasAnswer:
    """RAS's text status (NCCL 2.24 to 2.28): the missing ranks of each INCOMPLETE communicator
    (`Rank 21 -- GPU 5 managed by process 3487984 on node 172.16.64.213`, or before 2.27 `The
    missing rank: 21`), the size from the communicators' table, and the processes listed
    unresponsive or DEAD (where no rank was named, the process stands for it)."""
    lines = text.splitlines()
    found = next((m.group(1) for line in lines[:5] if (m := _VERSION.match(line))), None)
    version = _version(found)
    if found is None and not any(line.startswith(("Job summary", "Communicators")) for line in lines):
        raise RasError("neither a version line nor a job summary")
    sizes: dict[int, int] = {}
    """Per group of the communicators' table: the ranks each of its communicators has."""
    communicators = 0
    missing: list[RasRank] = []
    processes: list[tuple[RasRank, bool]] = []
    section, block, group, counted = "", "", None, 0
    for line in lines:
        if m := _GROUP_ROW.match(line):
            if section == "":
                sizes[int(m.group(1))] = int(m.group(5))
                communicators += int(m.group(2))
            continue
        if line in ("Errors", "Warnings"):
            section, block = line, ""
            continue
        if section != "Errors" or not line.strip() or set(line.strip()) == {"="}:
            continue
        if not line.startswith(" "):
            comm = _COMM.match(line)
            block, group = (comm.group(2), int(comm.group(1))) if comm else (line.strip(), None)
            continue
        if block in ("INCOMPLETE", "DEAD") and group is None and (m := _PROCESS.match(line)):
            processes.append((_rank(None, None, m.group(2), m.group(1), m.group(3), block == "DEAD"), block == "DEAD"))
        elif block == "INCOMPLETE" and group is not None:
            size = sizes.get(group)
            if m := _RANK_COUNT.match(line):
                counted += int(m.group(1))
            elif m := _RANK.match(line):
                gpu = m.group(3) or m.group(2)
                missing.append(_rank(m.group(1), size, m.group(5), m.group(4), gpu, False))
            elif m := _RANK_LIST.match(line):
                missing += [_rank(r, size, None, None, None, False) for r in re.findall(r"\d+", m.group(1))]
    dead = {(p.host, p.pid) for p, is_dead in processes if is_dead}
    missing = [r.model_copy(update={"dead": True}) if (r.host, r.pid) in dead and r.pid is not None else r for r in missing]
    named = {(r.host, r.pid) for r in missing if r.pid is not None}
    if len(processes) == 1 and len(missing) == 1 and missing[0].pid is None:
        process = processes[0][0]  # one rank missing, one process gone: the same one
        missing = [missing[0].model_copy(update={"host": process.host, "pid": process.pid, "gpu": process.gpu, "dead": process.dead})]
    elif not missing:
        missing = [p for p, _ in processes if (p.host, p.pid) not in named]
    return _answer(asked_at, version, "text", communicators if sizes else None, missing, counted)


def _answer(asked_at: datetime, version: str | None, output: str, communicators: int | None, missing: list[RasRank],
            counted: int = 0) -> NcclRasAnswer:
    """`counted`: the ranks its text said were missing, listed or not (it lists only a few unless asked verbosely)."""
    unique = list(dict.fromkeys(missing))
    return NcclRasAnswer(asked_at=asked_at, nccl_version=version, output=output, communicators=communicators,
                         missing=tuple(unique[:MAX_LISTED]), missing_count=max(len(unique), counted))


def _failed(asked_at: datetime, error: str) -> NcclRasAnswer:
    return NcclRasAnswer(asked_at=asked_at, error=error[:300])


def _rank(rank: Any, size: Any, host: Any, pid: Any, gpu: Any, dead: bool) -> RasRank:
    """A missing rank from RAS's values; one that is not a plain number or host is left out."""
    host = host if isinstance(host, str) and _HOST.fullmatch(host) else None
    values = {"rank": _number(rank), "communicator_size": _number(size), "host": host, "pid": _number(pid), "gpu": _number(gpu)}
    try:
        return RasRank(**values, dead=dead)
    except ValidationError as e:
        bad = {str(error["loc"][0]) for error in e.errors()}
        return RasRank(**{k: v for k, v in values.items() if k not in bad}, dead=dead)


def _number(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and value.isdigit() and len(value) <= 9:
        return int(value)
    return None


def _version(value: Any) -> str | None:
    return value if isinstance(value, str) and re.fullmatch(r"[0-9][0-9A-Za-z.+~-]{0,31}", value) else None


Ask = Callable[[str, int, float], Awaitable[NcclRasAnswer]]


class RasWatch:
    """When to ask RAS on this node, and its latest answer.

    A job's rank here whose GPU stays below `idle_below_pct` for `after_s` (every tagged rank on
    the node idle: one working rank means the node's part of the job goes on) starts a query, in
    the background, then one every `every_s` while that lasts. The answer rides in each sample
    until the ranks work again or leave."""

    def __init__(
        self,
        host: str = "127.0.0.1",
        port: int = PORT,
        *,
        after_s: float = 120.0,
        every_s: float = 60.0,
        timeout_s: float = 15.0,
        idle_below_pct: float = 5.0,
        ask: Ask = ask,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.host, self.port = host, port
        self.after_s, self.every_s, self.timeout_s, self.idle_below_pct = after_s, every_s, timeout_s, idle_below_pct
        self._ask = ask
        self._clock = clock
        self._idle_since: float | None = None
        self._asked_at: float | None = None
        self._query: asyncio.Task[NcclRasAnswer] | None = None
        self.answer: NcclRasAnswer | None = None

    def observe(self, sample: NodeSampled, ports: Mapping[int, int] | None = None) -> NodeSampled:
        """The sample with the latest answer in it, while the node's ranks idle; and a query started
        when one is due. `ports`: per pid, the port its job's NCCL_RAS_ADDR names (the lowest of the
        idle ranks' is asked; none: the configured one)."""
        now = self._clock()
        ranks = [(p.pid, gpu.utilization_gpu_pct) for gpu in sample.gpus for p in gpu.processes if p.job is not None]
        if not ranks or any(u is None or u >= self.idle_below_pct for _, u in ranks):
            if self._query is not None:
                self._query.cancel()  # asked about a hang that is over
            self._idle_since = self._asked_at = self.answer = self._query = None
            return sample
        self._idle_since = self._idle_since if self._idle_since is not None else now
        if self._query is not None and self._query.done():
            self.answer = None if self._query.cancelled() else self._answered(self._query)
            self._query = None
        due = now - self._idle_since >= self.after_s and (self._asked_at is None or now - self._asked_at >= self.every_s)
        if due and self._query is None:
            self._asked_at = now
            named = sorted({ports[pid] for pid, _ in ranks if pid in ports}) if ports else []
            self._query = asyncio.get_running_loop().create_task(self._ask(self.host, named[0] if named else self.port, self.timeout_s))
        return sample.model_copy(update={"nccl_ras": self.answer}) if self.answer is not None else sample

    def _answered(self, query: asyncio.Task[NcclRasAnswer]) -> NcclRasAnswer:
        if (failure := query.exception()) is not None:  # `ask` says what went wrong; anything else is a bug, never a lost sample
            log.error("asking NCCL's RAS failed: %r", failure)
            return _failed(datetime.now(UTC), f"asking NCCL's RAS failed: {type(failure).__name__}")
        return query.result()

    async def close(self) -> None:
        if self._query is not None:
            self._query.cancel()
            await asyncio.gather(self._query, return_exceptions=True)  # waits for its end; a cancellation of close itself goes through
