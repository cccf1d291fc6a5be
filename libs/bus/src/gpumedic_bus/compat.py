"""One fix to a dependency, until it ships its own.

nats-py 2.15 and later let a pull `fetch` that found nothing raise a bare `asyncio.TimeoutError`
on some exits instead of its documented `nats.errors.TimeoutError` (nats-io/nats.py#1008, open
as of this writing). FastStream's pull loop suppresses only the documented one, so now and then
an empty fetch killed a consuming task: its supervisor logged an ERROR with a traceback at every
service start, and restarted the task. Here `fetch` raises the documented error again. Delete
this module once uv.lock has a nats-py with that fix.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import nats.errors
from nats.js.client import JetStreamContext

_MARK = "__gpumedic_documented_timeout__"


def documented_timeout(fetch: Callable[..., Awaitable[Any]]) -> Callable[..., Awaitable[Any]]:
    @functools.wraps(fetch)
    async def _fetch(*args: Any, **kwargs: Any) -> Any:
        try:
            return await fetch(*args, **kwargs)
        except nats.errors.TimeoutError:
            raise
        except TimeoutError as exc:
            raise nats.errors.TimeoutError from exc

    setattr(_fetch, _MARK, True)
    return _fetch


def install() -> None:
    pull = JetStreamContext.PullSubscription
    if not getattr(pull.fetch, _MARK, False):
        pull.fetch = documented_timeout(pull.fetch)  # type: ignore[method-assign]
