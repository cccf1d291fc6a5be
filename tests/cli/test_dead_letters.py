"""`gpumedic dead-letters`: what the services refused, with the reason, and a replay of chosen ones
once the cause is fixed (each kept once by the stream), never of a payload that is not what was sent."""

from __future__ import annotations

import asyncio
import json

from gpumedic.cli import main
from gpumedic_bus.consume import rejection
from gpumedic_bus.streams import DEAD_LETTERS, INCIDENTS
from gpumedic_events import IncidentOpened
from gpumedic_events.base import json_examples
from gpumedic_events.deadletter import MAX_KEPT_PAYLOAD

OPENED = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])


async def _keep(js, record) -> int:
    return (await js.publish(record.subject, record.to_json(), stream=DEAD_LETTERS.name)).seq


async def test_dead_letters_are_listed_with_their_reason_and_replayed_once(js, nats_url, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    body = OPENED.to_json()
    store_down = await _keep(js, rejection("report-builder", OPENED.subject, body, "handler failed 5 times: store down", 5))
    cut = await _keep(js, rejection("report-builder", OPENED.subject, b'{"x": "' + b"a" * (MAX_KEPT_PAYLOAD + 10) + b'"}', "too big", 1))
    not_text = await _keep(js, rejection("zombie-detector", OPENED.subject, b'{"a": "\xff\xfe"}', "not UTF-8", 1))

    assert await asyncio.to_thread(main, ["dead-letters", "list", "--json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert [d["seq"] for d in listed] == [not_text, cut, store_down]  # newest first
    assert listed[2]["reason"] == "handler failed 5 times: store down" and listed[2]["service"] == "report-builder"
    assert await asyncio.to_thread(main, ["dead-letters", "--service", "zombie-detector"]) == 0
    table = capsys.readouterr().out
    assert "not UTF-8" in table and "store down" not in table

    before = (await js.stream_info(INCIDENTS.name)).state.messages
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(store_down)]) == 0
    assert f"dead letter {store_down}: replayed to {OPENED.subject} (stored as {INCIDENTS.name}" in capsys.readouterr().out
    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(store_down)]) == 0
    assert "already replayed" in capsys.readouterr().out
    assert (await js.stream_info(INCIDENTS.name)).state.messages == before + 1
    stored = await js.get_msg(INCIDENTS.name, seq=(await js.stream_info(INCIDENTS.name)).state.last_seq)
    assert IncidentOpened.from_json(stored.data, subject=stored.subject) == OPENED  # byte for byte what was refused

    assert await asyncio.to_thread(main, ["dead-letters", "replay", str(cut), str(not_text), "99999"]) == 1
    out = capsys.readouterr().out
    assert f"dead letter {cut}: not replayed: only its first" in out
    assert f"dead letter {not_text}: not replayed: its bytes were not valid text" in out
    assert "dead letter 99999: not found" in out
    assert (await js.stream_info(INCIDENTS.name)).state.messages == before + 1


def test_without_a_bus_it_says_how_to_reach_one(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUMEDIC_NATS_URL", raising=False)
    assert main(["dead-letters", "--var", str(tmp_path)]) == 2
    assert "no embedded stack runs under" in capsys.readouterr().err
