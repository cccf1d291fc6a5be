"""The golden examples, the subjects catalogue and the AsyncAPI document agree with models and streams.

What a consumer in another language relies on: an example validates against its schema exactly
as the Python model parses it; every subject lands in exactly one stream; the AsyncAPI document
points at files that exist.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema import Draft202012Validator

from gpumedic import proto
from gpumedic_bus.streams import STREAMS, stream_of
from gpumedic_bus.topology import OPERATOR, SERVICES
from gpumedic_events import EVENT_TYPES, Event, IncidentOpened, NodeSampled
from gpumedic_events.base import json_examples

_PREFIX = re.compile(r"^gpumedic\.v1\.[a-z][a-z0-9_]*\.[a-z][a-z0-9_]*$")


def _load(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _validator(proto_dir: Path, name: str) -> Draft202012Validator:
    schema = _load(proto_dir / "schemas" / f"{name}.json")
    Draft202012Validator.check_schema(schema)
    return Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)


def _nats_matches(pattern: str, subject: str) -> bool:
    """NATS subject matching: `*` is one token, `>` the rest (at least one token)."""
    p, s = pattern.split("."), subject.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(p) == len(s)


@pytest.mark.parametrize("event", EVENT_TYPES, ids=lambda e: e.__name__)
def test_golden_example_validates_and_parses(proto_dir: Path, event: type[Event]) -> None:
    example = _load(proto_dir / "examples" / f"{event.__name__}.json")

    errors = sorted(_validator(proto_dir, event.__name__).iter_errors(example), key=str)
    assert errors == [], [e.message for e in errors]

    parsed = event.model_validate(example)
    assert parsed == event.model_validate(json_examples(event)[0])
    assert parsed.model_dump(mode="json") == example
    assert event.from_json(json.dumps(example), subject=parsed.subject) == parsed


@pytest.mark.parametrize("event", EVENT_TYPES, ids=lambda e: e.__name__)
def test_declared_examples_validate_against_the_schema(proto_dir: Path, event: type[Event]) -> None:
    validator = _validator(proto_dir, event.__name__)
    for example in json_examples(event):
        assert list(validator.iter_errors(example)) == []


def test_schema_and_model_both_reject_a_broken_example(proto_dir: Path) -> None:
    example = _load(proto_dir / "examples" / "NodeSampled.json")
    example["gpus"][0]["utilization_gpu_pct"] = 101
    del example["interval_s"]

    messages = {e.message for e in _validator(proto_dir, "NodeSampled").iter_errors(example)}
    assert any("101" in m for m in messages)
    assert any("interval_s" in m for m in messages)
    with pytest.raises(ValueError):
        NodeSampled.model_validate(example)


def test_unknown_fields_are_accepted_by_schema_and_model(proto_dir: Path) -> None:
    example = _load(proto_dir / "examples" / "IncidentOpened.json")
    example["added_in_a_later_v1"] = {"anything": True}
    assert list(_validator(proto_dir, "IncidentOpened").iter_errors(example)) == []
    IncidentOpened.model_validate(example)


@pytest.mark.parametrize("event", EVENT_TYPES, ids=lambda e: e.__name__)
def test_schema_is_standard_and_the_baseline_names_its_subject_and_stream(proto_dir: Path, event: type[Event]) -> None:
    schema = _load(proto_dir / "schemas" / f"{event.__name__}.json")
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    assert schema["$id"] == f"https://gpumedic.dev/schemas/v1/{event.__name__}.json"
    assert schema["title"] == event.__name__
    # Standard keywords only (a strict validator refuses others): what gpumedic adds is in subjects.json.
    assert not [k for k in _keys(schema) if k.startswith("x-") or k == "discriminator"]
    contract = proto.event_schema(event)
    assert contract["x-subject"] == proto.subject_pattern(event)
    assert contract["x-stream"] == stream_of(event).name
    if event.subject_key is not None:
        assert contract["x-subject"] == f"{event.subject_prefix}.{{{event.subject_key}}}"
        assert event.subject_key in schema["required"], "the routing key is always present"


def _keys(node) -> list[str]:
    if isinstance(node, list):
        return [k for item in node for k in _keys(item)]
    if not isinstance(node, dict):
        return []
    return [*node, *(k for v in node.values() for k in _keys(v))]


def test_each_subject_filter_maps_to_exactly_one_stream() -> None:
    for event in EVENT_TYPES:
        concrete = event.subject_for("x") if event.subject_key else event.subject_prefix
        owners = [s.name for s in STREAMS if any(_nats_matches(f, concrete) for f in s.subjects)]
        assert owners == [stream_of(event).name], f"{event.__name__}: {owners}"
        assert sum(event.subject_filter() in s.subjects for s in STREAMS) == 1


def test_every_stream_event_is_in_the_catalogue() -> None:
    assert sorted(e.__name__ for s in STREAMS for e in s.events) == sorted(e.__name__ for e in EVENT_TYPES)


def test_subject_prefixes_are_unique_and_well_formed() -> None:
    prefixes = [e.subject_prefix for e in EVENT_TYPES]
    assert len(set(prefixes)) == len(prefixes)
    for prefix in prefixes:
        assert _PREFIX.match(prefix), prefix
    for event in EVENT_TYPES:
        assert not any(
            _nats_matches(other.subject_filter(), event.subject_for("x") if event.subject_key else event.subject_prefix)
            for other in EVENT_TYPES
            if other is not event
        ), f"another event's filter also catches {event.__name__}"


def test_subjects_catalogue_lists_every_event(proto_dir: Path) -> None:
    catalogue = _load(proto_dir / "subjects.json")
    rows = {row["event"]: row for row in catalogue["subjects"]}
    assert list(rows) == [e.__name__ for e in EVENT_TYPES]
    for event in EVENT_TYPES:
        row = rows[event.__name__]
        stream = stream_of(event)
        assert row["filter"] == event.subject_filter()
        assert row["routing_key"] == event.subject_key
        assert row["stream"] == stream.name
        assert row["storage"] == stream.storage.value
        assert row["duplicate_window_s"] == stream.duplicate_window_s
        assert row["description"]
        assert (proto_dir / row["schema"]).is_file() and (proto_dir / row["example"]).is_file()
    markdown = (proto_dir / "subjects.md").read_text()
    for event in EVENT_TYPES:
        assert f"`{event.subject_filter()}`" in markdown


def test_asyncapi_document(proto_dir: Path) -> None:
    doc = yaml.safe_load((proto_dir / "asyncapi.yaml").read_text())
    assert doc["asyncapi"] == "3.0.0"
    assert doc["servers"]["local"] == {
        "host": "127.0.0.1:4222",
        "protocol": "nats",
        "description": doc["servers"]["local"]["description"],
    }
    assert set(doc["channels"]) == {e.__name__ for e in EVENT_TYPES}
    for event in EVENT_TYPES:
        channel = doc["channels"][event.__name__]
        assert channel["address"] == proto.subject_pattern(event)
        placeholders = set(re.findall(r"\{(\w+)\}", channel["address"]))
        assert placeholders == set(channel.get("parameters", {}))
        message = doc["components"]["messages"][event.__name__]
        assert (proto_dir / message["payload"]["$ref"]).is_file()
        assert message["examples"][0]["payload"] == _load(proto_dir / "examples" / f"{event.__name__}.json")

    senders: dict[str, set[str]] = {}
    for op_id, op in doc["operations"].items():
        assert op["action"] in {"send", "receive"}, op_id
        channel_name = op["channel"]["$ref"].removeprefix("#/channels/")
        assert channel_name in doc["channels"], op_id
        for ref in op["messages"]:
            message_name = ref["$ref"].removeprefix(f"#/channels/{channel_name}/messages/")
            assert message_name in doc["channels"][channel_name]["messages"], op_id
        if op["action"] == "send":
            senders.setdefault(channel_name, set()).add(op_id.split(".")[0])
    for event in EVENT_TYPES:
        assert senders[event.__name__] == set(proto.PRODUCERS[event]), event.__name__
    assert "remediator.receive.ActionRequested" in doc["operations"]
    assert "zombie-detector.receive.NodeSampled" in doc["operations"]


def test_producers_and_consumers_cover_the_catalogue() -> None:
    assert set(proto.PRODUCERS) == set(EVENT_TYPES)
    for service, events in proto.CONSUMERS.items():
        assert service in SERVICES
        assert set(events) <= set(EVENT_TYPES)
    for services in proto.PRODUCERS.values():
        # The six services, and the operator's tools (a person's silences)
        assert set(services) <= {*SERVICES, OPERATOR}


def test_open_enums_accept_a_value_added_later_and_the_baseline_still_lists_their_values(proto_dir: Path) -> None:
    marked, open_in_schemas = set(), set()
    for path in (proto_dir / "baseline" / "v1").glob("*.json"):
        marked |= {n for n, d in _load(path).get("$defs", {}).items() if d.get("x-extensible-enum") and d.get("enum")}
    for path in (proto_dir / "schemas").glob("*.json"):
        for name, definition in _load(path).get("$defs", {}).items():
            if name in proto.OPEN_ENUMS:
                assert "enum" not in definition and definition["type"] == "string" and definition["examples"]
                open_in_schemas.add(name)
    assert marked == open_in_schemas == set(proto.OPEN_ENUMS)
    example = json.loads((proto_dir / "examples" / "IncidentOpened.json").read_text()) | {"kind": "a_kind_from_v1_later"}
    assert list(_validator(proto_dir, "IncidentOpened").iter_errors(example)) == []
    assert "generated, do not edit" in (proto_dir / "README.md").read_text().splitlines()[2]
