"""`gpumedic dead-letters [list | replay SEQ...]`: what the services refused, and a second chance.

Every message a consumer refused (it did not decode, or its handler failed past the last
delivery) is kept in the dead-letter stream as a `MessageRejected`: the service, the subject, the
reason, where the stream keeps the original, its digest and its first 64 KiB. `list` shows them,
newest first. `replay` delivers a chosen one again once the cause is fixed, and is the original
delivery again, nothing more:

- the record is the word of whoever wrote it, and a service's login may write its own dead
  letters: so the writer is the service the server let publish it (a record whose `service` is
  not its subject's last token does not decode), the subject must be one a durable consumer of that service reads (`topology.DURABLES`; never
  `$KV`, `$JS` or anything else), and the original must still be in that consumer's stream at
  the sequence the record names, with the subject and the SHA-256 the record names;
- what is published is the stream's own copy of the original (and its headers), into that
  stream only (Nats-Expected-Stream), so a replay can carry nothing its producer did not send;
- each original is replayed at most once for each service, recorded in the store (who, when, what it became)
  before it is published, however long after the first replay the second is asked for.

Only the consumer that refused it handles it again (`Gpumedic-Replay-For` names its durable): every
other consumer of the subject checks that the copy repeats a message its stream stored before
(subject and bytes, at the sequence `Gpumedic-Replay-Of` names), and takes it as the original it
already had. The refusing consumer takes it as a redelivery: events are kept once by their id, and
an action request goes through the remediator's gate as a new request, its age counted from when it
was first sent. Both read and publish as the NATS admin (the embedded
stack's under `--var`, else GPUMEDIC_NATS_*), since only it may read the control plane's streams
and publish on any subject.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from datetime import UTC, datetime

from nats.js.api import RawStreamMsg
from nats.js.errors import NotFoundError

from gpumedic.output import clip, table, to_json
from gpumedic_bus import NatsSettings, connect
from gpumedic_bus.consume import REPLAY_FOR, REPLAY_OF
from gpumedic_bus.streams import DEAD_LETTERS, stream_of
from gpumedic_bus.topology import durable_reading
from gpumedic_events import EventDecodeError, MessageRejected
from gpumedic_store import replays, views

SOURCE = "gpumedic-cli"
MAX_SCANNED = 10_000
"""How far back `list` looks for dead letters of one service."""


@dataclass(frozen=True)
class DeadLetter:
    seq: int
    record: MessageRejected
    """Its `service` is the one the server let publish it: decoding checks it against the subject."""


async def _read(js, seq: int) -> DeadLetter | str:
    """The dead letter at `seq`, or why there is none."""
    try:
        msg = await js.get_msg(DEAD_LETTERS.name, seq=seq)
    except NotFoundError:
        return "not found (never kept, or removed by the stream's limits)"
    try:
        return DeadLetter(seq, MessageRejected.from_json(msg.data or b"", subject=msg.subject))
    except EventDecodeError as exc:
        return f"not a dead-letter record ({clip(exc.reason, 200)})"


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
            if isinstance(letter, DeadLetter) and (service is None or letter.record.service == service):
                found.append(letter)
            seq -= 1
        return found
    finally:
        await nc.close()


async def dead_letters_text(settings: NatsSettings, *, service: str | None = None, limit: int = 50, as_json: bool = False) -> str:
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


def replay_refusal(letter: DeadLetter, original: RawStreamMsg | None) -> str:
    """Why a dead letter is not replayed ('' when its original may be delivered again).

    `original` is what the stream the record names holds at the sequence it names (None: nothing)."""
    record = letter.record
    durable = durable_reading(record.service, record.original_subject)
    if durable is None:
        return f"no consumer of {record.service} reads {clip(record.original_subject, 120)}: a replay goes only where it was refused"
    if record.stream is None or record.stream_sequence is None:
        return "the record does not say where the stream keeps the original (it came over core NATS, or from an older gpumedic)"
    if record.stream != durable.stream:
        return f"{durable.name} reads {durable.stream}, not {record.stream}"
    where = f"{record.stream} #{record.stream_sequence}"
    if original is None:
        return f"{where} is no longer stored (removed by the stream's limits), so the record cannot be checked against it"
    if original.subject != record.original_subject or hashlib.sha256(original.data or b"").hexdigest() != record.payload_sha256:
        return f"{where} is not the message the record describes (another subject or other bytes)"
    return ""


async def replay(settings: NatsSettings, seqs: list[int], *, store_url: str, by: str) -> tuple[bool, list[str]]:
    """Deliver each chosen dead letter's original again, at most once; whether all went, and a line each."""
    nc = await connect(settings, SOURCE, allow_reconnect=False, max_reconnect_attempts=0)
    lines, ok = [], True
    try:
        js = nc.jetstream(timeout=5)
        async with views.store_session(store_url) as session:
            for seq in seqs:
                line = await _replay_one(js, session, seq, by)
                ok = ok and line.startswith(f"dead letter {seq}: replayed")
                lines.append(line)
        return ok, lines
    finally:
        await nc.close()


async def _replay_one(js, session, seq: int, by: str) -> str:
    letter = await _read(js, seq)
    if isinstance(letter, str):
        return f"dead letter {seq}: {letter}"
    record = letter.record
    original = None
    durable = durable_reading(record.service, record.original_subject)
    if record.stream is not None and record.stream_sequence is not None and durable is not None:
        try:
            original = await js.get_msg(record.stream, seq=record.stream_sequence)
        except NotFoundError:
            original = None
    if why := replay_refusal(letter, original):
        return f"dead letter {seq}: not replayed: {why}"
    stream, stored_seq = record.stream, record.stream_sequence
    earlier = await replays.claim(session=session, stream=stream, seq=stored_seq, dead_letter_seq=seq, service=record.service,
                                  subject=record.original_subject, by=by, now=datetime.now(UTC))
    if earlier is not None:
        became = earlier.result or "its publish did not finish; see the stream"
        return (f"dead letter {seq}: already replayed: {stream} #{stored_seq} was delivered again by {earlier.replayed_by} "
                f"at {earlier.replayed_at.isoformat(timespec='seconds')} (dead letter {earlier.dead_letter_seq}): {became}")
    headers = {k: v for k, v in (original.headers or {}).items() if k.lower() not in ("nats-msg-id", REPLAY_FOR.lower(), REPLAY_OF.lower())}
    headers |= {"Nats-Msg-Id": f"replay:{stream}:{stored_seq}:{durable.name}", REPLAY_FOR: durable.name, REPLAY_OF: str(stored_seq)}
    try:
        # as first published: a partitioned stream stores it under its node's partition again
        ack = await js.publish(stream_of(durable.event).as_published(original.subject), original.data or b"", stream=stream, headers=headers)
    except Exception:
        # Unacknowledged: maybe stored, maybe not. The claim stays, saying so, rather than risk a second copy.
        await replays.finish(session=session, stream=stream, seq=stored_seq, service=record.service, result="")
        raise
    said = f"stored as {ack.stream} #{ack.seq}"
    await replays.finish(session=session, stream=stream, seq=stored_seq, service=record.service, result=said)
    return (f"dead letter {seq}: replayed to {durable.name} on {record.original_subject} ({said}); {record.service} refused it for: "
            f"{clip(record.reason, 200)}")
