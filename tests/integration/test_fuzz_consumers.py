"""Property-based fuzzing of every consuming service against a real nats-server: Hypothesis writes
batches of messages for every subject the service consumes (documented examples with fields
replaced by hostile or nonsensical values, arbitrary JSON, raw bytes, the wrong subject), and
each batch is published to the real streams while the real service runs.

Whatever the batch, the service stays up and ready, and every message ends exactly once: handled,
or dead-lettered with its digest and a reason. What the events library refuses to decode is
dead-lettered, never handled; what it decodes is handled by the service's own code, which must not
fail on it. `make test` tries a few batches per service; `make fuzz` a hundred.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import tempfile
from pathlib import Path

import nats
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpumedic.natsd import NatsServer
from gpumedic.proto import CONSUMERS
from gpumedic_bus import NatsSettings, provision
from gpumedic_bus.streams import DEAD_LETTERS
from gpumedic_bus.topology import LIVE, PRODUCERS
from gpumedic_events import EventDecodeError, MessageRejected
from gpumedic_events.base import json_examples
from tests.fixtures.nats import TEST_TIMINGS
from tests.integration.services import service_app

HOSTILE = st.sampled_from([
    "", " ", "x" * 3000, "; rm -rf / #", "$(reboot)", "`id`", "../../etc/passwd", "<script>alert(1)</script>",
    "\u202egnp.exe", "\x00", "a\nb\r\nc", "%s%n%x", "{{7*7}}", "' OR 1=1 --", "gpu-node-07", "0", "-1", "1e309",
])
TEXT = HOSTILE | st.text(max_size=80)
LEAF = st.none() | st.booleans() | st.integers(min_value=-(2**70), max_value=2**70) | st.floats(allow_nan=False) | TEXT
JSON = st.recursive(LEAF, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=12)
HOSTILE_BODIES = st.sampled_from([
    b"[" * 100_000 + b"]" * 100_000,  # nesting deeper than any recursive decoder goes
    b'{"a":' * 5_000 + b"1" + b"}" * 5_000,
    b'{"event_id": ' + b"9" * 5_000 + b"}",  # more digits than Python's int() takes from text
    b'{"schema_version": 1' + b"0" * 5_000 + b"}",
    b'{"reason": "\xff\xfe\xfd", "source": "\xc3\x28"}'.decode("unicode_escape").encode("latin-1"),  # invalid UTF-8
    b"\xff\xfe\x00\x01".decode("unicode_escape").encode("latin-1"),
    b'{"summary": "' + b"x" * 600_000 + b'"}',  # larger than an event may be
    b'"' + b"\\u0000" * 50_000 + b'"',
])
"""Bodies that break a decoder rather than a model: each must still end once, dead-lettered."""
EXAMPLES = int(os.environ.get("GPUMEDIC_FUZZ_EXAMPLES", "3"))
"""Batches per service: a few in `make test`, many in `make fuzz`."""
DERANDOMIZE = "GPUMEDIC_FUZZ_EXAMPLES" not in os.environ
"""`make test` tries the same few batches every run; `make fuzz` explores new ones each time."""
FUZZ_TIMINGS = {**TEST_TIMINGS, "ack_wait_s": 30.0}
"""Redelivery is not what this test counts: with the 2 s AckWait of the other tests, a loaded
machine that takes longer than that over a batch sees a message delivered (and ended) twice."""
TOKEN = st.from_regex(r"[a-z0-9][a-z0-9_-]{0,20}", fullmatch=True)


def _messages(event_type) -> st.SearchStrategy[tuple[str, bytes]]:
    """(subject, body) for one event type: mostly its example with a few fields changed."""
    example = json_examples(event_type)[0]
    fixed = event_type.subject_key is None

    def subject(token: str | None) -> str:
        if fixed:
            return event_type.subject_prefix
        return event_type.subject_for(token if token is not None else example[event_type.subject_key])

    changed = st.dictionaries(st.sampled_from(sorted(example)), JSON, min_size=1, max_size=3).map(lambda c: {**example, **c})
    # Hostile text where the example has free text, under a fresh event id: most of it decodes and
    # so reaches the service's own handlers.
    texts = sorted(k for k, v in example.items() if isinstance(v, str) and k not in ("event_id", "occurred_at", event_type.subject_key))
    worded = st.tuples(st.uuids().map(str), st.dictionaries(st.sampled_from(texts or ["source"]), TEXT, max_size=2)).map(
        lambda t: {**example, "event_id": t[0], **t[1]})
    body = st.one_of(
        worded.map(lambda d: json.dumps(d).encode()),
        worded.map(lambda d: json.dumps(d).encode()),
        changed.map(lambda d: json.dumps(d).encode()),
        changed.map(lambda d: json.dumps({k: v for k, v in d.items() if k != "event_id"}).encode()),
        JSON.map(lambda d: json.dumps(d).encode()),
        st.binary(max_size=200),
        HOSTILE_BODIES,
        HOSTILE_BODIES,
    )
    token = st.one_of(st.none(), st.none(), st.none(), TOKEN)  # now and then a subject the body does not belong on
    return st.tuples(token, body).map(lambda t: (subject(t[0]), t[1]))


def _decodes(event_type, subject: str, body: bytes, read_as=None) -> bool:
    """Whether the body decodes as the service reads it (`read_as`: the event, or its view)."""
    try:
        event_type.decode_as(read_as or event_type, body, subject=subject)
    except (EventDecodeError, UnicodeDecodeError, ValueError, RecursionError):
        return False
    return True


@pytest.mark.timeout(300)
@pytest.mark.parametrize("service", sorted(CONSUMERS))
def test_no_batch_of_messages_stops_a_service_or_goes_unaccounted(service):
    strategies = {event_type: st.lists(_messages(event_type), min_size=4, max_size=12) for event_type in CONSUMERS[service]}

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(st.fixed_dictionaries(strategies))
    def run(batch) -> None:
        asyncio.run(_exercise(service, batch))

    run()


async def _exercise(service: str, batch: dict) -> None:
    with tempfile.TemporaryDirectory(prefix="gpumedic-fuzz-") as tmp:
        tmp_path = Path(tmp)
        with NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log") as server:
            settings = NatsSettings(url=server.url, **FUZZ_TIMINGS)
            nc = await nats.connect(server.url)
            js = nc.jetstream()
            await provision(js, settings)
            app = service_app(service, settings, tmp_path)
            task = asyncio.create_task(app.run())
            try:
                await asyncio.wait_for(app.runtime.ready.wait(), 20)
                refused, refused_sent, sent = set(), 0, 0
                # What the service also publishes itself (report-builder reads every span export, its
                # own too) cannot be counted by the handled metric; its refused messages are still
                # awaited as dead letters below.
                counted = {e.__name__ for e in batch if service not in PRODUCERS.get(e, ())}
                for event_type, messages in batch.items():
                    for subject, body in messages:
                        await js.publish(subject, body)
                        sent += event_type.__name__ in counted
                        if not _decodes(event_type, subject, body, app.runtime.reads(event_type)) and event_type not in LIVE.get(service, ()):
                            refused.add(hashlib.sha256(body).hexdigest())  # a live reader skips it instead
                            refused_sent += 1
                ended = 0
                for _ in range(300):  # every message ends once: ok, invalid or failed ("retried" is not an end)
                    ended = _ended(app.runtime.metrics, counted)
                    if ended >= sent or task.done():
                        break
                    await asyncio.sleep(0.1)
                assert not task.done(), f"{service} stopped"
                assert app.runtime.ready.is_set()
                assert ended == sent, f"{service}: {ended} of {sent} messages ended"
                dead = await _dead_letters(js, service, max(app.runtime.metrics.rejected(), refused_sent))
                failed = [d for d in dead if d.payload_sha256 not in refused]
                assert not failed, f"{service} failed on messages that decode: {[d.reason for d in failed][:3]}"
                assert {d.payload_sha256 for d in dead} == refused
                assert all(d.reason for d in dead)
            finally:
                app.exit()
                await asyncio.wait_for(task, 15)
                await nc.close()


def _ended(metrics, events: set[str]) -> int:
    """Messages of the batch's event types that ended (not those the service reads of its own
    accord meanwhile, such as report-builder's console reading every heartbeat)."""
    return int(sum(s.value for metric in metrics.handled.collect() for s in metric.samples
                   if s.name.endswith("_total") and s.labels["outcome"] != "retried" and s.labels["event"] in events))


async def _dead_letters(js, service: str, expected: int) -> list[MessageRejected]:
    subject = MessageRejected.subject_for(service)
    for _ in range(100):
        info = await js.stream_info(DEAD_LETTERS.name, subjects_filter=subject)
        if (info.state.messages or 0) >= expected:
            break
        await asyncio.sleep(0.05)
    if not expected:
        return []
    sub = await js.subscribe(subject, ordered_consumer=True)
    try:
        return [MessageRejected.from_json((await sub.next_msg(timeout=5)).data) for _ in range(expected)]
    finally:
        await sub.unsubscribe()


@pytest.mark.timeout(300)
def test_every_preflight_request_is_answered_whatever_its_body():
    """The request-reply subject: a body that decodes nowhere is answered with the error, never left
    waiting (the asker's timeout is the only other end a request has)."""
    from gpumedic_events import PREFLIGHT_SUBJECT, PreflightReport

    bodies = st.lists(st.one_of(HOSTILE_BODIES, JSON.map(lambda d: json.dumps(d).encode()), st.binary(max_size=200)), min_size=4, max_size=10)

    async def ask_all(requests: list[bytes]) -> None:
        with tempfile.TemporaryDirectory(prefix="gpumedic-fuzz-") as tmp:
            tmp_path = Path(tmp)
            with NatsServer(tmp_path / "nats", log_file=tmp_path / "nats.log") as server:
                settings = NatsSettings(url=server.url, **TEST_TIMINGS)
                nc = await nats.connect(server.url)
                await provision(nc.jetstream(), settings)
                app = service_app("remediator", settings, tmp_path)
                task = asyncio.create_task(app.run())
                try:
                    await asyncio.wait_for(app.runtime.ready.wait(), 20)
                    for body in requests:
                        answer = await nc.request(PREFLIGHT_SUBJECT, body, timeout=10)
                        report = PreflightReport.model_validate_json(answer.data)
                        assert not report.ready and report.error, report
                finally:
                    app.exit()
                    await asyncio.wait_for(task, 15)
                    await nc.close()

    @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=DERANDOMIZE, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    @given(bodies)
    def run(requests) -> None:
        asyncio.run(ask_all(requests))

    run()
