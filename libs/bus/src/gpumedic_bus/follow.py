"""Read a stream's facts from its start and follow new ones, with no consumer of our own.

A service that must know every silence or drain in force reads them when it starts and then
follows new ones (`topology.REPLAYS`). It reads the stream one message at a time with
`$JS.API.STREAM.MSG.GET` (the next message on a subject from a sequence on), so it creates no
consumer: its NATS user needs no right to create, look up or delete consumers, rights that on a
shared stream reach every other service's consumers too. A core subscription on the same
subjects only wakes the reader up (what it carries is not used); a wake-up missed during a
reconnect is made up by a read every `FOLLOW_EVERY_S`.

What every instance reads at a fleet's rate (report-builder's samples) comes a batch at a time
instead (`PacedReader`): one message a request would be thousands of requests a second.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from collections.abc import Awaitable, Callable, Sequence

from nats.aio.client import Client
from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from gpumedic_bus.consume import BACKLOG_BATCHES, PACED_BATCH, PACED_EVERY_S, PACED_TURN_S, ask_on_pace

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


class PacedReader:
    """Every message stored under `subject` in `stream` from the newest on, in stream order, each
    handed once to `on_message(stored subject, body)`, with no consumer: every `every_s` a batched
    direct get (`$JS.API.DIRECT.GET`, NATS 2.11: up to `batch` messages from a sequence on, ended
    by an EOB status that says how many more wait) asks for what was stored since, and again at
    once while more wait, for up to `BACKLOG_BATCHES` batches at once. The stream must allow
    direct gets (`Stream.direct`); any of its servers answers. A reader further behind than the
    stream keeps goes on from its oldest message.

    Subscribed, each message woke the process on its own: 2,000 a second at 10,000 nodes, each
    costing several times what it costs in a batch (`gpumedic_bus.PacedConsumer`). It gives the
    event loop a turn at least every `PACED_TURN_S` while it works through a batch."""

    def __init__(
        self, nc: Client, stream: str, subject: str, on_message: Callable[[str, bytes], Awaitable[None]],
        *, batch: int = PACED_BATCH, every_s: float = PACED_EVERY_S,
    ) -> None:
        self._nc = nc
        self._stream = stream
        self._subject = subject
        self._on_message = on_message
        self._batch = batch
        self._every_s = every_s
        self._next_seq = 1
        self._waiting = 0
        """How many more the last batch's end said wait: the next ask takes up to BACKLOG_BATCHES of them."""
        self._answered = asyncio.Event()
        self._sub = None
        self._asker: asyncio.Task | None = None
        self._turn_began = time.perf_counter()

    async def start(self) -> None:
        """From the newest message stored now on (none stored: from the first that comes)."""
        try:
            newest = await self._nc.jetstream(timeout=GET_TIMEOUT_S).get_last_msg(self._stream, self._subject)
            self._next_seq = newest.seq + 1
        except NotFoundError:
            self._next_seq = 1
        inbox = self._nc.new_inbox()
        # Room for the largest ask and a late answer to one before it (nats-py drops what overflows).
        self._sub = await self._nc.subscribe(inbox, cb=self._on_reply, pending_msgs_limit=2 * BACKLOG_BATCHES * self._batch)
        subject = f"$JS.API.DIRECT.GET.{self._stream}"

        async def ask_for_a_batch(size: int) -> None:  # from where the last answer ended
            self._waiting = 0
            ask = json.dumps({"seq": self._next_seq, "batch": size, "next_by_subj": self._subject}).encode()
            await self._nc.publish(subject, ask, reply=inbox)

        self._asker = asyncio.create_task(
            ask_on_pace(ask_for_a_batch, self._answered, lambda: self._waiting, batch=self._batch, every_s=self._every_s,
                        what=f"reading {self._stream}"),
            name=f"read-{self._stream}",
        )

    async def close(self) -> None:
        if self._asker is not None:
            self._asker.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._asker
            self._asker = None
        if self._sub is not None:
            with contextlib.suppress(Exception):  # a closed connection has no subscription left to end
                await self._sub.unsubscribe()
            self._sub = None

    async def _on_reply(self, msg) -> None:
        headers = msg.headers or {}
        if "Status" in headers:  # 204 EOB ends a batch (with how many more wait); 404: nothing new
            try:
                self._waiting = int(headers.get("Nats-Num-Pending", "0")) if headers.get("Status") == "204" else 0
            except ValueError:
                self._waiting = 0
            self._answered.set()
            return
        try:
            seq = int(headers["Nats-Sequence"])
            stored = headers["Nats-Subject"]
        except (KeyError, ValueError):
            log.warning("a direct get on %s answered without a sequence or subject: skipped", self._stream)
            return
        if seq < self._next_seq:
            return  # an earlier ask's answer, come after its timeout: already handed on
        self._next_seq = seq + 1
        await self._on_message(stored, msg.data)
        if time.perf_counter() - self._turn_began > PACED_TURN_S:
            await asyncio.sleep(0)  # the rest of the service runs; then the batch goes on
            self._turn_began = time.perf_counter()
