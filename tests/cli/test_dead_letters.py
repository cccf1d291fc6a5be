"""`gpumedic dead-letters`: what the services refused, with the reason, and a replay of chosen ones
once the cause is fixed: the stream's own copy of the original, into its stream, at most once
(recorded in the store, however far apart the replays are asked for), and only when the record
matches what the stream holds."""

from __future__ import annotations

import asyncio
import json

import pytest
from gpumedic.cli import main
from gpumedic_bus.consume import REPLAY_FOR, REPLAY_OF, rejection
from gpumedic_bus.streams import ACTIONS, DEAD_LETTERS, INCIDENTS
from gpumedic_events import ActionCompleted, IncidentOpened
from gpumedic_events.base import json_examples
from gpumedic_events.deadletter import MAX_KEPT_PAYLOAD
from gpumedic_store.migrate import upgrade

OPENED = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])


async def _keep(js, record) -> int:
    return (await js.publish(record.subject, record.to_json(), stream=DEAD_LETTERS.name)).seq


async def _stored(js, subject: str, body: bytes) -> tuple[str, int]:
    """Publish as its producer would; where the stream keeps it."""
    ack = await js.publish(subject, body, stream=INCIDENTS.name)
    return ack.stream, ack.seq


@pytest.fixture
def store(tmp_path, monkeypatch):
    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    monkeypatch.setenv("GPUMEDIC_STORE_URL", url)
    return url


async def test_dead_letters_are_listed_with_their_reason_and_replayed_once(js, nats_url, store, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    body = OPENED.to_json()
    where = await _stored(js, OPENED.subject, body)
    store_down = await _keep(js, rejection("report-builder", OPENED.subject, body, "handler failed 5 times: store down", 5, stored=where))
    big = b'{"x": "' + b"a" * (MAX_KEPT_PAYLOAD + 10) + b'"}'
    cut = await _keep(js, rejection("report-builder", OPENED.subject, big, "too big", 1, stored=await _stored(js, OPENED.subject, big)))
    not_text = await _keep(js, rejection("report-builder", OPENED.subject, b'{"a": "\xff\xfe"}', "not UTF-8", 1))

    assert await asyncio.to_thread(main, ["dead-letters", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["seq"] for d in listed] == [not_text, cut, store_down]  # newest first
    assert listed[2]["reason"] == "handler failed 5 times: store down" and listed[2]["service"] == "report-builder"
    assert listed[2]["stream"] == INCIDENTS.name and listed[2]["stream_sequence"] == where[1]
    assert await asyncio.to_thread(main, ["dead-letters", "--service", "zombie-detector"]) == 0
    assert capsys.readouterr().out.strip() == "no dead letters of zombie-detector"

    before = (await js.stream_info(INCIDENTS.name)).state.messages
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(store_down), "--by", "alice"]) == 0
    assert f"dead letter {store_down}: replayed to report-builder-IncidentOpened on {OPENED.subject} (stored as {INCIDENTS.name}" \
        in capsys.readouterr().out
    stored = await js.get_msg(INCIDENTS.name, seq=(await js.stream_info(INCIDENTS.name)).state.last_seq)
    assert stored.data == body  # byte for byte what was refused

    # Past the stream's duplicate window (the replay's Nats-Msg-Id is forgotten): the store still says no.
    config = (await js.stream_info(INCIDENTS.name)).config
    config.duplicate_window = 0.5
    await js.update_stream(config)  # the next test's provisioning puts the declared window back
    await asyncio.sleep(1.0)
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(store_down)]) == 1
    out = capsys.readouterr().out
    assert f"dead letter {store_down}: already replayed: {INCIDENTS.name} #{where[1]} was delivered again by alice" in out
    assert (await js.stream_info(INCIDENTS.name)).state.messages == before + 1

    # A record cut at 64 KiB is no obstacle: the stream's own copy is what goes.
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(cut)]) == 0
    assert f"dead letter {cut}: replayed" in capsys.readouterr().out
    stored = await js.get_msg(INCIDENTS.name, seq=(await js.stream_info(INCIDENTS.name)).state.last_seq)
    assert stored.data == big

    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(not_text), "99999"]) == 1
    out = capsys.readouterr().out
    assert f"dead letter {not_text}: not replayed: the record does not say where the stream keeps the original" in out
    assert "dead letter 99999: not found" in out
    assert (await js.stream_info(INCIDENTS.name)).state.messages == before + 2


async def test_the_same_message_refused_by_two_services_is_replayed_once_to_each(js, nats_url, store, monkeypatch, capsys):
    """Each service that refused it keeps a dead letter; the original goes again once to each, and
    only to it (the header names its durable)."""
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    completed = ActionCompleted.model_validate(json_examples(ActionCompleted)[0])
    body = completed.to_json()
    ack = await js.publish(completed.subject, body, stream=ACTIONS.name)
    first = await _keep(js, rejection("report-builder", completed.subject, body, "store down", 5, stored=(ack.stream, ack.seq)))
    second = await _keep(js, rejection("autoscaler", completed.subject, body, "provider down", 5, stored=(ack.stream, ack.seq)))
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(first), str(first), str(second)]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith(f"dead letter {first}: replayed to report-builder-ActionCompleted")
    assert out[1].startswith(f"dead letter {first}: already replayed")
    assert out[2].startswith(f"dead letter {second}: replayed to autoscaler-actions")
    last = (await js.stream_info(ACTIONS.name)).state.last_seq
    copies = [await js.get_msg(ACTIONS.name, seq=seq) for seq in (last - 1, last)]
    assert [(c.data, c.headers[REPLAY_FOR], c.headers[REPLAY_OF]) for c in copies] == [
        (body, "report-builder-ActionCompleted", str(ack.seq)), (body, "autoscaler-actions", str(ack.seq))
    ]


def test_without_a_bus_it_says_how_to_reach_one(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUMEDIC_NATS_URL", raising=False)
    assert main(["dead-letters", "--var", str(tmp_path)]) == 2
    assert "no embedded stack runs under" in capsys.readouterr().err


async def test_a_replay_without_a_store_says_where_it_looked(js, nats_url, tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    monkeypatch.delenv("GPUMEDIC_STORE_URL", raising=False)
    assert await asyncio.to_thread(main, ["dead-letters", "replay", "1", "--var", str(tmp_path)]) == 2
    assert "no store at" in capsys.readouterr().err
