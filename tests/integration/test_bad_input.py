"""Bad input on every subject every service consumes, against a real nats-server: malformed
JSON, wrong types, an unknown schema version, an oversize payload, a payload on the wrong
subject. None is processed as if valid, none crashes the service: each is logged, counted,
and kept in the dead-letter stream with the subject and the reason. The list of consumed
subjects is the contract's (proto.CONSUMERS), checked against what each service subscribes to."""

from __future__ import annotations

import asyncio
import json

import pytest

from gpumedic.proto import CONSUMERS
from gpumedic_bus.streams import DEAD_LETTERS, STREAMS
from gpumedic_bus.topology import LIVE, ONE_ACTIVE, REQUESTS
from gpumedic_events import MAX_EVENT_BYTES, MessageRejected
from gpumedic_events.base import json_examples
from tests.integration.services import service_app


def _bad_payloads(event_type) -> dict[str, tuple[str, bytes, str]]:
    """kind -> (subject, payload, words the rejection reason must contain)."""
    example = json_examples(event_type)[0]
    fixed = event_type.subject_key is None
    subject = event_type.subject_prefix if fixed else event_type.subject_for(example[event_type.subject_key])
    wrong_type = {**example, "occurred_at": 12, "source": ["not", "a", "token"]}
    future = {**example, "schema_version": 2}
    oversize = json.dumps({**example, "padding": "x" * (MAX_EVENT_BYTES + 1)}).encode()
    bad = {
        "malformed json": (subject, b'{"event_id": "abc", ', "Invalid JSON"),
        "wrong types": (subject, json.dumps(wrong_type).encode(), "source"),
        "unknown version": (subject, json.dumps(future).encode(), "schema_version"),
        "oversize": (subject, oversize, "exceeds"),
    }
    if not fixed:  # a fixed subject has no other subject the payload could belong on
        bad["wrong subject"] = (event_type.subject_for("someone-else"), json.dumps(example).encode(), "belongs on")
    return bad


def _consumed(app) -> set[str]:
    """The subjects the service reads, as published (a partitioned stream's consumer filters `<prefix>.>`)."""
    subjects = {s._resolved_subject_string.removesuffix(".>") + ".*" if s._resolved_subject_string.endswith(".>")
                else s._resolved_subject_string for s in app.broker.subscribers}
    subjects |= {c._event_type.subject_filter() for c in app.runtime._paced_consumers}
    subjects |= {event_type.subject_filter() for event_type, *_ in app.runtime._live}
    return subjects


def _dead_lettered(service: str) -> list:
    """What the service dead-letters: all it consumes but what it reads live (skipped there, and
    dead-lettered by that subject's durable consumers)."""
    return [e for e in CONSUMERS[service] if e not in LIVE.get(service, ())]


@pytest.mark.parametrize("service", sorted(CONSUMERS))
async def test_every_kind_of_bad_input_is_dead_lettered_and_the_service_lives_on(service, nats_settings, js, tmp_path):
    app = service_app(service, nats_settings, tmp_path)
    answered = {r.subject for r in REQUESTS if r.service == service}  # request-reply, answered not consumed
    assert _consumed(app) == {e.subject_filter() for e in CONSUMERS[service]} | answered, "proto.CONSUMERS is out of date"
    task = asyncio.create_task(app.run())
    await asyncio.wait_for(app.runtime.ready.wait(), 20)
    try:
        sent = []
        for event_type in _dead_lettered(service):
            for kind, (subject, payload, reason) in _bad_payloads(event_type).items():
                await js.publish(subject, payload)
                sent.append((event_type.__name__, kind, subject, reason))

        dead_subject = MessageRejected.subject_for(service)
        records = []
        for _ in range(200):
            info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=dead_subject)
            if (info.state.messages or 0) >= len(sent):
                break
            await asyncio.sleep(0.05)
        sub = await js.subscribe(dead_subject, ordered_consumer=True)
        for _ in range(len(sent)):
            msg = await sub.next_msg(timeout=5)
            records.append(MessageRejected.from_json(msg.data, subject=msg.subject))
        await sub.unsubscribe()

        assert len(records) == len(sent)
        assert {r.service for r in records} == {service}
        streams = {stream.name: stream for stream in STREAMS}
        for event, kind, subject, reason in sent:  # (a record names the subject as stored: a node's fact with its partition)
            assert any((streams[r.stream].as_published(r.original_subject) if r.stream in streams else r.original_subject) == subject
                       and reason in r.reason for r in records), (event, kind, reason)
        oversize = [r for r in records if r.payload_bytes > MAX_EVENT_BYTES]
        assert oversize and all(r.payload_truncated for r in oversize)
        assert app.runtime.metrics.rejected() == len(sent)
        assert not task.done(), "the service stopped"
        assert app.runtime.ready.is_set()
    finally:
        app.exit()
        await asyncio.wait_for(task, 15)


@pytest.mark.parametrize("service", sorted(CONSUMERS))
async def test_two_instances_dead_letter_each_bad_message_once_and_both_live_on(service, nats_settings, js, tmp_path):
    """Two instances of the service on the same consumers: a one-active service's second instance
    stands by; the others share the work (or, for report-builder's console, both read every
    sample). Either way each bad message is dead-lettered once, and both instances live on."""
    for i in (1, 2):
        (tmp_path / str(i)).mkdir()
    instances = [service_app(service, nats_settings, tmp_path / str(i)) for i in (1, 2)]
    tasks = [asyncio.create_task(app.run()) for app in instances]
    try:
        readiness = [asyncio.create_task(app.runtime.ready.wait()) for app in instances]
        await asyncio.wait(readiness, timeout=20, return_when=asyncio.FIRST_COMPLETED if service in ONE_ACTIVE else asyncio.ALL_COMPLETED)
        for waiting in readiness:
            waiting.cancel()
        ready = [app for app in instances if app.runtime.ready.is_set()]
        assert len(ready) == (1 if service in ONE_ACTIVE else 2), f"{len(ready)} of 2 ready"
        sent = 0
        for event_type in _dead_lettered(service):
            for subject, payload, _ in _bad_payloads(event_type).values():
                await js.publish(subject, payload)
                sent += 1
        dead_subject = MessageRejected.subject_for(service)
        for _ in range(200):
            info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=dead_subject)
            if (info.state.messages or 0) >= sent:
                break
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.0)  # a doubled dead letter would be stored by now
        info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=dead_subject)
        assert info.state.messages == sent
        assert sum(app.runtime.metrics.rejected() for app in instances) >= sent
        assert not any(task.done() for task in tasks), "an instance stopped"
        if service in ONE_ACTIVE:  # still one active, one standing by
            assert [app.runtime.lease is not None and app.runtime.lease.held for app in instances].count(True) == 1
            assert sum(app.runtime.ready.is_set() for app in instances) == 1
    finally:
        for app in instances:
            app.exit()
        for task in tasks:
            await asyncio.wait_for(task, 15)
