"""What the bus answers while it is away, and how to say so in one line.

A restarting nats-server, or a cluster electing the leader of a stream, consumer or bucket,
answers with these errors for a few seconds: they are retried, and logged as one line with the
reason ("no response from stream"), never as a traceback.
"""

from __future__ import annotations

import os

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
