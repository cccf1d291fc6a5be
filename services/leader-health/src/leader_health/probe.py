"""The layered probe of one peer: TCP, then `/health`, then `/status`, each with its own timeout.

The layers tell apart what the runbook tells apart by hand: a dead host (no TCP answer at all:
`unreachable`), a dead daemon on a live host (the connection is refused: `down`), and a daemon
whose event loop is blocked (the port accepts TCP, HTTP never answers: `blocked`). A `/health`
that answers with an error is `unhealthy`; a daemon without `/health` (404) is judged by
`/status` alone. Whatever `/status` says must parse: invalid JSON, a document the policy's
`peer_status` expressions do not fit (`leader_health.status`), an answer over `MAX_ANSWER_BYTES` and a redirect (never followed) are each a
`bad_answer` with the reason. Nothing a peer sends can raise out of `probe`. HTTP is httpx's
(chunked answers, keep-alive, a daemon's odd framing); the TCP layer is a plain connect.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal
from urllib.parse import urlsplit

import httpx

from leader_health.status import DEFAULT_READER, PeerStatus, StatusMismatch, StatusReader

MAX_ANSWER_BYTES = 1024 * 1024
PeerState = Literal["ok", "unreachable", "down", "blocked", "unhealthy", "bad_answer"]


@dataclass(frozen=True)
class PeerAnswer:
    url: str
    state: PeerState
    status: PeerStatus | None = None
    detail: str = ""
    took_ms: float = 0.0
    """How long its `/status` took to answer (what the runbook's `curl` times), else the whole probe."""


class _Refused(Exception):
    """A layer's verdict on the peer: its state and why."""

    def __init__(self, state: PeerState, detail: str) -> None:
        super().__init__(detail)
        self.state = state
        self.detail = detail


async def probe(
    url: str,
    *,
    connect_timeout_s: float,
    http_timeout_s: float,
    reader: StatusReader = DEFAULT_READER,
    client: httpx.AsyncClient | None = None,
) -> PeerAnswer:
    """One peer's answer. `client` is the round's HTTP client (one is made for this probe if none)."""
    started = time.monotonic()
    try:
        async with contextlib.AsyncExitStack() as stack:
            if client is None:
                client = await stack.enter_async_context(http_client(concurrency=1))
            status, status_ms = await _layers(url, connect_timeout_s, http_timeout_s, reader, client)
    except _Refused as verdict:
        return PeerAnswer(url, verdict.state, None, verdict.detail[:300], _ms(started))
    return PeerAnswer(url, "ok", status, "", status_ms)


async def probe_all(
    urls: Sequence[str], *, connect_timeout_s: float, http_timeout_s: float, concurrency: int, reader: StatusReader = DEFAULT_READER
) -> list[PeerAnswer]:
    """Every peer, at most `concurrency` at once, in the order given, through one HTTP client."""
    gate = asyncio.Semaphore(concurrency)
    async with http_client(concurrency=concurrency) as client:

        async def one(url: str) -> PeerAnswer:
            async with gate:
                return await probe(url, connect_timeout_s=connect_timeout_s, http_timeout_s=http_timeout_s, reader=reader, client=client)

        return list(await asyncio.gather(*(one(url) for url in urls)))


def http_client(*, concurrency: int) -> httpx.AsyncClient:
    """A plain-HTTP client for peers: no redirects followed, no proxy or netrc from the environment,
    no TLS set up (status URLs are http://), two connections per peer probed at once (its
    `/health` and `/status` are asked together)."""
    return httpx.AsyncClient(
        follow_redirects=False, trust_env=False, verify=False, headers={"Accept": "application/json"},
        limits=httpx.Limits(max_connections=2 * concurrency, max_keepalive_connections=2 * concurrency),
    )


async def _layers(
    url: str, connect_timeout_s: float, http_timeout_s: float, reader: StatusReader, client: httpx.AsyncClient,
) -> tuple[PeerStatus, float]:
    """The peer's status, and how long `/status` took to answer in ms."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise _Refused("bad_answer", f"only http://host:port/path status URLs are probed, not {url[:100]!r}")
    host, port = parts.hostname, parts.port or 80
    await _connect(host, port, connect_timeout_s)
    base = f"http://{parts.netloc}"

    async def timed_status() -> tuple[tuple[int, str, bytes], float]:
        asked = time.monotonic()
        answer = await _get(client, base, parts.path or "/", connect_timeout_s, http_timeout_s, query=parts.query)
        return answer, _ms(asked)

    # Both at once: a daemon whose event loop lags answers each late, and asked one after the other
    # its lag would be counted twice (reported at 12 s for a 6 s lag) and the round stretched as much.
    health = asyncio.ensure_future(_get(client, base, "/health", connect_timeout_s, http_timeout_s))
    status = asyncio.ensure_future(timed_status())
    try:
        code, _, _ = await health
        if code != 404 and not 200 <= code < 300:
            raise _Refused("unhealthy", f"/health answered HTTP {code}")
        (code, location, body), status_ms = await status
    finally:
        health.cancel()  # nothing for one already done
        status.cancel()
        # Each one's end taken (the verdict raised above is the one that counts); a cancellation
        # of this probe itself, even one that comes while they end, still goes through.
        await asyncio.gather(health, status, return_exceptions=True)
    if 300 <= code < 400:
        raise _Refused("bad_answer", f"/status redirects to {location[:100]!r}; redirects are not followed")
    if code != 200:
        raise _Refused("bad_answer", f"/status answered HTTP {code}")
    try:
        document = json.loads(body)
    except ValueError as exc:
        raise _Refused("bad_answer", f"/status is not JSON ({exc.msg} at byte {exc.pos})") from None
    try:
        return reader.read(document), status_ms
    except StatusMismatch as exc:
        raise _Refused("bad_answer", f"/status does not fit the policy's peer_status: {exc}") from None


async def _connect(host: str, port: int, timeout_s: float) -> None:
    """The TCP layer alone, so that a refused port (`down`) is told from a silent host (`unreachable`)."""
    try:
        _, writer = await asyncio.wait_for(asyncio.open_connection(host, port), timeout_s)
    except ConnectionRefusedError:
        raise _Refused("down", f"{host}:{port} refuses connections: the daemon is not listening") from None
    except TimeoutError:
        raise _Refused("unreachable", f"no TCP answer from {host}:{port} within {timeout_s:g}s: the host or its network is down") from None
    except OSError as exc:
        raise _Refused("unreachable", f"{host}:{port} unreachable ({exc.strerror or type(exc).__name__})") from None
    writer.close()


async def _get(
    client: httpx.AsyncClient, base: str, path: str, connect_timeout_s: float, timeout_s: float, *, query: str = ""
) -> tuple[int, str, bytes]:
    """(status code, Location, body) of one GET, whole within `timeout_s`; a silent server is `blocked`."""
    try:
        return await asyncio.wait_for(_exchange(client, base, path, query, connect_timeout_s, timeout_s), timeout_s)
    except (TimeoutError, httpx.TimeoutException):
        raise _Refused(
            "blocked", f"{path}: the port accepts TCP but HTTP does not answer within {timeout_s:g}s (a blocked event loop)"
        ) from None
    except httpx.ConnectError as exc:
        # the TCP layer just got in: the daemon went away since, or the host did
        cause: BaseException | None = exc
        while cause is not None and not isinstance(cause, ConnectionRefusedError):
            cause = cause.__cause__ or cause.__context__
        raise _Refused("down" if cause else "unreachable", f"{path}: the connection failed ({exc})"[:300]) from None
    except (httpx.RemoteProtocolError, httpx.DecodingError) as exc:
        raise _Refused("bad_answer", f"{path}: not an HTTP answer ({str(exc)[:80]})") from None
    except httpx.HTTPError as exc:  # a read or write error: the peer dropped the connection
        raise _Refused("bad_answer", f"{path}: the connection broke mid-answer ({type(exc).__name__})") from None


async def _exchange(
    client: httpx.AsyncClient, base: str, path: str, query: str, connect_timeout_s: float, timeout_s: float
) -> tuple[int, str, bytes]:
    timeout = httpx.Timeout(timeout_s, connect=connect_timeout_s)
    url = httpx.URL(base).copy_with(raw_path=(path + (f"?{query}" if query else "")).encode())
    async with client.stream("GET", url, timeout=timeout) as answer:
        body = bytearray()
        async for piece in answer.aiter_bytes():
            body += piece
            if len(body) > MAX_ANSWER_BYTES:
                raise _Refused("bad_answer", f"{path}: the answer is larger than {MAX_ANSWER_BYTES // 1024} KiB")
        return answer.status_code, answer.headers.get("location", ""), bytes(body)


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)
