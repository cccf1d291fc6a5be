"""The simulated node's Docker engine: the slice of the Engine HTTP API the node-sampler uses.

An asyncio HTTP/1.1 server on a unix socket, one request per connection, answering from
`EngineNode.containers` in the real engine's JSON shapes: `/_ping`, `/version`,
`/containers/json`, `/containers/{id}/json`, `/containers/{id}/logs` (multiplexed frames, or
raw for a container with a TTY; with `follow`, the lines logged from then on until it stops) and a streaming `/events` (chunked, one JSON object a line;
`since` replays the few recent events kept). Paths may carry an API version (`/v1.47/...`).

The simulation reports container changes through `EngineNode.container_listeners`, possibly
from another thread; each is handed to the loop and written to every open event stream. An
`oom` event precedes the `die` of an OOM-killed container, as with the real engine. Hundreds
of nodes run one of these in a process, so it keeps nothing but open streams and a short
event history.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hashlib
import json
import logging
import random
import re
import time
from datetime import UTC, datetime
from pathlib import Path
from collections.abc import Callable
from typing import Any, Protocol
from urllib.parse import parse_qs, unquote, urlsplit

from gpumedic_sim.machine.parts import SimContainer, SimProcess

log = logging.getLogger(__name__)

API_VERSION = "1.47"
ENGINE_VERSION = "27.3.1"
_HISTORY = 64
_READ_TIMEOUT_S = 5.0
_CHUNK = 4096
_FOLLOW_EVERY_S = 0.2
"""How often a followed log looks for new lines."""
_ZERO_TIME = "0001-01-01T00:00:00Z"
_VERSIONED = re.compile(r"/v1\.\d+(/.*)")
_CONTAINER_PATH = re.compile(r"/containers/([^/]+)/(json|logs)")
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed", 501: "Not Implemented"}


def new_container_id(rng: random.Random) -> str:
    """A container id as the engine makes them: 64 hex characters."""
    return f"{rng.getrandbits(256):064x}"


class EngineNode(Protocol):
    """What the engine reads of its node (`NodeState`'s)."""

    node_id: str
    containers: dict[str, SimContainer]
    container_listeners: list[Callable[[str, SimContainer], None]]

    def live_processes(self, gpu: int | None = None) -> list[SimProcess]: ...


class SimDockerEngine:
    def __init__(self, node: EngineNode, socket_path: Path) -> None:
        self.node = node
        self.socket_path = Path(socket_path)
        self._server: asyncio.Server | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._streams: set[asyncio.StreamWriter] = set()
        self._history: collections.deque[dict[str, Any]] = collections.deque(maxlen=_HISTORY)
        self._started = datetime.now(UTC)

    async def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._server = await asyncio.start_unix_server(self._handle, path=str(self.socket_path))
        self.node.container_listeners.append(self._listener)

    async def stop(self) -> None:
        """Close the socket and every open connection, as an engine that stops."""
        with contextlib.suppress(ValueError):
            self.node.container_listeners.remove(self._listener)
        if self._server is None:
            return
        self._server.close()
        for writer in list(self._connections):
            writer.close()
        await self._server.wait_closed()
        self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.socket_path.unlink()

    def cut_event_streams(self) -> None:
        """Close the open `/events` streams but keep serving (a proxy that drops them)."""
        for writer in list(self._streams):
            self._streams.discard(writer)
            writer.close()

    # --- events ---------------------------------------------------------------------------

    def _listener(self, action: str, container: SimContainer) -> None:
        """Called by the simulation, from any thread: the event is built now, sent on the loop."""
        now = time.time_ns()
        events = []
        if action == "die" and container.engine_signal is not None:
            events.append(_event("kill", container, now))  # docker stop / kill: the engine sent a signal
        if action == "die" and container.oom_killed:
            events.append(_event("oom", container, now))
        events.append(_event(action, container, now))
        loop = self._loop
        if loop is None or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile
            loop.call_soon_threadsafe(self._publish, events)

    def _publish(self, events: list[dict[str, Any]]) -> None:
        for event in events:
            self._history.append(event)
            data = _chunk(json.dumps(event).encode() + b"\n")
            for writer in list(self._streams):
                if writer.is_closing():
                    self._streams.discard(writer)
                else:
                    writer.write(data)

    async def _events(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, query: dict) -> None:
        try:
            filters = json.loads(_param(query, "filters") or "{}")
        except ValueError:
            filters = None
        if not isinstance(filters, dict):
            writer.write(_json(400, {"message": "invalid filter"}))
            return
        types = filters.get("type") or ["container"]
        wanted = "container" in types  # a list, or {"container": true} from old clients
        since = _since_ns(_param(query, "since"))
        writer.write(_head(200, "application/json", chunked=True))
        if wanted:
            if since is not None:
                for event in self._history:
                    if event["timeNano"] >= since:
                        writer.write(_chunk(json.dumps(event).encode() + b"\n"))
            self._streams.add(writer)
        try:
            await reader.read()  # until the client goes, or the stream is closed here
        finally:
            self._streams.discard(writer)

    # --- requests -------------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        try:
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            request = head.decode("latin-1").split("\r\n", 1)[0].split()
            if len(request) != 3:
                writer.write(_json(400, {"message": "bad request"}))
                return
            method, target = request[0], urlsplit(request[1])
            path = unquote(target.path)
            if match := _VERSIONED.fullmatch(path):
                path = match.group(1)
            query = parse_qs(target.query)
            if method == "HEAD" and path == "/_ping":
                writer.write(_head(200, "text/plain; charset=utf-8", length=0))
            elif method != "GET":
                writer.write(_json(405, {"message": f"{method} not allowed"}))
            elif path == "/_ping":
                writer.write(_head(200, "text/plain; charset=utf-8", length=2) + b"OK")
            elif path == "/version":
                writer.write(_json(200, _version()))
            elif path == "/containers/json":
                everything = _flag(query, "all")
                listed = [self._summary(c) for c in self._containers() if everything or c.running]
                writer.write(_json(200, listed))
            elif path == "/events":
                await self._events(reader, writer, query)
            elif match := _CONTAINER_PATH.fullmatch(path):
                container = self._find(match.group(1))
                if container is None:
                    writer.write(_json(404, {"message": f"No such container: {match.group(1)}"}))
                elif match.group(2) == "json":
                    writer.write(_json(200, self._inspect(container)))
                elif _flag(query, "follow"):
                    await self._follow(reader, writer, container, query)
                else:
                    self._logs(writer, container, query)
            else:
                writer.write(_json(404, {"message": "page not found"}))
            await writer.drain()
        except (ConnectionError, OSError):
            log.debug("%s: docker client went away", self.node.node_id)
        finally:
            self._connections.discard(writer)
            writer.close()

    def _logs(self, writer: asyncio.StreamWriter, container: SimContainer, query: dict) -> None:
        stdout, stderr = _flag(query, "stdout"), _flag(query, "stderr")
        if not (stdout or stderr):
            writer.write(_json(400, {"message": "Bad parameters: you must choose at least one stream"}))
            return
        if container.log_driver == "none":  # moby's ErrReadLogsNotSupported, a NotImplemented error
            writer.write(_json(501, {"message": "configured logging driver does not support reading"}))
            return
        lines = list(container.logs) if stdout else []  # everything the sim logs is stdout
        tail = _param(query, "tail") or "all"
        if tail.isdigit():
            lines = lines[-int(tail) :] if int(tail) else []
        tty = _tty(container)
        body = bytearray()
        for line in lines:
            data = _bytes(line)
            data = data if data.endswith(b"\n") else data + b"\n"
            body += data if tty else b"\x01\0\0\0" + len(data).to_bytes(4, "big") + data
        content_type = "application/vnd.docker.raw-stream" if tty else "application/vnd.docker.multiplexed-stream"
        writer.write(_head(200, content_type, chunked=True))
        for i in range(0, len(body), _CHUNK):
            writer.write(_chunk(bytes(body[i : i + _CHUNK])))
        writer.write(b"0\r\n\r\n")

    async def _follow(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, container: SimContainer, query: dict) -> None:
        """`logs?follow=1&tail=0`: the lines the container logs from now on, as they come, until it
        stops (then the stream ends) or the client goes."""
        if not (_flag(query, "stdout") or _flag(query, "stderr")) or container.log_driver == "none":
            self._logs(writer, container, query)  # the same refusals
            return
        tty = _tty(container)
        writer.write(_head(200, "application/vnd.docker.raw-stream" if tty else "application/vnd.docker.multiplexed-stream", chunked=True))
        sent = len(container.logs)
        gone = asyncio.ensure_future(reader.read())
        try:
            while not gone.done():
                lines, sent = container.logs[sent:], len(container.logs)
                for line in lines:
                    data = _bytes(line)
                    data = data if data.endswith(b"\n") else data + b"\n"
                    writer.write(_chunk(data if tty else b"\x01\0\0\0" + len(data).to_bytes(4, "big") + data))
                if not container.running:
                    writer.write(b"0\r\n\r\n")
                    return
                await writer.drain()
                await asyncio.wait([gone], timeout=_FOLLOW_EVERY_S)
        finally:
            gone.cancel()

    # --- the engine's view of the containers -----------------------------------------------

    def _containers(self) -> list[SimContainer]:
        return list(self.node.containers.values())  # one C call: safe against other threads

    def _find(self, ref: str) -> SimContainer | None:
        """By id, name or unique id prefix, as the engine resolves them. A name is the newest
        container's: the engine keeps a name unique, and a job's next run takes its name."""
        containers = self._containers()
        for c in containers:
            if c.id == ref:
                return c
        for c in reversed(containers):
            if c.name == ref.lstrip("/"):
                return c
        matches = [c for c in containers if ref and c.id.startswith(ref)]
        return matches[0] if len(matches) == 1 else None

    def _summary(self, c: SimContainer) -> dict[str, Any]:
        return {
            "Id": c.id,
            "Names": [f"/{c.name}"],
            "Image": c.image,
            "ImageID": _image_id(c.image),
            "Command": "python -m selfplay",
            "Created": int(self._started.timestamp()),
            "Ports": [],
            "Labels": {},
            "State": "running" if c.running else "exited",
            "Status": "Up" if c.running else f"Exited ({c.exit_code or 0})",
            "HostConfig": {"NetworkMode": "host"},
            "Mounts": [],
        }

    def _inspect(self, c: SimContainer) -> dict[str, Any]:
        pid = next((p.pid for p in self.node.live_processes() if p.container_id == c.id), 0) if c.running else 0
        return {
            "Id": c.id,
            "Created": _rfc3339(self._started),
            "Path": "python",
            "Args": ["-m", "selfplay"],
            "State": {
                "Status": "running" if c.running else "exited",
                "Running": c.running,
                "Paused": False,
                "Restarting": False,
                "OOMKilled": c.oom_killed,
                "Dead": False,
                "Pid": pid,
                "ExitCode": 0 if c.running else (c.exit_code or 0),
                "Error": "",
                "StartedAt": _rfc3339(self._started),
                "FinishedAt": _rfc3339(c.finished_at) if c.finished_at and not c.running else _ZERO_TIME,
            },
            "Image": _image_id(c.image),
            "Name": f"/{c.name}",
            "RestartCount": 0,
            "Driver": "overlay2",
            "Platform": "linux",
            "Config": {"Hostname": c.id[:12], "Image": c.image, "Tty": _tty(c), "Labels": {}},
            "HostConfig": {"NetworkMode": "host", "LogConfig": {"Type": c.log_driver, "Config": {}}},
        }


def _event(action: str, c: SimContainer, now_ns: int) -> dict[str, Any]:
    attributes = {"image": c.image, "name": c.name}
    if action == "die":
        attributes["exitCode"] = str(c.exit_code or 0)
    if action == "kill":
        attributes["signal"] = str(c.engine_signal)
    return {
        "Type": "container",
        "Action": action,
        "Actor": {"ID": c.id, "Attributes": attributes},
        "scope": "local",
        "time": now_ns // 10**9,
        "timeNano": now_ns,
    }


def _tty(c: SimContainer) -> bool:
    # SimContainer has no TTY field; a scenario (or test) may set one on the instance
    return getattr(c, "tty", False) is True


def _bytes(line: str | bytes) -> bytes:
    if isinstance(line, bytes):
        return line
    try:
        return line.encode("utf-8", "surrogateescape")  # "\udcff" stands for the raw byte 0xff
    except UnicodeEncodeError:
        return line.encode("utf-8", "replace")


def _version() -> dict[str, Any]:
    return {
        "Version": ENGINE_VERSION,
        "ApiVersion": API_VERSION,
        "MinAPIVersion": "1.24",
        "Os": "linux",
        "Arch": "amd64",
        "KernelVersion": "6.8.0-simulated",
    }


def _image_id(image: str) -> str:
    return "sha256:" + hashlib.sha256(image.encode()).hexdigest()


def _rfc3339(at: datetime) -> str:
    """As Go's RFC3339Nano: UTC, nanoseconds with trailing zeros dropped."""
    at = at.astimezone(UTC) if at.tzinfo else at.replace(tzinfo=UTC)
    fraction = f"{at.microsecond:06d}000".rstrip("0")
    return at.strftime("%Y-%m-%dT%H:%M:%S") + (f".{fraction}" if fraction else "") + "Z"


def _since_ns(value: str | None) -> int | None:
    """`since` as Unix seconds with optional nanoseconds ("1700000000.000000001")."""
    if not value:
        return None
    seconds, _, nanos = value.partition(".")
    if not seconds.isdigit() or (nanos and not nanos.isdigit()):
        return None
    return int(seconds) * 10**9 + int((nanos + "000000000")[:9] or 0)


def _param(query: dict[str, list[str]], name: str) -> str | None:
    values = query.get(name)
    return values[0] if values else None


def _flag(query: dict[str, list[str]], name: str) -> bool:
    return (_param(query, name) or "").lower() not in ("", "0", "no", "false", "none")


def _chunk(data: bytes) -> bytes:
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def _head(status: int, content_type: str, *, length: int | None = None, chunked: bool = False) -> bytes:
    lines = [
        f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}",
        f"Api-Version: {API_VERSION}",
        f"Content-Type: {content_type}",
        "Docker-Experimental: false",
        "Ostype: linux",
        f"Server: Docker/{ENGINE_VERSION} (linux)",
        "Transfer-Encoding: chunked" if chunked else f"Content-Length: {length or 0}",
        "Connection: close",
    ]
    return ("\r\n".join(lines) + "\r\n\r\n").encode()


def _json(status: int, document: Any) -> bytes:
    body = json.dumps(document).encode() + b"\n"
    return _head(status, "application/json", length=len(body)) + body
