"""The views of a sample (`gpumedic_events.views`) read what the event reads, as it reads it.

A consumer that decodes a view instead of the whole sample must get the same values for every
field the view names, and be refused what the event refuses in those fields; what the view does
not name is not read at all. The detector's view names everything (`Sample`): it must take and
refuse exactly what the event does, anywhere in the body.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from benchmarks import node_sample
from gpumedic_events import EventDecodeError, NodeSampled
from gpumedic_events.views import Sample, SampleFigures, SampleLoad

VIEWS = (SampleFigures, SampleLoad, Sample)


def _struct_in(kind: Any) -> type[msgspec.Struct] | None:
    """The struct a field's type holds (itself, or inside Annotated, a union or a tuple)."""
    if isinstance(kind, type) and issubclass(kind, msgspec.Struct):
        return kind
    return next((s for s in map(_struct_in, typing.get_args(kind)) if s is not None), None)


def _read_by(view: type[msgspec.Struct], dumped: object) -> object:
    """`dumped` (the whole event's dump) cut to the fields `view` names, nested views included."""
    if isinstance(dumped, list):
        return [_read_by(view, item) for item in dumped]
    if not isinstance(dumped, dict):
        return dumped
    out = {}
    for field in msgspec.structs.fields(view):
        nested = _struct_in(field.type)
        value = dumped[field.name]
        out[field.name] = _read_by(nested, value) if nested is not None and value is not None else value
    return out


def _bodies(proto_dir: Path) -> list[bytes]:
    golden = (proto_dir / "examples" / "NodeSampled.json").read_bytes()
    sent = [golden, node_sample("gpu-node-07", health=True).to_json(), node_sample("gpu-node-08", zombie=True).to_json()]
    # as another producer may write them: a time in another zone (made UTC), a number as a string (lax, as pydantic reads it)
    elsewhere = _broken(sent[1], lambda d: d.update(occurred_at="2026-11-22T12:00:00.5+02:00"))
    as_text = _broken(sent[1], lambda d: d["gpus"][1].update(utilization_gpu_pct="87"))
    return [*sent, elsewhere, as_text]


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
def test_a_view_reads_each_field_it_names_as_the_event_does(proto_dir, view):
    for body in _bodies(proto_dir):
        event = NodeSampled.from_json(body)
        seen = NodeSampled.decode_as(view, body, subject=event.subject)
        assert json.loads(msgspec.json.encode(seen)) == _read_by(view, event.model_dump(mode="json"))
        if view is not Sample:
            assert set(view.__struct_fields__) < set(NodeSampled.model_fields)  # a view, not the event again


def _broken(body: bytes, change) -> bytes:
    document = json.loads(body)
    change(document)
    return json.dumps(document).encode()


REFUSED_BY_BOTH = {
    "a GPU's utilization over 100 %": (lambda d: d["gpus"][0].update(utilization_gpu_pct=101), "gpus.0.utilization_gpu_pct"),
    "a node id that is no subject token": (lambda d: d.update(node_id="gpu node"), "node_id"),
    "a time without its zone": (lambda d: d.update(occurred_at="2026-11-22T10:00:00"), "occurred_at"),
    "host memory below zero": (lambda d: d["host"].update(memory_total_mib=-1), "host.memory_total_mib"),
}


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
@pytest.mark.parametrize("case", sorted(REFUSED_BY_BOTH))
def test_a_view_refuses_what_the_event_refuses_in_the_fields_it_reads(proto_dir, view, case):
    change, where = REFUSED_BY_BOTH[case]
    body = _broken(_bodies(proto_dir)[1], change)
    with pytest.raises(EventDecodeError) as whole:
        NodeSampled.from_json(body)
    with pytest.raises(EventDecodeError) as viewed:
        NodeSampled.decode_as(view, body)
    assert where in whole.value.reason and where in viewed.value.reason


@pytest.mark.parametrize("view", VIEWS, ids=lambda v: v.__name__)
@pytest.mark.parametrize("body", [b'{"a":' * 5_000 + b"1" + b"}" * 5_000, b"[" * 100_000 + b"]" * 100_000, b"\xff\xfe\x00\x01", b"null"],
                         ids=["nested objects", "nested arrays", "bytes", "null"])
def test_a_body_that_breaks_a_decoder_is_refused_with_its_reason(view, body):
    with pytest.raises(EventDecodeError) as refused:
        NodeSampled.decode_as(view, body)
    assert refused.value.reason.startswith("<body>: ")


def test_a_view_skips_what_it_does_not_read_and_still_checks_the_subject(proto_dir):
    body = _broken(_bodies(proto_dir)[1], lambda d: d["gpus"][0]["processes"][0].update(pid=0))
    with pytest.raises(EventDecodeError, match="gpus.0.processes.0.pid"):
        NodeSampled.from_json(body)
    assert NodeSampled.decode_as(SampleLoad, body).node_id == "gpu-node-07"  # a load view reads no process
    with pytest.raises(EventDecodeError, match="belongs on gpumedic.v1.node.sampled.gpu-node-07"):
        NodeSampled.decode_as(SampleLoad, node_sample("gpu-node-07").to_json(), subject=NodeSampled.subject_for("gpu-node-08"))


def test_a_view_of_what_it_cannot_check_as_the_event_does_is_refused_at_import():
    from pydantic import BaseModel, Field, field_validator

    from gpumedic_events.views import view_of

    class Even(BaseModel):
        n: int = Field(multiple_of=2)

    class Trimmed(BaseModel):
        text: str

        @field_validator("text", mode="before")
        @classmethod
        def _trim(cls, value):
            return value.strip()

    with pytest.raises(TypeError, match="MultipleOf"):
        view_of(Even, "EvenView", ("n",))
    with pytest.raises(TypeError, match="before validator"):
        view_of(Trimmed, "TrimmedView", ("text",))


def test_the_whole_view_carries_the_models_properties():
    tags = [{"id": "slurm:42", "world_size": 16, "local_world_size": 8}, {"id": "slurm:43", "nodes": 1, "world_size": 8},
            {"id": "torchelastic:run-1", "nodes": 2}, {"id": "slurm:44"}]
    document = json.loads(node_sample("gpu-node-07").to_json())
    for gpu, tag in zip(document["gpus"], tags, strict=False):
        gpu["processes"][0]["job"] = tag
    body = json.dumps(document).encode()
    event, seen = NodeSampled.from_json(body), NodeSampled.decode_as(Sample, body)
    said = [(g.processes[0].job.spans_nodes, h.processes[0].job.spans_nodes) for g, h in zip(event.gpus[:4], seen.gpus, strict=False)]
    assert said == [(True, True), (False, False), (True, True), (False, False)]


def _paths(document: object, path: tuple = ()) -> list[tuple]:
    """Every place in a JSON document: each key of each object and each item of each list."""
    found = [path]
    if isinstance(document, dict):
        found += [p for key, value in document.items() for p in _paths(value, (*path, key))]
    elif isinstance(document, list):
        found += [p for i, value in enumerate(document) for p in _paths(value, (*path, i))]
    return found


def _replaced(document: object, path: tuple, value: object) -> object:
    if not path:
        return value
    head, rest = path[0], path[1:]
    if isinstance(document, dict):
        return {**document, head: _replaced(document[head], rest, value)}
    return [_replaced(item, rest, value) if i == head else item for i, item in enumerate(document)]


_SENT = json.loads(node_sample("gpu-node-07", health=True).to_json())
_LEAF = (st.none() | st.booleans() | st.integers(min_value=-(2**66), max_value=2**66) | st.floats(allow_nan=False)
         | st.sampled_from(["", "x", "87", "-1", "1e3", "2026-11-22T10:00:00", "2026-11-22T10:00:00+02:00", "gpu node", "a" * 300])
         | st.text(max_size=12))
_VALUES = st.recursive(_LEAF, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3), max_leaves=6)


@settings(max_examples=300, derandomize=True, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(changes=st.lists(st.tuples(st.sampled_from(_paths(_SENT)[1:]), _VALUES), min_size=1, max_size=3))
def test_the_whole_view_takes_and_refuses_exactly_what_the_event_does(changes):
    document: object = _SENT
    for path, value in changes:
        try:
            document = _replaced(document, path, value)
        except (KeyError, IndexError, TypeError):  # an earlier change took that place away
            continue
    body = json.dumps(document).encode()
    try:
        event = NodeSampled.from_json(body)
    except EventDecodeError as refused:
        with pytest.raises(EventDecodeError) as also:
            NodeSampled.decode_as(Sample, body)
        assert also.value.reason == refused.reason  # said in the event's own words
        return
    seen = NodeSampled.decode_as(Sample, body)
    assert json.loads(msgspec.json.encode(seen)) == event.model_dump(mode="json")
