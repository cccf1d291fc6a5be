"""Read a stream's facts from its start and follow new ones, with no consumer of our own.

A service that must know every silence or drain in force reads them when it starts and then
follows new ones (`topology.REPLAYS`). It reads the stream one message at a time with
`$JS.API.STREAM.MSG.GET` (the next message on a subject from a sequence on), so it creates no
consumer: its NATS user needs no right to create, look up or delete consumers, rights that on a
shared stream reach every other service's consumers too. A core subscription on the same
subjects only wakes the reader up (what it carries is not used); a wake-up missed during a
reconnect is made up by a read every `FOLLOW_EVERY_S`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

log = logging.getLogger(__name__)

FOLLOW_EVERY_S = 5.0
"""How often a follower reads without a wake-up (one request per subject)."""
GET_TIMEOUT_S = 2.0
"""How long one message get waits: a stored message answers in milliseconds, and a get lost to a
server that is going away costs a service catching up at start this long (nats-py's default, 5 s,
kept the autoscaler from being ready within 10 s of a restart under `make chaos`)."""


class StreamFollower:
    """Every message of `subjects` in one stream, in stream order, each handed once to `on_message`."""

    def __init__(
        self, nc: Client, stream: str, subjects: Sequence[str], on_message: Callable[[RawStreamMsg], Awaitable[None]],
        *, published: Sequence[str] | None = None,
    ) -> None:
        """`subjects` as the stream stores them; `published`, where those differ (a partitioned
        stream), the subjects they are published on, which wake it up."""
        self._nc = nc
        self._js = nc.jetstream(timeout=GET_TIMEOUT_S)
        self._stream = stream
        self._subjects = tuple(subjects)
        self._published = tuple(published or subjects)
        self._on_message = on_message
        self._next_seq = 1
        self._wake = asyncio.Event()
        self._subs: list = []

    async def catch_up(self) -> int:
        """Hand on every stored message from the cursor on; how many there were."""
        heads = {subject: await self._next(subject, self._next_seq) for subject in self._subjects}
        handed = 0
        while True:
            found = [(msg.seq, subject) for subject, msg in heads.items() if msg is not None]
            if not found:
                return handed
            seq, subject = min(found)
            msg = heads[subject]
            self._next_seq = seq + 1
            await self._on_message(msg)
            handed += 1
            heads[subject] = await self._next(subject, self._next_seq)

    async def listen(self) -> None:
        """Be woken up by new messages on the subjects (core subscriptions)."""
        for subject in self._published:
            self._subs.append(await self._nc.subscribe(subject, cb=self._woken))

    async def follow(self) -> None:
        """Read what is new whenever woken, and every FOLLOW_EVERY_S anyway; until cancelled."""
        while True:
            try:  # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow the cancellation that ends this loop
                async with asyncio.timeout(FOLLOW_EVERY_S):
                    await self._wake.wait()
            except TimeoutError:
                pass
            self._wake.clear()
            try:
                await self.catch_up()
            except Exception as exc:  # the bus away a moment: the next round reads from the same cursor
                log.debug("reading %s on %s failed: %r", self._subjects, self._stream, exc)

    async def close(self) -> None:
        for sub in self._subs:
            try:
                await sub.unsubscribe()
            except Exception:  # a closed connection has no subscription left to end
                pass
        self._subs.clear()

    async def _woken(self, _msg) -> None:
        self._wake.set()

    async def _next(self, subject: str, seq: int) -> RawStreamMsg | None:
        try:
            return await self._js.get_msg(self._stream, seq=seq, subject=subject, next=True)
        except NotFoundError:
            return None
