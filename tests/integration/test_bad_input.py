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
from gpumedic_bus.streams import DEAD_LETTERS
from gpumedic_bus.topology import REQUESTS
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
    subjects = {s._resolved_subject_string for s in app.broker.subscribers}
    subjects |= {c._event_type.subject_filter() for c in app.runtime._push_consumers}
    return subjects


@pytest.mark.parametrize("service", sorted(CONSUMERS))
async def test_every_kind_of_bad_input_is_dead_lettered_and_the_service_lives_on(service, nats_settings, js, tmp_path):
    app = service_app(service, nats_settings, tmp_path)
    answered = {r.subject for r in REQUESTS if r.service == service}  # request-reply, answered not consumed
    assert _consumed(app) == {e.subject_filter() for e in CONSUMERS[service]} | answered, "proto.CONSUMERS is out of date"
    task = asyncio.create_task(app.run())
    await asyncio.wait_for(app.runtime.ready.wait(), 20)
    try:
        sent = []
        for event_type in CONSUMERS[service]:
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
        for event, kind, subject, reason in sent:
            assert any(r.original_subject == subject and reason in r.reason for r in records), (event, kind, reason)
        oversize = [r for r in records if r.payload_bytes > MAX_EVENT_BYTES]
        assert oversize and all(r.payload_truncated for r in oversize)
        assert app.runtime.metrics.rejected() == len(sent)
        assert not task.done(), "the service stopped"
        assert app.runtime.ready.is_set()
    finally:
        app.exit()
        await asyncio.wait_for(task, 15)
