"""Generates `proto/`, the language-neutral contract, from the event models, and guards it.

Consumers in other languages code against `proto/`, never against Python, so it must say exactly
what the models say. One command regenerates it (`make proto`); `--check` regenerates in memory
and fails when the committed files drifted from the models (`make proto-check`, run by CI). The
same check compares every schema with the committed v1 baseline and fails on a change that
would break a v1 consumer or producer: within v1 the contract may only grow.

    gpumedic proto                              # regenerate proto/ (adds baselines for new events only)
    gpumedic proto --check                      # exit 1 on drift or on a breaking change
    gpumedic proto --accept-breaking            # also overwrite the v1 baseline (in practice: a v2)

Output is deterministic (sorted keys where order is free, a trailing newline, no timestamps),
so the check compares text with text.
"""

from __future__ import annotations

import difflib
import inspect
import json
import logging
import re
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml
from gpumedic_bus.streams import STREAMS, Stream, stream_of
from gpumedic_bus.topology import PRODUCERS, consumers
from gpumedic_events import EVENT_TYPES, Event
from gpumedic_events.base import json_examples

log = logging.getLogger(__name__)

SCHEMA_DIALECT = "https://json-schema.org/draft/2020-12/schema"
SCHEMA_ID_BASE = "https://gpumedic.dev/schemas/v1/"
BASELINE_DIR = "baseline/v1"
NATS_URL = "nats://127.0.0.1:4222"

CONSUMERS: Mapping[str, tuple[type[Event], ...]] = consumers()
"""Which service subscribes to which events (over NATS; leader-health probes HTTP instead)."""

OPEN_ENUMS: frozenset[str] = frozenset({"IncidentKind"})
"""Enums documented as open within v1: new values may appear and consumers must accept them.

Marked `x-extensible-enum: true` in the schemas; every other enum is closed for v1."""

_TYPE_OF_PY = (
    (bool, "boolean"),
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    (list, "array"),
    (dict, "object"),
)
_LOWER_BOUNDS = ("minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties")
_UPPER_BOUNDS = ("maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties")
_EXACT_CONSTRAINTS = ("pattern", "format", "multipleOf")
_DIFF_LINES = 20


class ContractError(RuntimeError):
    """The models cannot be turned into a contract (an event without example, producer or stream)."""


# --- the pieces of proto/ -------------------------------------------------------------------


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


def _summary(event: type[Event]) -> str:
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
                "routing_key": event.subject_key,
                "stream": stream.name,
                "storage": stream.storage.value,
                "retention": "limits",
                "max_age_s": float(stream.max_age_s),
                "duplicate_window_s": float(stream.duplicate_window_s),
                "description": _summary(event),
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
        "Subscribe with the filter; `{key}` in a subject is the value of the routing key field.",
        "",
        "| event | subject | subscribe with | routing key | stream | storage | retention | de-dup window "
        "| what it says |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for event in EVENT_TYPES:
        s = stream_of(event)
        lines.append(
            f"| [{event.__name__}](schemas/{event.__name__}.json) | `{subject_pattern(event)}` "
            f"| `{event.subject_filter()}` | {f'`{event.subject_key}`' if event.subject_key else '(none)'} "
            f"| `{s.name}` | {s.storage.value} | limits, {_duration(s.max_age_s)}, {_size(s.max_bytes)} "
            f"| {_duration(s.duplicate_window_s)} | {_summary(event)} |"
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


def _producers(event: type[Event]) -> tuple[str, ...]:
    try:
        return PRODUCERS[event]
    except KeyError:
        raise ContractError(f"{event.__name__} has no producer: add it to PRODUCERS in gpumedic_bus.topology") from None


def asyncapi_document() -> dict[str, Any]:
    """An AsyncAPI 3.0.0 document: one channel per event, who sends and who receives it."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for event in EVENT_TYPES:
        name = event.__name__
        stream = stream_of(event)
        channel: dict[str, Any] = {
            "address": subject_pattern(event),
            "title": name,
            "description": f"{_summary(event)} Subscribe with `{event.subject_filter()}`.",
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "x-subject-filter": event.subject_filter(),
            "x-stream": stream.name,
        }
        if event.subject_key is not None:
            field_info = event.model_fields[event.subject_key]
            channel["parameters"] = {
                event.subject_key: {
                    "description": field_info.description or f"The event's `{event.subject_key}`.",
                    "location": f"$message.payload#/{event.subject_key}",
                }
            }
        channels[name] = channel
        messages[name] = {
            "name": name,
            "title": name,
            "summary": _summary(event),
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/NatsHeaders"},
            "payload": {"$ref": f"./schemas/{name}.json"},
            "examples": [
                {"name": "golden", "summary": f"proto/examples/{name}.json", "payload": golden_example(event)}
            ],
        }
        for service in _producers(event):
            operations[f"{service}.send.{name}"] = _operation("send", service, name)
    for service, events in CONSUMERS.items():
        for event in events:
            operations[f"{service}.receive.{event.__name__}"] = _operation("receive", service, event.__name__)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "gpumedic events",
            "version": "1.0.0",
            "description": "The events gpumedic's services exchange over NATS JetStream. "
            "Generated from the event models by `make proto`; do not edit.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": NATS_URL.removeprefix("nats://"),
                "protocol": "nats",
                "description": f"The embedded stack's nats-server ({NATS_URL}), JetStream enabled.",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": {"NatsHeaders": _nats_headers()}},
    }


def _operation(action: str, service: str, event: str) -> dict[str, Any]:
    verb = "publishes" if action == "send" else "consumes"
    return {
        "action": action,
        "channel": {"$ref": f"#/channels/{event}"},
        "messages": [{"$ref": f"#/channels/{event}/messages/{event}"}],
        "title": f"{service} {verb} {event}",
        "tags": [{"name": service}],
    }


def _nats_headers() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "JetStream de-duplication id: the action id for action requests, "
                "'<action id>:completed' for action results, otherwise the event id.",
            },
            "traceparent": {"type": "string", "description": "W3C trace context of the publishing span, if any."},
            "tracestate": {"type": "string", "description": "W3C trace state, if any."},
        },
    }


def readme() -> str:
    events = "\n".join(
        f"- `{e.__name__}`: {_summary(e)} ([schema](schemas/{e.__name__}.json), "
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
  routing key field, stream, storage, retention, de-duplication window, one-line description.
- `asyncapi.yaml`: an AsyncAPI 3.0.0 document: the NATS server, one channel per event, which
  service sends and which receives each.
- `examples/<Event>.json`: a golden example per event, exactly as the models emit it. It
  validates against its schema; use it in your own tests.
- `baseline/v1/<Event>.json`: the compatibility baseline (see below). Not for consumers.

## Consuming events from any language

1. Subscribe (a JetStream consumer on the stream, or a core NATS subscription) with the event's
   filter from `subjects.json`, e.g. `gpumedic.v1.node.sampled.*`; the last token is the routing
   key (a node id, a service name). Messages are UTF-8 JSON, at most 256 KiB.
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


# --- rendering, drift and writing ----------------------------------------------------------


def _json(data: Any, *, sort_keys: bool = True) -> str:
    return json.dumps(data, indent=2, sort_keys=sort_keys, ensure_ascii=False) + "\n"


def _yaml(data: Any) -> str:
    return yaml.safe_dump(data, sort_keys=False, allow_unicode=True, width=100, default_flow_style=False)


def current_schemas() -> dict[str, dict[str, Any]]:
    return {event.__name__: event_schema(event) for event in EVENT_TYPES}


def read_baselines(proto_dir: Path) -> dict[str, str]:
    """The committed baseline files, relative path -> text, exactly as they are on disk."""
    folder = proto_dir / BASELINE_DIR
    if not folder.is_dir():
        return {}
    return {f"{BASELINE_DIR}/{p.name}": p.read_text(encoding="utf-8") for p in sorted(folder.glob("*.json"))}


def render(proto_dir: Path | None = None, *, accept_breaking: bool = False) -> dict[str, str]:
    """Every file proto/ should hold, relative path -> text.

    Existing baselines under `proto_dir` are kept verbatim (including those of events gone from
    the catalogue, so the compatibility check can name them); a new event gets its current schema
    as baseline. With `accept_breaking` the baseline is the current schemas, nothing else.
    """
    schemas = current_schemas()
    files: dict[str, str] = {
        "README.md": readme(),
        "subjects.json": _json(subjects_catalogue()),
        "subjects.md": subjects_markdown(),
        "asyncapi.yaml": _yaml(asyncapi_document()),
    }
    for event in EVENT_TYPES:
        name = event.__name__
        files[f"schemas/{name}.json"] = _json(published_schema(event))
        files[f"examples/{name}.json"] = _json(golden_example(event), sort_keys=False)
    baselines = {} if accept_breaking or proto_dir is None else read_baselines(proto_dir)
    for name, schema in schemas.items():
        baselines.setdefault(f"{BASELINE_DIR}/{name}.json", _json(schema))
    files.update(baselines)
    return dict(sorted(files.items()))


def _files_on_disk(proto_dir: Path) -> Iterator[str]:
    if proto_dir.is_dir():
        for path in sorted(proto_dir.rglob("*")):
            if path.is_file():
                yield path.relative_to(proto_dir).as_posix()


def drift(proto_dir: Path, expected: Mapping[str, str]) -> list[str]:
    """One entry per stale, missing or extra file, stale ones with a unified diff excerpt."""
    problems = []
    on_disk = set(_files_on_disk(proto_dir))
    for rel, text in expected.items():
        if rel not in on_disk:
            problems.append(f"missing: proto/{rel}")
            continue
        actual = (proto_dir / rel).read_text(encoding="utf-8")
        if actual != text:
            diff = list(
                difflib.unified_diff(
                    actual.splitlines(),
                    text.splitlines(),
                    f"proto/{rel} (committed)",
                    f"proto/{rel} (from the models)",
                    lineterm="",
                )
            )
            excerpt = "\n".join(f"    {line}" for line in diff[:_DIFF_LINES])
            more = f"\n    ... {len(diff) - _DIFF_LINES} more diff lines" if len(diff) > _DIFF_LINES else ""
            problems.append(f"stale: proto/{rel}\n{excerpt}{more}")
    problems.extend(f"extra: proto/{rel}" for rel in sorted(on_disk - set(expected)))
    return problems


def write(proto_dir: Path, expected: Mapping[str, str]) -> list[str]:
    """Make proto_dir hold exactly `expected`: write what changed, remove what is not generated."""
    changed = []
    for rel, text in expected.items():
        path = proto_dir / rel
        if path.is_file() and path.read_text(encoding="utf-8") == text:
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        changed.append(rel)
        log.info("wrote proto/%s", rel)
    for rel in set(_files_on_disk(proto_dir)) - set(expected):
        (proto_dir / rel).unlink()
        changed.append(rel)
        log.info("removed proto/%s (not generated)", rel)
    for folder in sorted((p for p in proto_dir.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        if not any(folder.iterdir()):
            folder.rmdir()
    return sorted(changed)


def compatibility_problems(proto_dir: Path) -> list[str]:
    """Breaking changes of the current models against the baseline committed in proto_dir."""
    baselines = {Path(rel).stem: json.loads(text) for rel, text in read_baselines(proto_dir).items()}
    return catalogue_breaking_changes(baselines, current_schemas())


# --- compatibility --------------------------------------------------------------------------


def catalogue_breaking_changes(
    baselines: Mapping[str, Mapping[str, Any]], current: Mapping[str, Mapping[str, Any]]
) -> list[str]:
    """Breaking changes across the catalogue: per-event schema breaks, and events that vanished."""
    problems = []
    for event in sorted(baselines):
        if event not in current:
            problems.append(f"{event}: event removed from the catalogue (it is in the v1 baseline)")
            continue
        problems.extend(breaking_changes(dict(baselines[event]), dict(current[event]), event=event))
    return problems


def breaking_changes(baseline: dict[str, Any], current: dict[str, Any], *, event: str) -> list[str]:
    """What in `current` breaks v1 consumers or producers coded against `baseline`, by JSON path.

    Breaking: a property removed (a rename is a removal), a new required property, a property
    that became required, a changed type (either way: a typed consumer decodes to the declared
    type, so a union gaining a member breaks it as surely as one losing a member), an enum or
    const value removed, a tightened constraint, additional properties forbidden, a changed
    subject. Not breaking: a new optional property, a new enum value, a description or default
    change, a loosened or removed constraint.
    """
    problems: list[str] = []
    subject_before, subject_now = baseline.get("x-subject"), current.get("x-subject")
    if subject_before is not None and subject_before != subject_now:
        problems.append(f"{event}: $: subject changed from {subject_before} to {subject_now}")
    _Comparison(baseline, current, event, problems).compare(baseline, current, "$")
    return problems


@dataclass(frozen=True)
class _Variant:
    node: dict[str, Any]
    ref: str | None


@dataclass
class _Comparison:
    base_root: dict[str, Any]
    cur_root: dict[str, Any]
    event: str
    problems: list[str]
    _active: set[tuple[str, str]] = field(default_factory=set)

    def _report(self, path: str, what: str) -> None:
        self.problems.append(f"{self.event}: {path}: {what}")

    def compare(self, base: Mapping[str, Any], cur: Mapping[str, Any], path: str) -> None:
        bvars = _variants(base, self.base_root)
        cvars = _variants(cur, self.cur_root)
        btypes, ctypes = _type_set(bvars), _type_set(cvars)
        if btypes != ctypes:
            self._report(path, f"type changed from {_show_types(btypes)} to {_show_types(ctypes)}")
        self._compare_values(bvars, cvars, path)
        for json_type in sorted(btypes & ctypes):
            bsame = [v for v in bvars if json_type in _types(v.node)]
            csame = [v for v in cvars if json_type in _types(v.node)]
            if json_type == "object":
                self._compare_objects(bsame, csame, path)
            elif len(bsame) == 1 and len(csame) == 1:
                self._compare_constraints(bsame[0].node, csame[0].node, path)
                if json_type == "array":
                    self._compare_array(bsame[0].node, csame[0].node, path)

    def _compare_values(self, bvars: list[_Variant], cvars: list[_Variant], path: str) -> None:
        cur_values: set[str] = set()
        open_types: set[str] = set()
        for v in cvars:
            values = _enumerated(v.node)
            if values is None:
                open_types |= _types(v.node)
            else:
                cur_values |= {_canonical(x) for x in values}
        if "number" in open_types:
            open_types.add("integer")
        for v in bvars:
            for value in _enumerated(v.node) or ():
                if _canonical(value) in cur_values or "any" in open_types or _json_type(value) in open_types:
                    continue
                self._report(path, f"enum value {_canonical(value)} removed")

    def _compare_objects(self, bvars: list[_Variant], cvars: list[_Variant], path: str) -> None:
        if len(bvars) == 1 and len(cvars) == 1:
            self._compare_object(bvars[0], cvars[0], path)
            return
        by_title = {v.node.get("title"): v for v in cvars}
        for b in bvars:
            match = by_title.get(b.node.get("title"))
            if match is None:
                self._report(path, f"union member {b.node.get('title', '(untitled object)')} removed")
            else:
                self._compare_object(b, match, path)

    def _compare_object(self, b: _Variant, c: _Variant, path: str) -> None:
        key = (b.ref or "", c.ref or "")
        if b.ref and c.ref:
            if key in self._active:
                return
            self._active.add(key)
        try:
            self._compare_object_body(b.node, c.node, path)
        finally:
            self._active.discard(key)

    def _compare_object_body(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        bprops: Mapping[str, Any] = b.get("properties", {})
        cprops: Mapping[str, Any] = c.get("properties", {})
        for name, schema in bprops.items():
            if name not in cprops:
                self._report(f"{path}.{name}", "property removed")
            else:
                self.compare(schema, cprops[name], f"{path}.{name}")
        before = set(b.get("required", ()))
        for name in c.get("required", ()):
            if name in before:
                continue
            if name in bprops:
                self._report(f"{path}.{name}", "property became required")
            else:
                self._report(f"{path}.{name}", "new required property")
        bextra, cextra = b.get("additionalProperties", True), c.get("additionalProperties", True)
        if cextra is False and bextra is not False:
            self._report(path, "additional properties no longer allowed")
        elif isinstance(bextra, Mapping) and isinstance(cextra, Mapping):
            self.compare(bextra, cextra, f"{path}.*")
        self._compare_constraints(b, c, path)

    def _compare_array(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        bitems, citems = b.get("items"), c.get("items")
        if isinstance(bitems, Mapping) and isinstance(citems, Mapping):
            self.compare(bitems, citems, f"{path}[]")
        for i, (bi, ci) in enumerate(zip(b.get("prefixItems", ()), c.get("prefixItems", ()), strict=False)):
            self.compare(bi, ci, f"{path}[{i}]")

    def _compare_constraints(self, b: Mapping[str, Any], c: Mapping[str, Any], path: str) -> None:
        for key in _LOWER_BOUNDS:
            if key in c and (key not in b or c[key] > b[key]):
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')} -> {c[key]}")
        for key in _UPPER_BOUNDS:
            if key in c and (key not in b or c[key] < b[key]):
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')} -> {c[key]}")
        for key in _EXACT_CONSTRAINTS:
            if key in c and b.get(key) != c[key]:
                self._report(path, f"constraint tightened: {key} {b.get(key, '(none)')!s} -> {c[key]}")
        if c.get("uniqueItems") and not b.get("uniqueItems"):
            self._report(path, "constraint tightened: uniqueItems")


def _pointer(root: Mapping[str, Any], ref: str) -> dict[str, Any]:
    if not ref.startswith("#"):
        raise ValueError(f"only local $refs are supported, not {ref!r}")
    node: Any = root
    for token in ref.removeprefix("#").strip("/").split("/"):
        if token:
            node = node[token.replace("~1", "/").replace("~0", "~")]
    return node


def _resolve(node: Mapping[str, Any], root: Mapping[str, Any]) -> _Variant:
    """Follow $ref (and single-member allOf) chains; sibling keywords of a $ref win."""
    resolved: dict[str, Any] = dict(node)
    last_ref = None
    for _ in range(64):
        if isinstance(resolved.get("$ref"), str):
            last_ref = resolved.pop("$ref")
            resolved = {**_pointer(root, last_ref), **resolved}
        elif isinstance(resolved.get("allOf"), list) and len(resolved["allOf"]) == 1:
            (only,) = resolved.pop("allOf")
            resolved = {**only, **resolved}
        else:
            return _Variant(resolved, last_ref)
    raise ValueError(f"$ref chain too long at {last_ref}")


def _variants(node: Mapping[str, Any], root: Mapping[str, Any]) -> list[_Variant]:
    """The alternatives a node allows: anyOf/oneOf flattened, every $ref resolved."""
    resolved = _resolve(node, root)
    for key in ("anyOf", "oneOf"):
        if isinstance(resolved.node.get(key), list):
            return [v for member in resolved.node[key] for v in _variants(member, root)]
    return [resolved]


def _json_type(value: Any) -> str:
    if value is None:
        return "null"
    for py_type, name in _TYPE_OF_PY:
        if isinstance(value, py_type):
            return name
    return "any"


def _enumerated(node: Mapping[str, Any]) -> list[Any] | None:
    if "const" in node:
        return [node["const"]]
    if isinstance(node.get("enum"), list):
        return list(node["enum"])
    return None


def _types(node: Mapping[str, Any]) -> set[str]:
    declared = node.get("type")
    if isinstance(declared, str):
        return {declared}
    if isinstance(declared, list):
        return set(declared)
    values = _enumerated(node)
    if values is not None:
        return {_json_type(v) for v in values}
    if "properties" in node or "additionalProperties" in node:
        return {"object"}
    if "items" in node or "prefixItems" in node:
        return {"array"}
    return {"any"}


def _type_set(variants: Sequence[_Variant]) -> set[str]:
    return {t for v in variants for t in _types(v.node)}


def _show_types(types: set[str]) -> str:
    return " | ".join(sorted(types))


def _canonical(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


# --- command line ---------------------------------------------------------------------------


def default_proto_dir(start: Path | None = None) -> Path:
    """The repository root's proto/: the nearest folder up from `start` (the cwd) with libs/events."""
    here = (start or Path.cwd()).resolve()
    for folder in (here, *here.parents):
        if (folder / "pyproject.toml").is_file() and (folder / "libs" / "events").is_dir():
            return folder / "proto"
    return here / "proto"


def main(*, out: Path | None = None, check: bool = False, accept_breaking: bool = False) -> int:
    """`gpumedic proto`: regenerate proto/ (into `out`, default the repository's), or with `check`
    write nothing and exit 1 on drift or on a breaking change against the baseline;
    `accept_breaking` also overwrites the v1 compatibility baseline (in practice: cut a v2)."""
    if check and accept_breaking:
        print("gpumedic proto: --check and --accept-breaking exclude each other", file=sys.stderr)
        return 2
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    proto_dir: Path = out if out is not None else default_proto_dir()
    try:
        expected = render(proto_dir, accept_breaking=accept_breaking)
    except ContractError as exc:
        print(f"cannot generate proto/: {exc}", file=sys.stderr)
        return 1
    if check:
        return _check(proto_dir, expected)
    changed = write(proto_dir, expected)
    print(f"proto/ regenerated in {proto_dir}: {len(changed)} file(s) changed")
    breaking = compatibility_problems(proto_dir)
    if breaking:
        _print_breaking(breaking)
        return 1
    return 0


def _check(proto_dir: Path, expected: Mapping[str, str]) -> int:
    problems = drift(proto_dir, expected)
    breaking = compatibility_problems(proto_dir)
    if problems:
        print(f"proto/ is stale ({len(problems)} file(s)); run `make proto` and commit the result:", file=sys.stderr)
        for problem in problems:
            print(f"  {problem}", file=sys.stderr)
    if breaking:
        _print_breaking(breaking)
    if problems or breaking:
        return 1
    print("proto/ is up to date")
    return 0


def _print_breaking(breaking: Sequence[str]) -> None:
    print(f"{len(breaking)} breaking change(s) against proto/{BASELINE_DIR}:", file=sys.stderr)
    for problem in breaking:
        print(f"  {problem}", file=sys.stderr)
    print("  v1 may only grow; a breaking change needs a v2 (see proto/README.md)", file=sys.stderr)

