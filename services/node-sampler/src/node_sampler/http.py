"""The one piece of HTTP/1.1 both of the sampler's small clients need (the status probe over TCP,
the Docker watcher over a unix socket): reading a response's status line and headers."""

from __future__ import annotations

import asyncio


async def read_head(reader: asyncio.StreamReader, error: type[Exception]) -> tuple[int, dict[str, str]]:
    """(status, lower-cased headers); raises `error` saying what was wrong with the answer."""
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError:
        raise error("connection closed before an HTTP answer") from None
    except asyncio.LimitOverrunError:
        raise error("HTTP header too large") from None
    lines = head.decode("latin-1").split("\r\n")
    status_line = lines[0].split(" ", 2)
    if len(status_line) < 2 or not status_line[0].startswith("HTTP/") or not status_line[1].isdigit():
        raise error("not an HTTP answer")
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    return int(status_line[1]), headers
