"""Stopping background tasks, bounded, even those whose cancellation was swallowed."""

from __future__ import annotations

import asyncio
from collections.abc import Iterable

RECANCEL_EVERY_S = 0.5


async def stop_tasks(tasks: Iterable[asyncio.Task], within_s: float = 10.0) -> set[asyncio.Task]:
    """Cancel `tasks` and wait for them to end, at most `within_s`; return those still running.

    Each one still running is cancelled again every `RECANCEL_EVERY_S`: on Python 3.11 a cancel
    that lands as an inner `asyncio.wait_for` completes (nats-py's request, a publish's ack) is
    swallowed (CPython gh-86296), and a loop that waited on one cancel alone would run on.
    The exceptions of tasks that ended are retrieved, not raised: log them where they happen."""
    tasks = set(tasks)
    pending = {task for task in tasks if not task.done()}
    ended = tasks - pending
    loop = asyncio.get_running_loop()
    deadline = loop.time() + within_s
    while pending:
        for task in pending:
            task.cancel()
        left = deadline - loop.time()
        if left <= 0:
            break
        done, pending = await asyncio.wait(pending, timeout=min(RECANCEL_EVERY_S, left))
        ended |= done
    for task in ended:
        if not task.cancelled():
            task.exception()
    return pending
