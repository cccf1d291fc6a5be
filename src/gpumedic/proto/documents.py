"""The pieces of proto/: each event's JSON Schema and golden example, the subjects catalogue
(JSON and markdown) and the README, all derived from the event models and the bus topology."""

from __future__ import annotations

import inspect
import re
from collections.abc import Mapping
from typing import Any

from gpumedic_bus.streams import PARTITIONS, STREAMS, Stream, stream_of
from gpumedic_bus.topology import PRODUCERS, consumers
from gpumedic_events import EVENT_TYPES, Event
from gpumedic_events.base import json_examples

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID_BASE = "https://gpumedic.dev/schemas/v1/"
BASELINE_DIR = "baseline/v1"
NATS_URL = "nats://127.0.0.1:4222"

CONSUMERS: Mapping[str, tuple[type[Event], ...]] = consumers()
"""Which service subscribes to which events (over NATS; leader-health probes HTTP instead)."""

OPEN_ENUMS: frozenset[str] = frozenset({"IncidentKind"})
"""Enums documented as open within v1: new values may appear and consumers must accept them.

Marked `x-extensible-enum: true` in the schemas; every other enum is closed for v1."""


class ContractError(RuntimeError):
    """The models cannot be turned into a contract (an event without example, producer or stream)."""


def subject_pattern(event: type[Event]) -> str:
    """The subject with its routing token as a `{field}` placeholder, e.g. `...sampled.{node_id}`."""
    if event.subject_key is None:
        return event.subject_prefix
    return f"{event.subject_prefix}.{{{event.subject_key}}}"


def event_schema(event: type[Event]) -> dict[str, Any]:
    """The event's contract schema (draft 2020-12, validation mode) with its subject and stream:
    what the v1 baseline holds and the compatibility check compares."""
    schema = event.model_json_schema(mode="validation")
    schema["$schema"] = SCHEMA_DIALECT
    schema["$id"] = f"{SCHEMA_ID_BASE}{event.__name__}.json"
    schema["title"] = event.__name__
    schema["x-subject"] = subject_pattern(event)
    schema["x-stream"] = stream_of(event).name
    for name, definition in schema.get("$defs", {}).items():
        if name in OPEN_ENUMS and "enum" in definition:
            definition["x-extensible-enum"] = True
    return schema


def published_schema(event: type[Event]) -> dict[str, Any]:
    """The schema consumers validate with: standard JSON Schema 2020-12 only, so a strict validator
    (Ajv with its default options) compiles it. The subject and stream are in subjects.json; an open
    enum (`OPEN_ENUMS`) is a string whose known values are its `examples`, so a value added within
    v1 validates; OpenAPI's `discriminator` (the `const` of each variant already decides) goes."""
    return _standard(event_schema(event))


def _standard(node: Any) -> Any:
    if isinstance(node, list):
        return [_standard(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {k: _standard(v) for k, v in node.items() if not k.startswith("x-") and k != "discriminator"}
    if node.get("x-extensible-enum") and "enum" in out:
        out["examples"] = out.pop("enum")
        out.setdefault("type", "string")
    return out


def golden_example(event: type[Event]) -> dict[str, Any]:
    """The model's first declared example, round-tripped so it is exactly what the model emits."""
    examples = json_examples(event)
    if not examples:
        raise ContractError(f"{event.__name__} declares no example (model_config json_schema_extra examples)")
    return event.model_validate(examples[0]).model_dump(mode="json")


def summary_of(event: type[Event]) -> str:
    """The docstring's first sentence (which may wrap over lines)."""
    paragraph = " ".join((inspect.getdoc(event) or "").split("\n\n")[0].split())
    first = re.match(r"(.+?[.!?])(?:\s|$)", paragraph)
    return first.group(1) if first else paragraph


def _stream_entry(stream: Stream) -> dict[str, Any]:
    return {
        "name": stream.name,
        "description": stream.description,
        "subjects": stream.subjects,
        "events": [e.__name__ for e in stream.events],
        "storage": stream.storage.value,
        "retention": "limits",
        "max_age_s": float(stream.max_age_s),
        "max_bytes": stream.max_bytes,
        "duplicate_window_s": float(stream.duplicate_window_s),
        "stored_as": [stream.stored_filter(e) for e in stream.events],
        "partitions": PARTITIONS if stream.partitioned else None,
    }


def subjects_catalogue() -> dict[str, Any]:
    """Every subject with its filter, routing key and stream; the content of subjects.json."""
    subjects = []
    for event in EVENT_TYPES:
        stream = stream_of(event)
        subjects.append(
            {
                "event": event.__name__,
                "subject": subject_pattern(event),
                "filter": event.subject_filter(),
                "stream_filter": stream.stored_filter(event),
                "routing_key": event.subject_key,
                "stream": stream.name,
                "storage": stream.storage.value,
                "retention": "limits",
                "max_age_s": float(stream.max_age_s),
                "duplicate_window_s": float(stream.duplicate_window_s),
                "description": summary_of(event),
                "schema": f"schemas/{event.__name__}.json",
                "example": f"examples/{event.__name__}.json",
            }
        )
    return {"version": "v1", "subjects": subjects, "streams": [_stream_entry(s) for s in STREAMS]}


def _duration(seconds: float) -> str:
    if seconds <= 0:
        return "off"
    if seconds % 86_400 == 0:
        return f"{int(seconds // 86_400)} d"
    if seconds % 3600 == 0:
        return f"{int(seconds // 3600)} h"
    if seconds % 60 == 0:
        return f"{int(seconds // 60)} min"
    return f"{seconds:g} s"


def _size(n: int) -> str:
    if n < 0:
        return "no limit (by age)"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale and n % scale == 0:
            return f"{n // scale} {unit}"
    return f"{n} B"


def subjects_markdown() -> str:
    lines = [
        "<!-- generated by `make proto` (gpumedic proto): do not edit -->",
        "",
        "# gpumedic v1 subjects",
        "",
        "Subscribe with the filter (a JetStream consumer of the stream: with the stream's filter); `{key}` in a subject is "
        "the value of the routing key field.",
        "",
        "| event | subject | subscribe with | stream's filter | routing key | stream | storage | retention | de-dup window "
        "| what it says |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for event in EVENT_TYPES:
        s = stream_of(event)
        lines.append(
            f"| [{event.__name__}](schemas/{event.__name__}.json) | `{subject_pattern(event)}` "
            f"| `{event.subject_filter()}` | `{s.stored_filter(event)}` | {f'`{event.subject_key}`' if event.subject_key else '(none)'} "
            f"| `{s.name}` | {s.storage.value} | limits, {_duration(s.max_age_s)}, {_size(s.max_bytes)} "
            f"| {_duration(s.duplicate_window_s)} | {summary_of(event)} |"
        )
    lines += [
        "",
        "## Streams",
        "",
        "| stream | subjects | storage | max age | max bytes | de-dup window | what it holds |",
        "|---|---|---|---|---|---|---|",
    ]
    for s in STREAMS:
        subjects = ", ".join(f"`{x}`" for x in s.subjects)
        lines.append(
            f"| `{s.name}` | {subjects} | {s.storage.value} | {_duration(s.max_age_s)} | {_size(s.max_bytes)} "
            f"| {_duration(s.duplicate_window_s)} | {s.description} |"
        )
    return "\n".join(lines) + "\n"


def producers_of(event: type[Event]) -> tuple[str, ...]:
    try:
        return PRODUCERS[event]
    except KeyError:
        raise ContractError(f"{event.__name__} has no producer: add it to PRODUCERS in gpumedic_bus.topology") from None


def readme() -> str:
    events = "\n".join(
        f"- `{e.__name__}`: {summary_of(e)} ([schema](schemas/{e.__name__}.json), "
        f"[example](examples/{e.__name__}.json))"
        for e in EVENT_TYPES
    )
    open_enums = ", ".join(f"`{n}`" for n in sorted(OPEN_ENUMS)) or "(none)"
    return f"""<!-- generated by `make proto` (gpumedic proto): do not edit -->

# proto/: gpumedic's v1 event contract (generated, do not edit)

Everything here is generated from the event models in `libs/events` by `make proto`
(`gpumedic proto`). CI runs `make proto-check`, which fails when these files drift from
the models or when a change breaks v1 compatibility. Edit the models, never these files.

## What is here

- `schemas/<Event>.json`: a JSON Schema (draft 2020-12) per event, standard keywords only, so a
  strict validator compiles it as it is (see "Validating" below). The subject it is published on
  and the stream that stores it are in `subjects.json`.
- `subjects.json`, `subjects.md`: the subjects catalogue: subject, the filter to subscribe with,
  the filter a JetStream consumer of its stream uses, routing key field, stream, storage,
  retention, de-duplication window, one-line description.
- `asyncapi.yaml`: an AsyncAPI 3.0.0 document: the NATS server, one channel per event, which
  service sends and which receives each.
- `examples/<Event>.json`: a golden example per event, exactly as the models emit it. It
  validates against its schema; use it in your own tests.
- `baseline/v1/<Event>.json`: the compatibility baseline (see below). Not for consumers.

## Consuming events from any language

1. Subscribe with the event's filter from `subjects.json` (a core NATS subscription), e.g.
   `gpumedic.v1.node.sampled.*`, where the last token is the routing key (a node id, a service
   name); or make a JetStream consumer on its stream with its `stream_filter`. The streams with
   `partitions` (the samples and the node events) store each message with one more token, its
   node's partition (`gpumedic.v1.node.sampled.<node>.<p>`, p = FNV-1a 32 of the node id modulo
   the stream's `partitions`, as NATS's `partition()` subject mapping computes it), so their
   `stream_filter` is `<prefix>.>` (it also matches a message stored before the stream had
   partitions), and a consumer can take one share of the fleet with `<prefix>.*.<p>`
   (`gpumedic.v1.node.sampled.*.3`), every node's messages in
   one partition, in order. Messages are UTF-8 JSON, at most 256 KiB.
2. Validate the payload with the event's schema; a message that does not validate is a bug of the
   producer: log it (and dead-letter it), do not crash.
3. Ignore fields you do not know: v1 may add optional fields at any time, and the schemas do not
   forbid unknown properties.
4. Enums are closed for v1, except the open ones ({open_enums}): there new values may appear
   within v1, so their schema is a string with the known values as `examples`; treat a value you
   do not know as "other".
5. De-duplicate by the `Nats-Msg-Id` header (the action id for action requests,
   `<action id>:completed` for action results, otherwise the event id); W3C `traceparent`
   headers carry the trace.

## Validating

- Python: `jsonschema.Draft202012Validator(schema, format_checker=Draft202012Validator.FORMAT_CHECKER)`.
- Node: `new Ajv2020()` from `ajv/dist/2020.js` with its default (strict) options, plus
  `addFormats(ajv)` from `ajv-formats` for `date-time` and `uuid`.

`examples/` beside the repository's root holds a consumer in each, with its own durable consumer.
They log in as the `observer` NATS user (its password is `OBSERVER_NATS_PASSWORD` in the `.env`
that `gpumedic init` writes, or `var/secrets/nats-passwords.json` under `gpumedic up`), which has
an account of its own: every event flows into it, and it has a JetStream of its own where it may
create its own streams and durable consumers, but nothing it publishes or creates reaches the
control plane. Its replies come on its own inbox prefix, `_INBOX.observer`.

## Compatibility (v1)

Within v1 the contract only grows: new events, new optional fields, new enum values, looser
constraints. A removed or renamed field, a new required field, a field that became required, a
changed type, a removed enum value, a tightened constraint, a changed subject or a removed event
is breaking and fails `make proto-check` against `baseline/v1/`. `make proto` never overwrites a
baseline; it only adds one for a new event. `gpumedic proto --accept-breaking` rewrites
the baseline, which in practice means publishing a v2 (new subjects, `schema_version` 2) rather
than changing v1 under its consumers.

## Events

{events}
"""
