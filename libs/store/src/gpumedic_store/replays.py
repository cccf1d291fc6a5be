"""Dead-letter replays, each at most once: the operator's record of who delivered which refused
message again, when, and what it became (`gpumedic dead-letters replay`).

The row is claimed before the publish and completed after it, so a second replay of the same
original for the same service (the same dead letter, or another instance's record of it) finds
it, days later as well as seconds later, and publishes nothing. A replay goes only to the service
that refused it, so another service's dead letter of the same message is its own replay. A row
keyed by the original alone comes from before replays had one service: it went to every consumer. The functions take the session
keyword-only; `claim` commits, because the claim must hold before anything is published.
"""

from __future__ import annotations

from datetime import datetime

from sqlalchemy import delete
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession

from gpumedic_store.models import DeadLetterReplay


def original_key(stream: str, seq: int, service: str) -> str:
    return f"{stream}:{seq}:{service}"


async def claim(
    *, session: AsyncSession, stream: str, seq: int, dead_letter_seq: int, service: str, subject: str, by: str, now: datetime
) -> DeadLetterReplay | None:
    """Claim the replay of one original for `service`; None when it is ours to publish, else the replay that came first."""
    key = original_key(stream, seq, service)
    earlier = await session.get(DeadLetterReplay, key) or await session.get(DeadLetterReplay, f"{stream}:{seq}")
    if earlier is not None:
        return earlier
    session.add(DeadLetterReplay(original=key, dead_letter_seq=dead_letter_seq, service=service, subject=subject,
                                 replayed_by=by[:128], replayed_at=now, result=""))
    try:
        await session.commit()
    except IntegrityError:  # another operator claimed it between our read and our write
        await session.rollback()
        return await session.get(DeadLetterReplay, key)
    return None


async def finish(*, session: AsyncSession, stream: str, seq: int, service: str, result: str) -> None:
    row = await session.get(DeadLetterReplay, original_key(stream, seq, service))
    if row is not None:
        row.result = result
        await session.commit()


async def release(*, session: AsyncSession, stream: str, seq: int, service: str) -> None:
    """Give a claim back after its publish failed for certain: nothing was stored, it may be tried again."""
    await session.execute(delete(DeadLetterReplay).where(DeadLetterReplay.original == original_key(stream, seq, service)))
    await session.commit()

