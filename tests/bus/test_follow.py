"""Replays without consumers (gpumedic_bus.follow), against a real nats-server: a service reads the
silences (or drains) in force from the stream's start in stream order, then follows new ones as
they come, and a fact it cannot decode is skipped, not fatal."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

from gpumedic_bus import ServiceRuntime
from gpumedic_bus.follow import StreamFollower
from gpumedic_bus.streams import CONTROL
from gpumedic_events import SilenceAdded, SilenceRemoved


def _silence(node: str) -> SilenceAdded:
    now = datetime.now(UTC)
    return SilenceAdded(
        source="operator", silence_id=uuid.uuid4(), node_id=node, starts_at=now, ends_at=now + timedelta(hours=1),
        reason="maintenance", created_by="test",
    )


async def _publish(js, event) -> None:
    await js.publish(event.subject, event.to_json(), stream=CONTROL.name)


async def test_a_follower_hands_on_every_message_of_its_subjects_in_stream_order_once(js):
    first, second = _silence("n1"), _silence("n2")
    removed = SilenceRemoved(source="operator", silence_id=first.silence_id, removed_by="test")
    for event in (first, removed, second):
        await _publish(js, event)
    seen: list[str] = []

    async def on_message(msg) -> None:
        seen.append(msg.subject)

    follower = StreamFollower(js._nc, CONTROL.name, [SilenceAdded.subject_filter(), SilenceRemoved.subject_filter()], on_message)
    assert await follower.catch_up() == 3
    assert seen == [first.subject, removed.subject, second.subject]
    assert await follower.catch_up() == 0  # nothing twice

    await follower.listen()
    task = asyncio.create_task(follower.follow())
    try:
        late = _silence("n3")
        await _publish(js, late)
        for _ in range(100):  # woken at once, not at the next FOLLOW_EVERY_S
            if len(seen) == 4:
                break
            await asyncio.sleep(0.02)
        assert seen[3:] == [late.subject]
    finally:
        task.cancel()
        await follower.close()


async def test_a_service_replays_what_is_in_force_then_follows_and_skips_what_does_not_decode(nats_settings, js):
    before = _silence("n1")
    await _publish(js, before)
    await js.publish(SilenceAdded.subject_prefix, b"{not json", stream=CONTROL.name)
    runtime = ServiceRuntime("zombie-detector", nats_settings)
    got: list[uuid.UUID] = []

    async def on_silence(event) -> None:
        got.append(event.silence_id)

    runtime.replay((SilenceAdded, SilenceRemoved), on_silence)
    app = runtime.app()
    task = asyncio.create_task(app.run())
    try:
        await asyncio.wait_for(runtime.ready.wait(), 20)
        assert got == [before.silence_id]
        after = _silence("n2")
        await _publish(js, after)
        for _ in range(500):  # woken at once; a wake-up lost under load is made up within FOLLOW_EVERY_S
            if len(got) == 2:
                break
            await asyncio.sleep(0.02)
        assert got == [before.silence_id, after.silence_id]
    finally:
        app.exit()
        await task


async def test_a_history_replayed_once_ready_does_not_hold_the_start_and_says_when_it_has_caught_up(nats_settings, js):
    """A history that grows with the fleet (every incident ever opened) read before ready held a
    restarted autoscaler for 12 s under chaos: read after, the service is ready at once, and what
    the history decides waits for the event the replay sets once it has caught up."""
    for i in range(40):
        await _publish(js, _silence(f"n{i}"))
    runtime = ServiceRuntime("zombie-detector", nats_settings)
    got: list[uuid.UUID] = []
    at_ready: list[int] = []
    release = asyncio.Event()

    async def on_silence(event) -> None:
        if not got:
            await release.wait()  # a slow history: ready must not wait for it
        got.append(event.silence_id)

    caught_up = runtime.replay((SilenceAdded, SilenceRemoved), on_silence, before_ready=False)
    app = runtime.app()
    task = asyncio.create_task(app.run())
    try:
        await asyncio.wait_for(runtime.ready.wait(), 20)
        at_ready.append(len(got))
        assert at_ready == [0] and not caught_up.is_set()
        release.set()
        await asyncio.wait_for(caught_up.wait(), 20)
        assert len(got) == 40
        late = _silence("late")
        await _publish(js, late)
        for _ in range(500):  # and it follows on from there
            if got[-1] == late.silence_id:
                break
            await asyncio.sleep(0.02)
        assert got[-1] == late.silence_id and len(got) == 41
    finally:
        app.exit()
        await task
