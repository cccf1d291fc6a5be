"""The layered probe of one peer: TCP, then `/health`, then `/status`, each with its own timeout.

The layers tell apart what the runbook tells apart by hand: a dead host (no TCP answer at all:
`unreachable`), a dead daemon on a live host (the connection is refused: `down`), and a daemon
whose event loop is blocked (the port accepts TCP, HTTP never answers: `blocked`). A `/health`
that answers with an error is `unhealthy`; a daemon without `/health` (404) is judged by
`/status` alone. Whatever `/status` says must parse: invalid JSON, a document the policy's
`peer_status` expressions do not fit (`leader_health.status`), an answer over `MAX_ANSWER_BYTES` and a redirect (never followed) are each a
`bad_answer` with the reason. Nothing a peer sends can raise out of `probe`.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

from leader_health.status import DEFAULT_READER, PeerStatus, StatusMismatch, StatusReader

MAX_ANSWER_BYTES = 1024 * 1024
_HEAD_ROOM = 16 * 1024
"""Room for the status line and headers above the body's limit."""
PeerState = Literal["ok", "unreachable", "down", "blocked", "unhealthy", "bad_answer"]


@dataclass(frozen=True)
class PeerAnswer:
    url: str
    state: PeerState
    status: PeerStatus | None = None
    detail: str = ""
    took_ms: float = 0.0


class _Refused(Exception):
    """A layer's verdict on the peer: its state and why."""

    def __init__(self, state: PeerState, detail: str) -> None:
        super().__init__(detail)
        self.state = state
        self.detail = detail


async def probe(url: str, *, connect_timeout_s: float, http_timeout_s: float, reader: StatusReader = DEFAULT_READER) -> PeerAnswer:
    started = time.monotonic()
    try:
        status = await _layers(url, connect_timeout_s, http_timeout_s, reader)
    except _Refused as verdict:
        return PeerAnswer(url, verdict.state, None, verdict.detail[:300], _ms(started))
    return PeerAnswer(url, "ok", status, "", _ms(started))


async def probe_all(
    urls: Sequence[str], *, connect_timeout_s: float, http_timeout_s: float, concurrency: int, reader: StatusReader = DEFAULT_READER
) -> list[PeerAnswer]:
    """Every peer, at most `concurrency` at once, in the order given."""
    gate = asyncio.Semaphore(concurrency)

    async def one(url: str) -> PeerAnswer:
        async with gate:
            return await probe(url, connect_timeout_s=connect_timeout_s, http_timeout_s=http_timeout_s, reader=reader)

    return list(await asyncio.gather(*(one(url) for url in urls)))


async def _layers(url: str, connect_timeout_s: float, http_timeout_s: float, reader: StatusReader) -> PeerStatus:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise _Refused("bad_answer", f"only http://host:port/path status URLs are probed, not {url[:100]!r}")
    host, port = parts.hostname, parts.port or 80
    await _connect(host, port, connect_timeout_s)
    code, _, _ = await _get(host, port, parts.netloc, "/health", connect_timeout_s, http_timeout_s)
    if code != 404 and not 200 <= code < 300:
        raise _Refused("unhealthy", f"/health answered HTTP {code}")
    code, location, body = await _get(host, port, parts.netloc, parts.path or "/", connect_timeout_s, http_timeout_s)
    if 300 <= code < 400:
        raise _Refused("bad_answer", f"/status redirects to {location[:100]!r}; redirects are not followed")
    if code != 200:
        raise _Refused("bad_answer", f"/status answered HTTP {code}")
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise _Refused("bad_answer", f"/status is not JSON ({exc.msg} at byte {exc.pos})") from None
    try:
        return reader.read(document)
    except StatusMismatch as exc:
        raise _Refused("bad_answer", f"/status does not fit the policy's peer_status: {exc}") from None


async def _connect(host: str, port: int, timeout_s: float) -> None:
    _, writer = await _open(host, port, timeout_s)
    writer.close()


async def _open(host: str, port: int, timeout_s: float) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    try:
        return await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        raise _Refused("down", f"{host}:{port} refuses connections: the daemon is not listening") from None
    except TimeoutError:
        raise _Refused("unreachable", f"no TCP answer from {host}:{port} within {timeout_s:g}s: the host or its network is down") from None
    except OSError as exc:
        raise _Refused("unreachable", f"{host}:{port} unreachable ({exc.strerror or type(exc).__name__})") from None


async def _get(host: str, port: int, netloc: str, path: str, connect_timeout_s: float, timeout_s: float) -> tuple[int, str, bytes]:
    """(status code, Location, body) of one GET; a silent server is `blocked`."""
    try:
        return await asyncio.wait_for(_exchange(host, port, netloc, path, connect_timeout_s), timeout_s)
    except TimeoutError:
        raise _Refused(
            "blocked", f"{path}: the port accepts TCP but HTTP does not answer within {timeout_s:g}s (a blocked event loop)"
        ) from None
    except (ConnectionError, asyncio.IncompleteReadError) as exc:
        raise _Refused("bad_answer", f"{path}: the connection broke mid-answer ({type(exc).__name__})") from None


async def _exchange(host: str, port: int, netloc: str, path: str, connect_timeout_s: float) -> tuple[int, str, bytes]:
    reader, writer = await _open(host, port, connect_timeout_s)
    try:
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {netloc}\r\nConnection: close\r\nAccept: application/json\r\n\r\n".encode())
        await writer.drain()
        raw = b""
        while len(raw) <= MAX_ANSWER_BYTES + _HEAD_ROOM:  # the answer ends at EOF (Connection: close)
            chunk = await reader.read(64 * 1024)
            if not chunk:
                break
            raw += chunk
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    if len(body) > MAX_ANSWER_BYTES:
        raise _Refused("bad_answer", f"{path}: the answer is larger than {MAX_ANSWER_BYTES // 1024} KiB")
    lines = head.decode("latin-1").split("\r\n")
    words = lines[0].split()
    if len(words) < 2 or not words[0].startswith("HTTP/") or not words[1].isdigit():
        raise _Refused("bad_answer", f"{path}: not an HTTP answer ({lines[0][:60]!r})")
    location = next((line.split(":", 1)[1].strip() for line in lines[1:] if line.lower().startswith("location:")), "")
    return int(words[1]), location, body


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
