"""The fourth attack's last weak spot: a replayed dead letter reached every consumer of its subject,
not only the one that refused it (the others handled it again, or refused it again and made new
dead letters). Now only the refusing durable handles the copy; every other consumer checks that
it repeats a message its stream already stored (so no producer can use the header to keep a new
message from a consumer) and takes it as the original it had. Two services' real consumers of
ActionCompleted on a real nats-server, and the real `gpumedic dead-letters replay`."""

from __future__ import annotations

import asyncio
import uuid

from gpumedic.cli import main
from gpumedic_bus import ServiceRuntime
from gpumedic_bus.consume import REPLAY_FOR, REPLAY_OF, rejection
from gpumedic_bus.streams import ACTIONS, DEAD_LETTERS
from gpumedic_events import ActionCompleted
from gpumedic_events.base import json_examples

EXAMPLE = ActionCompleted.model_validate(json_examples(ActionCompleted)[0])


async def _until(check, what: str, timeout_s: float = 15.0) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if check():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{what} within {timeout_s:g}s")


async def test_a_replay_is_handled_by_the_consumer_that_refused_it_and_no_other(nats_settings, nats_url, js, store_url, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    monkeypatch.setenv("GPUMEDIC_STORE_URL", store_url)
    handled: dict[str, list[uuid.UUID]] = {"zombie-detector": [], "report-builder": []}
    apps = []
    for service, durable in (("zombie-detector", "zombie-detector-actions"), ("report-builder", "report-builder-ActionCompleted")):
        runtime = ServiceRuntime(service, nats_settings)

        async def handle(event: ActionCompleted, delivery, seen=handled[service]) -> None:
            seen.append(event.event_id)

        runtime.consume(durable, handle)
        app = runtime.app()
        apps.append((app, asyncio.create_task(app.run())))
        await asyncio.wait_for(runtime.ready.wait(), 20)
    try:
        completed = EXAMPLE.model_copy(update={"event_id": uuid.uuid4(), "action_id": uuid.uuid4()})
        ack = await js.publish(completed.subject, completed.to_json(), stream=ACTIONS.name)
        await _until(lambda: all(handled.values()), "both consumers handled the original")
        # report-builder refused it (its store was down); the record is its own.
        record = rejection("report-builder", completed.subject, completed.to_json(), "handler failed 5 times: store down", 5,
                           stored=(ack.stream, ack.seq))
        dead = (await js.publish(record.subject, record.to_json(), stream=DEAD_LETTERS.name)).seq
        letters = (await js.stream_info(DEAD_LETTERS.name)).state.messages

        assert await asyncio.to_thread(main, ["dead-letters", "replay", str(dead), "--by", "alice"]) == 0
        assert f"replayed to report-builder-ActionCompleted on {completed.subject}" in capsys.readouterr().out
        await _until(lambda: len(handled["report-builder"]) == 2, "report-builder handled the replay")
        await asyncio.sleep(1.5)  # a fetch's wait: the other consumer has had it by now
        assert handled == {"zombie-detector": [completed.event_id], "report-builder": [completed.event_id] * 2}
        assert (await js.stream_info(DEAD_LETTERS.name)).state.messages == letters  # no new dead letter anywhere

        # The header on a new message (not a stored one's copy) keeps it from nobody.
        forged = EXAMPLE.model_copy(update={"event_id": uuid.uuid4(), "action_id": uuid.uuid4()})
        await js.publish(forged.subject, forged.to_json(), stream=ACTIONS.name,
                         headers={REPLAY_FOR: "report-builder-ActionCompleted", REPLAY_OF: str(ack.seq)})
        await _until(lambda: forged.event_id in handled["zombie-detector"], "zombie-detector handled the forged one")
    finally:
        for app, task in apps:
            app.exit()
            await task
