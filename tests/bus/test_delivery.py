"""JetStream delivery as the services rely on it, against a real nats-server: a failing handler
gets the message again later, a handler that keeps failing ends in the dead-letter stream after
the provisioned consumer's deliveries (not silently dropped), a command republished with the
same Nats-Msg-Id is stored once, and a service whose consumer was never provisioned stops at
start saying what to run."""

from __future__ import annotations

import asyncio
import time
import uuid

import nats.js.errors
import pytest

from gpumedic_bus import BusNotProvisioned, ServiceRuntime, provision, publish_event
from gpumedic_bus.consume import RETRY_BACKOFF_S
from gpumedic_bus.streams import ACTIONS, DEAD_LETTERS
from gpumedic_events import ActionRequested, MessageRejected
from gpumedic_events.base import json_examples

EXAMPLE = ActionRequested.model_validate(json_examples(ActionRequested)[0])


def _request() -> ActionRequested:
    """A request with its own action id: the stream remembers ids for its duplicate window."""
    return EXAMPLE.model_copy(update={"action_id": uuid.uuid4()})


async def _run(runtime: ServiceRuntime):
    app = runtime.app()
    task = asyncio.create_task(app.run())
    await asyncio.wait_for(runtime.ready.wait(), 20)
    return app, task


async def test_a_failing_handler_gets_the_message_again_after_the_backoff(nats_settings, js):
    request = _request()
    runtime = ServiceRuntime("remediator", nats_settings)
    seen: list[tuple[int, float]] = []

    async def flaky(event: ActionRequested, delivery) -> None:
        seen.append((delivery.deliveries, time.monotonic()))
        if delivery.deliveries == 1:
            raise ConnectionError("node briefly unreachable")

    runtime.consume("remediator-actions", flaky)
    app, task = await _run(runtime)
    try:
        await publish_event(runtime.broker, request, msg_id=str(request.action_id))
        for _ in range(100):
            if len(seen) >= 2:
                break
            await asyncio.sleep(0.05)
    finally:
        app.exit()
        await task
    assert [d for d, _ in seen] == [1, 2]
    assert seen[1][1] - seen[0][1] >= RETRY_BACKOFF_S[0] * 0.9
    assert runtime.metrics.rejected() == 0


async def test_a_handler_that_keeps_failing_ends_in_the_dead_letter_stream(nats_settings, js):
    request = _request()
    # The provisioned consumer decides how often the service tries: the service takes it at start.
    await provision(js, nats_settings.model_copy(update={"max_deliver": 2}))
    runtime = ServiceRuntime("remediator", nats_settings)
    attempts = []

    async def broken(event: ActionRequested, delivery) -> None:
        attempts.append(delivery.deliveries)
        raise ValueError("always fails")

    runtime.consume("remediator-actions", broken)
    app, task = await _run(runtime)
    try:
        await publish_event(runtime.broker, request, msg_id=str(request.action_id))
        for _ in range(200):
            if runtime.metrics.rejected():
                break
            await asyncio.sleep(0.05)
    finally:
        app.exit()
        await task
    assert attempts == [1, 2]
    msg = await js.get_last_msg(DEAD_LETTERS.name, MessageRejected.subject_for("remediator"))
    record = MessageRejected.from_json(msg.data, subject=msg.subject)
    assert record.original_subject == request.subject and record.deliveries == 2
    assert "handler failed 2 times" in record.reason and "always fails" in record.reason
    assert ActionRequested.from_json(record.payload.encode()) == request  # kept whole, can be replayed


class _Down(RuntimeError):
    """What a handler raises while a dependency it needs (the store) is down."""


async def test_while_a_dependency_is_down_a_message_waits_and_nothing_new_is_taken_then_each_lands_once(nats_settings, js):
    """Longer than the consumer's AckWait (2 s here) and its deliveries (3) allow: the message is
    kept in progress and tried again, neither redelivered nor dead-lettered, and the consumer takes
    no other message until it went through."""
    first, second = _request(), _request()
    runtime = ServiceRuntime("remediator", nats_settings)
    down_until = time.monotonic() + 7.0
    tries: dict = {}
    done: list = []

    async def needs_the_store(event: ActionRequested, delivery) -> None:
        tries[event.action_id] = tries.get(event.action_id, 0) + 1
        assert delivery.deliveries == 1  # never redelivered meanwhile
        if time.monotonic() < down_until:
            raise _Down("incident store at postgresql://127.0.0.1/gpumedic is unavailable: connection refused")
        done.append(event.action_id)

    runtime.consume("remediator-actions", needs_the_store, batch_size=1, waits_on=(_Down,))
    app, task = await _run(runtime)
    try:
        await publish_event(runtime.broker, first, msg_id=str(first.action_id))
        await publish_event(runtime.broker, second, msg_id=str(second.action_id))
        await asyncio.sleep(3.0)
        assert list(tries) == [first.action_id]  # the second waits in JetStream, untaken
        assert runtime.metrics.waiting._value.get() == 1
        for _ in range(200):
            if len(done) == 2:
                break
            await asyncio.sleep(0.05)
    finally:
        app.exit()
        await task
    assert done == [first.action_id, second.action_id]
    assert tries[first.action_id] > 2 and tries[second.action_id] == 1
    assert runtime.metrics.rejected() == 0 and runtime.metrics.waiting._value.get() == 0
    info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=MessageRejected.subject_for("remediator"))
    assert not info.state.messages


async def test_a_command_published_twice_with_its_id_is_stored_once(nats_settings, js):
    request = _request()
    runtime = ServiceRuntime("zombie-detector", nats_settings)
    app, task = await _run(runtime)
    try:
        before = (await js.stream_info(ACTIONS.name)).state.messages
        for _ in range(3):
            await publish_event(runtime.broker, request, msg_id=str(request.action_id))
        other = request.model_copy(update={"attempt": 2})
        await publish_event(runtime.broker, other, msg_id=str(request.action_id) + "-2")
        after = (await js.stream_info(ACTIONS.name)).state.messages
    finally:
        app.exit()
        await task
    assert after - before == 2


async def test_a_service_whose_consumer_is_not_provisioned_stops_at_start_saying_what_to_run(nats_settings, js):
    await js.delete_consumer(ACTIONS.name, "remediator-actions")
    runtime = ServiceRuntime("remediator", nats_settings)

    async def never(event, delivery) -> None:
        raise AssertionError("nothing may be consumed")

    runtime.consume("remediator-actions", never)
    with pytest.raises(BusNotProvisioned, match="consumer remediator-actions on stream GPUMEDIC_ACTIONS does not exist; run `gpumedic provision`"):
        await runtime.app().run()


async def test_a_start_step_the_bus_does_not_answer_is_tried_again_in_process_and_any_other_failure_stops_it(
        nats_settings, js, caplog):
    runtime = ServiceRuntime("remediator", nats_settings)
    calls: list[int] = []

    async def electing() -> None:  # as a KV bucket answers while its stream elects a leader
        calls.append(1)
        if len(calls) <= 2:
            raise nats.js.errors.NoStreamResponseError

    async def handled(event, delivery) -> None:
        handled_ids.append(event.action_id)

    handled_ids: list = []
    runtime.on_startup(electing)
    runtime.consume("remediator-actions", handled)
    app, task = await _run(runtime)
    try:
        request = _request()
        await publish_event(runtime.broker, request, msg_id=str(request.action_id))
        for _ in range(100):
            if handled_ids:
                break
            await asyncio.sleep(0.05)
    finally:
        app.exit()
        await task
    assert len(calls) == 3 and handled_ids == [request.action_id]  # started once, consuming once
    said = [r.getMessage() for r in caplog.records if "starting:" in r.getMessage()]
    assert len(said) == 2 and "its startup hook electing: the bus did not answer (no response from stream); trying again" in said[0]

    broken = ServiceRuntime("remediator", nats_settings)

    async def misconfigured() -> None:
        raise RuntimeError("the console cannot listen on 127.0.0.1:1")

    broken.on_startup(misconfigured)
    with pytest.raises(RuntimeError, match="cannot listen"):
        await broken.app().run()


def test_a_service_may_consume_only_its_own_declared_durables(nats_settings):
    runtime = ServiceRuntime("remediator", nats_settings)
    with pytest.raises(LookupError, match="no durable consumer 'made-up'"):
        runtime.consume("made-up", None)
    with pytest.raises(ValueError, match="is zombie-detector's paced consumer, not remediator's pull one"):
        runtime.consume("zombie-detector-samples", None)


async def test_an_empty_fetch_times_out_with_the_documented_error_the_consumers_suppress(js):
    """FastStream's pull loop suppresses nats.errors.TimeoutError only; a bare asyncio one
    (nats-py >= 2.15 on some exits) killed the consuming task (gpumedic_bus.compat)."""
    import nats.errors

    from gpumedic_bus.compat import documented_timeout

    async def bare():
        raise TimeoutError

    with pytest.raises(nats.errors.TimeoutError):
        await documented_timeout(bare)()
    sub = await js.pull_subscribe("gpumedic.v1.silence.added.>", durable="compat-probe", stream="GPUMEDIC_CONTROL")
    for _ in range(3):
        # nats-py answers an empty fetch with its documented TimeoutError or, under load, with an
        # empty batch; both are harmless. A bare asyncio TimeoutError, which kills the consuming
        # task, would escape this block and fail the test.
        try:
            got = await sub.fetch(16, timeout=0.2)
        except nats.errors.TimeoutError:
            continue
        assert got == []
    await js.delete_consumer("GPUMEDIC_CONTROL", "compat-probe")


async def test_a_durable_that_goes_missing_is_said_in_one_line_its_metric_and_its_heartbeat(nats_settings, js, monkeypatch, caplog):
    """What an intruder with another login could do before the consumer rights were pinned, and
    what a lost server's data still can: a service that receives nothing must say so."""
    import gpumedic_bus.runtime as runtime_module
    from gpumedic_events import ServiceHeartbeat

    monkeypatch.setattr(runtime_module, "CONSUMER_CHECK_EVERY_S", 0.2)
    monkeypatch.setattr(runtime_module, "HEARTBEAT_EVERY_S", 0.2)
    runtime = ServiceRuntime("remediator", nats_settings)

    async def never(event, delivery) -> None:
        raise AssertionError("nothing is published here")

    runtime.consume("remediator-actions", never)
    beats: list[ServiceHeartbeat] = []

    async def on_beat(msg) -> None:
        beats.append(ServiceHeartbeat.from_json(msg.data, subject=msg.subject))

    sub = await js._nc.subscribe(ServiceHeartbeat.subject_for("remediator"), cb=on_beat)
    app, task = await _run(runtime)
    try:
        await js.delete_consumer(ACTIONS.name, "remediator-actions")
        for _ in range(300):  # 15 s at most: a loaded CI machine is slow to look and to beat
            if beats and beats[-1].consumers_missing:
                break
            await asyncio.sleep(0.05)
        assert beats[-1].consumers_missing == ("remediator-actions",)
        said = [r.getMessage() for r in caplog.records if "is gone" in r.getMessage()]
        assert len(said) == 1 and "consumer remediator-actions on stream GPUMEDIC_ACTIONS is gone: this service receives no " \
                                  "ActionRequested" in said[0] and "gpumedic provision" in said[0]
        assert runtime.consumers_missing == {"remediator-actions"}
        await provision(js, nats_settings)
        for _ in range(100):
            if not runtime.consumers_missing:
                break
            await asyncio.sleep(0.05)
        assert not runtime.consumers_missing
    finally:
        await sub.unsubscribe()
        app.exit()
        await task
