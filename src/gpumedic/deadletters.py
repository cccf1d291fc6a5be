"""`gpumedic dead-letters [list | replay SEQ...]`: what the services refused, and a second chance.

Every message a consumer refused (it did not decode, or its handler failed past the last
delivery) is kept in the dead-letter stream as a `MessageRejected`: the service, the subject, the
reason, the payload's digest and the payload itself (its first 64 KiB). `list` shows them, newest
first; `replay` publishes chosen ones again to their original subject once the cause is fixed.
Every consumer of that subject gets the message again, which they take as a redelivery: events
are kept once by their id, and a stale action request is refused by the gate. A payload that was
cut, or was not valid text, is not what was sent and is never replayed. Both read and publish as
the NATS admin (the embedded stack's under `--var`, else GPUMEDIC_NATS_*), since only it may
read the control plane's streams and publish on any subject.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from nats.js.errors import NotFoundError

from gpumedic.output import clip, table, to_json
from gpumedic_bus import NatsSettings, connect
from gpumedic_bus.streams import DEAD_LETTERS
from gpumedic_events import EventDecodeError, MessageRejected

SOURCE = "gpumedic-cli"
MAX_SCANNED = 10_000
"""How far back `list` looks for dead letters of one service."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    record: MessageRejected


async def _read(js, seq: int) -> DeadLetter | None:
    try:
        msg = await js.get_msg(DEAD_LETTERS.name, seq=seq)
    except NotFoundError:  # removed by the stream's limits
        return None
    try:
        return DeadLetter(seq, MessageRejected.from_json(msg.data or b"", subject=msg.subject))
    except EventDecodeError:
        return None


async def dead_letters(settings: NatsSettings, *, service: str | None = None, limit: int = 50) -> list[DeadLetter]:
    """The newest `limit` dead letters (of one service), newest first."""
    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    try:
        js = nc.jetstream(timeout=5)
        state = (await js.stream_info(DEAD_LETTERS.name)).state
        found: list[DeadLetter] = []
        seq = state.last_seq
        while seq >= max(state.first_seq, 1) and len(found) < limit and state.last_seq - seq < MAX_SCANNED:
            letter = await _read(js, seq)
            if letter is not None and (service is None or letter.record.service == service):
                found.append(letter)
            seq -= 1
        return found
    finally:
        await nc.close()


async def list_text(settings: NatsSettings, *, service: str | None = None, limit: int = 50, as_json: bool = False) -> str:
    letters = await dead_letters(settings, service=service, limit=limit)
    if as_json:
        return to_json([{"seq": d.seq, **d.record.model_dump(mode="json")} for d in letters])
    if not letters:
        return "no dead letters" + (f" of {service}" if service else "")
    return table(
        ["SEQ", "WHEN", "SERVICE", "SUBJECT", "DELIVERIES", "BYTES", "REASON"],
        [[d.seq, d.record.occurred_at.isoformat(timespec="seconds"), d.record.service, d.record.original_subject,
          d.record.deliveries, d.record.payload_bytes, clip(d.record.reason, 120)] for d in letters],
        right=("SEQ", "DELIVERIES", "BYTES"),
    )


def replay_refusal(record: MessageRejected) -> str:
    """Why a dead letter cannot be replayed as it was sent ('' when it can)."""
    if record.payload_truncated:
        return f"only its first {len(record.payload.encode())} of {record.payload_bytes} bytes were kept"
    if hashlib.sha256(record.payload.encode()).hexdigest() != record.payload_sha256:
        return "its bytes were not valid text, so what was kept is not what was sent"
    return ""


async def replay(settings: NatsSettings, seqs: list[int]) -> tuple[bool, list[str]]:
    """Publish each chosen dead letter's payload to its original subject; whether all went, and a line each."""
    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    lines, ok = [], True
    try:
        js = nc.jetstream(timeout=5)
        for seq in seqs:
            letter = await _read(js, seq)
            if letter is None:
                ok = False
                lines.append(f"dead letter {seq}: not found (never kept, or removed by the stream's limits)")
                continue
            record = letter.record
            if why := replay_refusal(record):
                ok = False
                lines.append(f"dead letter {seq}: not replayed: {why}")
                continue
            # The same id however often it is asked: the stream keeps one replay per dead letter.
            ack = await js.publish(record.original_subject, record.payload.encode(), headers={"Nats-Msg-Id": f"replay:{seq}"})
            said = "already replayed" if ack.duplicate else f"stored as {ack.stream} #{ack.seq}"
            lines.append(f"dead letter {seq}: replayed to {record.original_subject} ({said}); {record.service} refused it for: "
                         f"{clip(record.reason, 200)}")
        return ok, lines
    finally:
        await nc.close()
