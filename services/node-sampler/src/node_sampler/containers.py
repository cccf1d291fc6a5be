"""Container exits, from the node's Docker engine: its event stream over the engine's unix socket.

`DockerWatcher.run()` follows `GET /events` (container events only). On `die` it asks the engine
how the container ended (`GET /containers/{id}/json`) and for its last log lines, and hands a
`ContainerExitReading` to `on_exit`; `create`/`start`/`destroy` keep a set of the node's
containers, which `exists()` answers from (so the sampler can tell whether the container an OOM
kill names is still there). A node without an engine is normal: that is logged once and the
socket is checked again quietly, since an engine may start later.

The engine is trusted no more than any other input: a line that is not JSON, an exit code that
is not a number, log lines with control characters or invalid UTF-8, names too long for the
event are each skipped or cleaned, and `run()` never raises except when cancelled.

HTTP goes through httpx over the unix socket (`node_sampler.http`), made once the socket is
there: a deadline on every request but the event stream itself, which may idle for hours.
Paths are unversioned, which every engine serves as its own current API version.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping
from datetime import UTC, datetime
from typing import Any
from urllib.parse import quote

from node_sampler import http
from node_sampler.docker_logs import LogTail
from node_sampler.immediate import ContainerExitReading
from node_sampler.readings import clean_text

log = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/docker.sock"
MAX_LOG_LINES = 50
MAX_ID = 128
MAX_NAME = 256
MAX_IMAGE = 512
"""ContainerExited's limits on last_log_lines, container_id, name and image."""

MAX_JSON_BYTES = 32 * 1024 * 1024
MAX_EVENT_BYTES = 1024 * 1024
MAX_LOG_BYTES = 16 * 1024 * 1024
"""More than this from `logs?tail=N` is not a tail; the rest is not read."""
MAX_DIE_TASKS = 64
"""Exits being looked up at once; beyond this an exit is reported from its event alone."""
_SEEN_EVENTS = 512

_EVENT_ID = re.compile(r"[0-9a-f]{12,128}")
_LOOKUP_ID = re.compile(r"[0-9a-f]{12,64}")
_INT = re.compile(r"-?[0-9]{1,10}")
_TIMESTAMP = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|[+-]\d\d:\d\d)")
_URL = "http://docker"
"""The engine's base URL: the host part only fills the Host header; the socket is the address."""
_HEADERS = {"User-Agent": "gpumedic-node-sampler", "Accept": "application/json"}
_EVENTS_TARGET = "/events?filters=" + quote(json.dumps({"type": ["container"]}, separators=(",", ":")), safe="")


MAX_ERROR_BYTES = 4096
"""Of an engine's error answer to a log read (its JSON `message`)."""


class DockerError(Exception):
    """The engine's answer could not be used; the message says why."""


class LogsRefused(DockerError):
    """The engine answered the log read with an error status: it cannot give this container's log."""


class DockerWatcher:
    """Follows the Docker engine at `socket_path`; see the module docstring.

    `on_exit` is called on the event loop with each container exit (None: only track which
    containers exist). `log_lines` (at most 50) is how many last log lines an exit carries.
    `refresh_s`: how often the container list is reloaded besides following events;
    `retry_s`: how often a missing engine is looked for, and the longest reconnect back-off;
    `backoff_s`: the first reconnect delay after a stream broke; `timeout_s`: per request.
    """

    def __init__(
        self,
        socket_path: str | os.PathLike[str] = DEFAULT_SOCKET,
        on_exit: Callable[[ContainerExitReading], None] | None = None,
        *,
        log_lines: int = MAX_LOG_LINES,
        refresh_s: float = 30.0,
        retry_s: float = 30.0,
        backoff_s: float = 0.5,
        timeout_s: float = 5.0,
    ) -> None:
        self.socket_path = os.fspath(socket_path)
        self.on_exit = on_exit
        self.log_lines = max(0, min(int(log_lines), MAX_LOG_LINES))
        self.refresh_s = refresh_s
        self.retry_s = retry_s
        self.backoff_s = min(backoff_s, retry_s)
        self.timeout_s = timeout_s
        self._known: set[str] | None = None
        self._pending: list[tuple[str, str]] | None = None
        """Container adds/removes seen while the list reloads, replayed onto the new list."""
        self._oom: dict[str, None] = {}
        self._signalled: dict[str, str] = {}
        """Containers the engine sent a signal (docker stop, kill, restart) with no `die` yet: cid -> signal."""
        """Containers with an `oom` event and no `die` yet (oldest first, bounded)."""
        self._seen: dict[tuple[str, str, int], None] = {}
        """Recent events, to drop the ones replayed by `since` after a reconnect."""
        self._last_nano: int = time.time_ns()
        """Where the next connection's replay (`since`) starts: the newest event seen, or when the
        watcher was made (an exit while the engine is slow to answer the first time is not missed)."""
        self._tasks: set[asyncio.Task[None]] = set()
        self._up = False
        """The current connection got as far as a container list."""
        self._ever_up = False
        self._quiet = False
        """An outage has been logged; the next line is the one saying the engine is back."""
        self._http: Any = None
        """The HTTP client, made once the socket exists (a node without an engine never needs one)."""

    # --- what the sampler asks --------------------------------------------------------------

    @property
    def connected(self) -> bool:
        """Following the engine's events right now, with a current container list."""
        return self._known is not None

    def exists(self, container_id: str) -> bool | None:
        """Whether the engine has this container (full id, or a prefix of 12+ hex characters),
        in any state; None while the engine is off or its list could not be read. An id that
        is not 12 to 64 hex characters names no container: False."""
        known = self._known
        if known is None:
            return None
        cid = container_id.strip().lower()
        if not _LOOKUP_ID.fullmatch(cid):
            return False
        if len(cid) == 64:
            return cid in known
        return any(k.startswith(cid) for k in known)

    async def run(self) -> None:
        """Follow the engine until cancelled; reconnects, and waits for a missing engine."""
        loop = asyncio.get_running_loop()
        delay = self.backoff_s
        try:
            while True:
                self._up = False
                started = loop.time()
                try:
                    await self._session()
                    why = "event stream ended"
                except Exception as exc:
                    why = _describe(exc)
                    if not self._up:
                        self._off(exc)
                self._known = None
                self._pending = None
                if self._up:
                    self._quiet = True
                    log.warning("container events: stream from %s broke (%s); reconnecting", self.socket_path, why)
                    if loop.time() - started >= self.retry_s:
                        delay = self.backoff_s
                if self._ever_up:
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, self.retry_s)
                else:
                    await asyncio.sleep(self.retry_s)
        finally:
            for task in list(self._tasks):
                task.cancel()
            if self._http is not None:
                await self._http.aclose()
                self._http = None

    # --- one connection's life --------------------------------------------------------------

    async def _session(self) -> None:
        """Ping, open the event stream, load the list, follow events until the stream ends.
        The stream is opened before the list is read, so nothing happens unseen in between."""
        if self._http is None:
            os.stat(self.socket_path)  # no engine (FileNotFoundError) or no right to it: said by _off
            self._http = http.client(socket_path=self.socket_path, headers=_HEADERS)
        status, _headers, _body = await self._get("/_ping", max_bytes=1024)
        if status != 200:
            raise DockerError(f"/_ping: HTTP {status}")
        # events since the last one seen (or since the watcher was made), so neither a cut stream
        # nor a slow first connection loses what the engine still holds
        target = _EVENTS_TARGET + f"&since={self._last_nano // 10**9}.{self._last_nano % 10**9:09d}"
        async with contextlib.AsyncExitStack() as stack:
            async with asyncio.timeout(self.timeout_s):
                status, _headers, pieces = await stack.enter_async_context(http.stream(self._http, _URL + target, error=DockerError))
            if status != 200:
                raise DockerError(f"/events: HTTP {status}")
            async with asyncio.timeout(self.timeout_s):
                known = await self._list()
            self._known = known
            self._up = True
            if not self._ever_up or self._quiet:
                log.info("container events on: Docker engine at %s", self.socket_path)
            self._ever_up = True
            self._quiet = False
            refresher = asyncio.create_task(self._refresh_forever())
            try:
                await self._follow(pieces)
            finally:
                refresher.cancel()
                await asyncio.wait([refresher])

    def _off(self, exc: Exception) -> None:
        if self._quiet:
            log.debug("container events: Docker engine at %s still off (%s)", self.socket_path, _describe(exc))
            return
        self._quiet = True
        if self._ever_up:
            log.warning("container events off: Docker engine at %s does not answer (%s)", self.socket_path, _describe(exc))
        elif isinstance(exc, FileNotFoundError | ConnectionRefusedError):
            log.info("container events off: no Docker engine at %s", self.socket_path)
        elif isinstance(exc, PermissionError):
            log.info("container events off: no permission to use the Docker engine at %s", self.socket_path)
        else:
            log.info("container events off: Docker engine at %s unusable (%s)", self.socket_path, _describe(exc))

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.refresh_s)
            self._pending = []
            try:
                async with asyncio.timeout(self.timeout_s):
                    known = await self._list()
            except Exception as exc:
                log.debug("container events: list from %s unread (%s)", self.socket_path, _describe(exc))
                self._known = None  # cannot tell until the next reload works
                self._pending = None
                continue
            for action, cid in self._pending:
                _apply(known, action, cid)
            self._pending = None
            self._known = known

    async def _list(self) -> set[str]:
        status, _headers, body = await self._get("/containers/json?all=1", max_bytes=MAX_JSON_BYTES)
        if status != 200:
            raise DockerError(f"container list: HTTP {status}")
        document = _json(body)
        if not isinstance(document, list):
            raise DockerError("container list is not a JSON list")
        ids = set()
        for item in document:
            cid = item.get("Id") if isinstance(item, dict) else None
            if isinstance(cid, str) and _EVENT_ID.fullmatch(cid.lower()):
                ids.add(cid.lower())
        return ids

    async def _follow(self, pieces: AsyncIterator[bytes]) -> None:
        """Handle each event line until the stream ends; one bad line is skipped."""
        partial = bytearray()
        skipping = False
        async with contextlib.aclosing(pieces):
            async for piece in pieces:
                start = 0
                while (end := piece.find(b"\n", start)) >= 0:
                    segment = piece[start:end]
                    start = end + 1
                    if skipping:
                        skipping = False
                        continue
                    line = bytes(partial) + segment
                    partial.clear()
                    if line.strip():
                        self._line(line)
                if not skipping:
                    partial += piece[start:]
                    if len(partial) > MAX_EVENT_BYTES:
                        log.warning("container events: skipped an event longer than %d bytes", MAX_EVENT_BYTES)
                        partial.clear()
                        skipping = True
        if partial.strip() and not skipping:
            self._line(bytes(partial))

    # --- events -------------------------------------------------------------------------------

    def _line(self, line: bytes) -> None:
        try:
            document = json.loads(line)
        except (ValueError, RecursionError):
            log.warning("container events: skipped a line that is not JSON: %s", _clip(line))
            return
        if not isinstance(document, dict):
            log.warning("container events: skipped a line that is not an event object: %s", _clip(line))
            return
        try:
            self._event(document)
        except Exception:
            log.exception("container events: could not handle %s", _clip(line))

    def _event(self, doc: dict[str, Any]) -> None:
        kind = doc.get("Type", "container")
        if kind != "container":
            return
        actor = doc.get("Actor") if isinstance(doc.get("Actor"), dict) else {}
        attributes = actor.get("Attributes") if isinstance(actor.get("Attributes"), dict) else {}
        action = doc.get("Action", doc.get("status"))
        cid = actor.get("ID", doc.get("id"))
        if not isinstance(action, str) or not isinstance(cid, str) or not _EVENT_ID.fullmatch(cid.lower()):
            log.warning("container events: skipped an event without a usable Action and container ID")
            return
        action = action.split(":", 1)[0].strip()  # "exec_start: sh", "health_status: healthy"
        cid = cid.lower()
        nano = _event_nano(doc)
        if nano is not None:
            key = (action, cid, nano)
            if key in self._seen:
                return  # replayed after a reconnect
            self._seen[key] = None
            if len(self._seen) > _SEEN_EVENTS:
                del self._seen[next(iter(self._seen))]
            self._last_nano = max(self._last_nano, nano)
        if action in ("create", "start", "destroy"):
            if self._known is not None:
                _apply(self._known, action, cid)
            if self._pending is not None:
                self._pending.append((action, cid))
            if action == "destroy":
                self._oom.pop(cid, None)
                self._signalled.pop(cid, None)
        elif action == "oom":
            self._oom[cid] = None
            if len(self._oom) > _SEEN_EVENTS:
                del self._oom[next(iter(self._oom))]
        elif action == "kill":
            self._signalled[cid] = signal_name(attributes.get("signal"))
            if len(self._signalled) > _SEEN_EVENTS:
                del self._signalled[next(iter(self._signalled))]
        elif action == "die" and self.on_exit is not None:
            oom_event = self._oom.pop(cid, False) is None
            attributes = {**attributes, "_engine_signal": self._signalled.pop(cid, None)}
            if len(self._tasks) >= MAX_DIE_TASKS:
                log.warning("container events: %d exits being looked up; %s reported from its event", len(self._tasks), cid[:12])
                self._deliver(_reading(cid, attributes, nano, oom_event, None, ()))
                return
            task = asyncio.create_task(self._exited(cid, attributes, nano, oom_event))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _exited(self, cid: str, attributes: dict[str, Any], nano: int | None, oom_event: bool) -> None:
        """Look up how the container ended (it may already be gone: `docker run --rm`)."""
        inspected: dict[str, Any] | None = None
        lines: tuple[str, ...] = ()
        lost: str | None = None
        """Why its log is gone (the runbook's "container logs are empty after death"); not a read that timed out."""
        try:
            async with asyncio.timeout(self.timeout_s):
                status, _headers, body = await self._get(f"/containers/{quote(cid, safe='')}/json", max_bytes=MAX_JSON_BYTES)
            if status == 200:
                document = _json(body)
                inspected = document if isinstance(document, dict) else None
            else:
                log.debug("container %s: inspect answered HTTP %d (removed already?)", cid[:12], status)
                if status == 404 and self.log_lines:
                    lost = "the engine had removed the container before its log could be read (docker run --rm, or removed at once)"
        except Exception as exc:
            log.debug("container %s: inspect failed (%s)", cid[:12], _describe(exc))
        if inspected is not None and self.log_lines:
            config = inspected.get("Config") if isinstance(inspected.get("Config"), dict) else {}
            try:
                async with asyncio.timeout(self.timeout_s):
                    lines = await self._logs(cid, tty=config.get("Tty") is True)
            except LogsRefused as exc:
                lost = f"the engine cannot give its log ({_log_driver(inspected)} logging driver: {exc})"
            except Exception as exc:
                log.debug("container %s: logs unread (%s)", cid[:12], _describe(exc))
        self._deliver(_reading(cid, attributes, nano, oom_event, inspected, lines, lost))

    def _deliver(self, reading: ContainerExitReading | None) -> None:
        if reading is None or self.on_exit is None:
            return
        try:
            self.on_exit(reading)
        except Exception:
            log.exception("container events: on_exit failed for %s", reading.container_id[:12])

    async def _logs(self, cid: str, *, tty: bool) -> tuple[str, ...]:
        # twice the lines wanted: the blank and control-only ones are dropped, the rest cut to the last N
        target = f"/containers/{quote(cid, safe='')}/logs?stdout=1&stderr=1&tail={2 * self.log_lines}"
        async with http.stream(self._http, _URL + target, error=DockerError) as (status, headers, pieces):
            if status != 200:
                message = b""
                async with contextlib.aclosing(pieces):
                    async for piece in pieces:  # an engine's error is a short JSON object: 4 KiB at most is read
                        message += piece[: MAX_ERROR_BYTES - len(message)]
                        if len(message) >= MAX_ERROR_BYTES:
                            break
                try:
                    said = json.loads(message)
                except (ValueError, RecursionError):
                    said = None  # an answer that is no JSON error says only its status
                why = said.get("message") if isinstance(said, dict) and isinstance(said.get("message"), str) else ""
                raise LogsRefused(f"HTTP {status}" + (f", {clean_text(why, 160)}" if why else ""))
            content_type = headers.get("content-type", "")
            if "multiplexed-stream" in content_type:
                tty = False
            elif "raw-stream" in content_type:
                tty = True
            tail = LogTail(self.log_lines, multiplexed=not tty)
            read = 0
            async with contextlib.aclosing(pieces):
                async for piece in pieces:
                    tail.feed(piece)
                    read += len(piece)
                    if read > MAX_LOG_BYTES:
                        break
            return tail.lines()

    async def _get(self, target: str, *, max_bytes: int) -> tuple[int, Mapping[str, str], bytes]:
        async with asyncio.timeout(self.timeout_s):
            try:
                return await http.get(self._http, _URL + target, max_bytes=max_bytes, error=DockerError)
            except DockerError as exc:
                raise DockerError(f"{target.split('?')[0]}: {exc}") from None


def parse_engine_time(value: Any) -> datetime | None:
    """An engine timestamp (RFC 3339, nanoseconds) as an aware datetime; None for the zero
    time ("0001-01-01T00:00:00Z", never finished) or anything unparseable."""
    if not isinstance(value, str):
        return None
    match = _TIMESTAMP.fullmatch(value.strip())
    if match is None:
        return None
    base, fraction, zone = match.groups()
    text = base + ("." + (fraction + "000000")[:6] if fraction else "") + ("+00:00" if zone == "Z" else zone)
    try:
        parsed = datetime.fromisoformat(text)
    except ValueError:
        return None
    if parsed.year <= 1:
        return None
    return parsed.astimezone(UTC)


def _reading(
    cid: str,
    attributes: dict[str, Any],
    nano: int | None,
    oom_event: bool,
    inspected: dict[str, Any] | None,
    lines: tuple[str, ...],
    logs_lost: str | None = None,
) -> ContainerExitReading | None:
    """The exit, from the `die` event and, when the engine still had it, its inspect answer."""
    exit_code = _as_int(attributes.get("exitCode"))
    name = attributes.get("name")
    image = attributes.get("image")
    oom: bool | None = True if oom_event else None
    finished = _from_nano(nano) if nano is not None else None
    if inspected is not None:
        state = inspected.get("State") if isinstance(inspected.get("State"), dict) else {}
        config = inspected.get("Config") if isinstance(inspected.get("Config"), dict) else {}
        name = inspected.get("Name") or name
        image = config.get("Image") or image
        if state.get("Running") is not True:
            # a container restarted since (restart policy) shows its new run, not this exit
            if exit_code is None:
                exit_code = _as_int(state.get("ExitCode"))
            if isinstance(state.get("OOMKilled"), bool):
                oom = state["OOMKilled"] or oom_event
            finished = parse_engine_time(state.get("FinishedAt")) or finished
    if exit_code is None:
        log.warning(
            "container events: exit of %s skipped, its exit code is not an integer (%s)",
            cid[:12],
            _clip(str(attributes.get("exitCode"))),
        )
        return None
    return ContainerExitReading(
        container_id=cid[:MAX_ID],
        exit_code=exit_code,
        name=clean_text(name, MAX_NAME + 1).lstrip("/")[:MAX_NAME] if isinstance(name, str) else "",
        image=clean_text(image, MAX_IMAGE) if isinstance(image, str) else "",
        oom_killed=oom,
        finished_at=finished,
        last_log_lines=lines,
        engine_signal=attributes.get("_engine_signal"),
        logs_lost=logs_lost,
    )


def _log_driver(inspected: dict[str, Any]) -> str:
    """The container's logging driver as its inspect answer names it (HostConfig.LogConfig.Type)."""
    host = inspected.get("HostConfig") if isinstance(inspected.get("HostConfig"), dict) else {}
    config = host.get("LogConfig") if isinstance(host.get("LogConfig"), dict) else {}
    driver = config.get("Type")
    return clean_text(driver, 32) if isinstance(driver, str) and driver else "its"


def signal_name(value: Any) -> str:
    """The engine's `signal` attribute ("15", "SIGTERM", "TERM") as a signal name: SIGTERM."""
    text = str(value or "").strip().upper()
    if text.isdigit():
        try:
            return signal.Signals(int(text)).name
        except ValueError:
            return f"signal {text}"
    if not text:
        return "unknown"
    return text if text.startswith("SIG") else f"SIG{text}"[:16]


def _apply(known: set[str], action: str, cid: str) -> None:
    if action == "destroy":
        known.discard(cid)
    else:
        known.add(cid)


def _from_nano(nano: int) -> datetime | None:
    try:
        return datetime.fromtimestamp(nano // 10**9, UTC).replace(microsecond=nano % 10**9 // 1000)
    except (OverflowError, OSError, ValueError):
        return None


def _event_nano(doc: dict[str, Any]) -> int | None:
    nano = doc.get("timeNano")
    if isinstance(nano, int) and not isinstance(nano, bool) and nano > 0:
        return nano
    seconds = doc.get("time")
    if isinstance(seconds, int) and not isinstance(seconds, bool) and seconds > 0:
        return seconds * 10**9
    return None


def _as_int(value: Any) -> int | None:
    """An exit code: an integer, or a string of one (event attributes are strings)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value if abs(value) < 2**32 else None
    if isinstance(value, str) and _INT.fullmatch(value.strip()):
        return int(value)
    return None


def _json(body: bytes) -> Any:
    try:
        return json.loads(body)
    except (ValueError, RecursionError):
        raise DockerError("answer is not JSON") from None


def _clip(data: bytes | str, limit: int = 160) -> str:
    text = data.decode("utf-8", errors="replace") if isinstance(data, bytes) else data
    return repr(text[:limit]) + ("..." if len(text) > limit else "")


def _describe(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    if isinstance(exc, OSError) and exc.strerror:
        return f"{type(exc).__name__}: {exc.strerror}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
