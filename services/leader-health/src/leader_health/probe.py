"""A minimal HTTP GET of a peer's JSON status, with a hard timeout.

A node whose port accepts TCP but whose HTTP never answers is exactly what this must catch,
so the whole exchange (connect, request, answer) shares one deadline.
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_ANSWER_BYTES = 1024 * 1024


@dataclass(frozen=True)
class PeerAnswer:
    url: str
    status: dict | None
    error: str | None = None


async def probe(url: str, timeout_s: float) -> PeerAnswer:
    try:
        return PeerAnswer(url, await asyncio.wait_for(_get_json(url), timeout_s))
    except TimeoutError:
        return PeerAnswer(url, None, f"no answer within {timeout_s:.1f}s")
    except (OSError, ValueError) as exc:
        return PeerAnswer(url, None, f"{type(exc).__name__}: {exc}")


async def _get_json(url: str) -> dict:
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise ValueError(f"only http://host:port/path URLs are probed, not {url!r}")
    reader, writer = await asyncio.open_connection(parts.hostname, parts.port or 80)
    try:
        path = parts.path or "/"
        writer.write(f"GET {path} HTTP/1.1\r\nHost: {parts.netloc}\r\nConnection: close\r\nAccept: application/json\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read(MAX_ANSWER_BYTES + 1)
    finally:
        writer.close()
    head, _, body = raw.partition(b"\r\n\r\n")
    status_line = head.split(b"\r\n", 1)[0].decode(errors="replace")
    if " 200 " not in f"{status_line} ":
        raise ValueError(f"HTTP status {status_line!r}")
    value = json.loads(body)
    if not isinstance(value, dict):
        raise ValueError("the status answer is not a JSON object")
    return value
