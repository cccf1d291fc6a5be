"""What the bus answers while it is away, and how to say so in one line.

A restarting nats-server, or a cluster electing the leader of a stream, consumer or bucket,
answers with these errors for a few seconds: they are retried, and logged as one line with the
reason ("no response from stream"), never as a traceback.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import TypeVar

import nats.errors
import nats.js.errors

BUS_AWAY = (
    nats.errors.TimeoutError,  # also asyncio's
    nats.errors.NoRespondersError,
    nats.errors.ConnectionClosedError,
    nats.errors.UnexpectedEOF,
    nats.js.errors.ServiceUnavailableError,
    nats.js.errors.NoStreamResponseError,
    TimeoutError,
)


def nats_reason(exc: BaseException) -> str:
    """What went wrong with the bus, in words ("connection refused", not a traceback)."""
    if isinstance(exc, OSError) and exc.errno:
        return os.strerror(exc.errno).lower()  # not asyncio's "Connect call failed (...)"
    return (str(exc).strip() or type(exc).__name__).removeprefix("nats: ")


T = TypeVar("T")


async def ride_out(call: Callable[[], Awaitable[T]], within_s: float, *, every_s: float = 0.25,
                   on_retry: Callable[[BaseException], None] | None = None) -> T:
    """`call()`, asked again while the bus is away, for up to `within_s` (`on_retry` told of each
    miss); then its error is raised. Only for calls that are safe to repeat (a publish with its
    Nats-Msg-Id, a KV put, a start step)."""
    deadline = asyncio.get_running_loop().time() + within_s
    while True:
        try:
            return await call()
        except BUS_AWAY as exc:
            if asyncio.get_running_loop().time() >= deadline:
                raise
            if on_retry is not None:
                on_retry(exc)
            await asyncio.sleep(every_s)
