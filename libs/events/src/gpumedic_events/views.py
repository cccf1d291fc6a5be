"""Views of an event: only the fields one consumer reads, checked as the event checks them.

A 6 KB `NodeSampled` carries every GPU's processes, health figures and the host's holders; a
consumer that keeps a few figures of it paid for decoding all of it on every sample (at 10,000
nodes, half of report-builder's CPU). A view is made from the event's own field definitions (type,
default, constraints and after-validators), so what it reads is validated exactly as the event
validates it, and everything else in the body is skipped, not built. It is a msgspec struct, not
a pydantic model: msgspec skips what a view does not name without building it, where pydantic
parses the whole body first, so a view costs a fraction of the event (`make bench`'s sample path
prints both). There is still one schema, the event's: the struct is derived from it at import, and
a field it cannot carry over (a validator of another kind) stops the import. A message is read
through a view with `Event.decode_as(view, body, subject=...)`, which checks it as `from_json` does.
A view of every field (zombie-detector's `Sample`) takes and refuses exactly what the event does.
"""

from __future__ import annotations

import functools
import re
import types
import typing
from datetime import datetime
from typing import Annotated, Any, Literal

import annotated_types
import msgspec
from pydantic import AwareDatetime, BaseModel, ValidationError
from pydantic.fields import FieldInfo
from pydantic_core import PydanticUndefined

from gpumedic_events.base import Event, describe
from gpumedic_events.node import ContainerUsage, DiskUsage, GpuSample, HostSample, JobsObservation, NodeSampled, TopProcess

_CONSTRAINTS = {
    annotated_types.Ge: "ge", annotated_types.Gt: "gt", annotated_types.Le: "le", annotated_types.Lt: "lt",
    annotated_types.MinLen: "min_length", annotated_types.MaxLen: "max_length",
}
_PATH = re.compile(r"`\$((?:\.[A-Za-z_][A-Za-z0-9_]*|\[\d+\])*)`")


def _constraints(info: FieldInfo) -> dict[str, Any]:
    out = {}
    for item in info.metadata:
        if type(item) in _CONSTRAINTS:
            out[_CONSTRAINTS[type(item)]] = getattr(item, _CONSTRAINTS[type(item)])
        elif getattr(item, "pattern", None) is not None:
            out["pattern"] = item.pattern
        else:  # a constraint msgspec would not check: the view would accept what the event refuses
            raise TypeError(f"a view cannot carry the constraint {item!r}")
    return out


def _type(annotation: Any, constraints: dict[str, Any], nested: Any = None) -> Any:
    """The msgspec type of a pydantic field's annotation, its constraints on the part they bound
    (the value, not its None), nested models made structs of every field they have."""
    if nested is not None:
        annotation = nested
    origin = typing.get_origin(annotation)
    if origin in (types.UnionType, typing.Union):
        members = [_type(a, {} if a is type(None) else constraints) for a in typing.get_args(annotation)]
        return functools.reduce(lambda a, b: a | b, members)
    if origin is tuple:
        item, more = typing.get_args(annotation)
        assert more is Ellipsis, f"only tuples of one type: {annotation}"
        inner = tuple[_type(item, {}), ...]
        return Annotated[inner, msgspec.Meta(**constraints)] if constraints else inner
    if origin is Literal:
        return annotation
    if annotation is AwareDatetime:
        return Annotated[datetime, msgspec.Meta(tz=True, **constraints)]
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return _struct(annotation, tuple(annotation.model_fields))
    if isinstance(annotation, type) and issubclass(annotation, msgspec.Struct):
        return annotation
    return Annotated[annotation, msgspec.Meta(**constraints)] if constraints else annotation


def _after_validators(model: type[BaseModel], fields: tuple[str, ...]) -> dict[str, list]:
    """Each field's after-validators (classmethods taking the value), to run on the struct too."""
    out: dict[str, list] = {}
    for name, decorator in model.__pydantic_decorators__.field_validators.items():
        mine = [f for f in decorator.info.fields if f in fields]
        if not mine:
            continue
        if decorator.info.mode != "after":
            raise TypeError(f"a view cannot carry {model.__name__}.{name} ({decorator.info.mode} validator)")
        for field in mine:
            out.setdefault(field, []).append(getattr(model, name))
    if any(d for d in model.__pydantic_decorators__.model_validators.values()):
        raise TypeError(f"a view cannot carry the model validators of {model.__name__}")
    return out


def _whole(model: type[BaseModel], fields: tuple[str, ...], nested: dict[str, Any]) -> bool:
    """Whether a view names every field of its model, each as the model has it."""
    return set(fields) == set(model.model_fields) and not nested


@functools.cache
def _struct(model: type[BaseModel], fields: tuple[str, ...], name: str | None = None, **nested: Any) -> type[msgspec.Struct]:
    definitions = []
    for field in fields:
        info = model.model_fields[field]
        kind = _type(info.annotation, _constraints(info), nested.get(field))
        if info.default_factory is not None:
            factory = info.default_factory
            if isinstance(factory, type) and issubclass(factory, BaseModel):  # an empty nested model: the view's own
                factory = _type(factory, {}, nested.get(field))
            definitions.append((field, kind, msgspec.field(default_factory=factory)))
        elif info.default is not PydanticUndefined:
            definitions.append((field, kind, info.default))
        else:
            definitions.append((field, kind))
    validators = _after_validators(model, fields)

    def __post_init__(self) -> None:
        for field, checks in validators.items():
            value = getattr(self, field)
            for check in checks:
                value = check(value)
            msgspec.structs.force_setattr(self, field, value)

    namespace = {"__post_init__": __post_init__} if validators else {}
    if _whole(model, fields, nested):  # the model's own properties read the same fields on the struct
        namespace |= {k: v for k, v in vars(model).items() if isinstance(v, property)}
    struct = msgspec.defstruct(name or f"{model.__name__}View", definitions, kw_only=True, frozen=True, namespace=namespace)
    struct.__doc__ = f"A view of {model.__name__}: {', '.join(fields)}."
    return struct


def view_of(model: type[BaseModel], name: str, fields: tuple[str, ...], **nested: Any) -> type[msgspec.Struct]:
    """A struct of `fields` of `model`, each as defined there; `nested` replaces a field's type (a
    view of its own, or a tuple of one). A view of an event reads its envelope too (id, schema
    version, time, source): a body of another schema version, or from no valid source, is refused
    by every reader alike. It reads a body with `decode_body`; `viewed` is the model it views."""
    if issubclass(model, Event):
        fields = tuple(dict.fromkeys((*Event.model_fields, *fields)))
    view = _struct(model, fields, name, **nested)
    whole = _whole(model, fields, nested)
    strict = msgspec.json.Decoder(view)
    lax = msgspec.json.Decoder(view, strict=False)  # pydantic's lax mode: "5" is an int too

    def decode_body(data: bytes | str) -> msgspec.Struct:
        """The view of one body; ValueError says what was wrong and where, in one line: the
        event's own words where the event refuses the body too, msgspec's otherwise. A body as the
        schema writes it is read on the fast path; any other (a number as text, true for 1) is
        judged by the event itself where the view is the whole event, so the two take and refuse
        the same bodies; a part view reads it laxly. Such bodies are rare, so is the second decode."""
        try:
            return strict.decode(data)
        except (msgspec.ValidationError, msgspec.DecodeError, RecursionError):
            pass
        if whole:
            try:
                return msgspec.convert(model.model_validate_json(data).model_dump(), view)
            except ValidationError as exc:
                raise ValueError(describe(exc)) from None
        try:
            return lax.decode(data)
        except msgspec.ValidationError as exc:
            said = _where(str(exc))
        except msgspec.DecodeError as exc:
            said = f"<body>: Invalid JSON: {str(exc).removeprefix('JSON is malformed: ')}"
        except RecursionError:  # msgspec's own, past its nesting limit
            said = "<body>: nested deeper than any event is"
        try:
            model.model_validate_json(data)
        except ValidationError as exc:
            said = describe(exc)
        raise ValueError(said)

    view.decode_body = staticmethod(decode_body)
    view.viewed = model
    return view


def _where(message: str) -> str:
    """msgspec's "Expected `int` <= 100 - at `$.gpus[0].utilization_gpu_pct`" as pydantic's
    events say it: "gpus.0.utilization_gpu_pct: Expected `int` <= 100"."""
    found = _PATH.search(message)
    if found is None:
        return f"<body>: {message}"
    path = re.sub(r"\[(\d+)\]", r".\1", found.group(1)).lstrip(".") or "<body>"
    return f"{path}: {message[: found.start()].removesuffix(' - at ').strip()}"


_Counted = msgspec.defstruct("Counted", [], frozen=True)
_Counted.__doc__ = "An item of a list only counted: none of its fields is read."
GpuFigures = view_of(
    GpuSample, "GpuFigures",
    ("index", "utilization_gpu_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w", "sm_clock_mhz", "lost", "processes"),
    processes=tuple[_Counted, ...],
)
HostFigures = view_of(
    HostSample, "HostFigures",
    ("memory_total_mib", "memory_available_mib", "swap_used_mib", "load_1m", "cpus", "disks", "top_processes", "containers"),
    disks=tuple[DiskUsage, ...], top_processes=tuple[TopProcess, ...], containers=tuple[ContainerUsage, ...],
)
SampleFigures = view_of(
    NodeSampled, "SampleFigures", ("node_id", "occurred_at", "gpus", "host", "jobs"),
    gpus=tuple[GpuFigures, ...], host=HostFigures, jobs=JobsObservation,
)
"""What report-builder keeps of a sample (the console's tiles, top processes and containers, each node's minute
of history, its GPU count)."""

GpuLoad = view_of(
    GpuSample, "GpuLoad",
    ("index", "utilization_gpu_pct", "lost", "ecc_uncorrected_volatile", "remapped_rows_pending", "remapped_rows_failed", "health"),
)
HostRoom = view_of(HostSample, "HostRoom", ("memory_total_mib", "memory_available_mib", "disks"), disks=tuple[DiskUsage, ...])
SampleLoad = view_of(NodeSampled, "SampleLoad", ("node_id", "occurred_at", "gpus", "host"), gpus=tuple[GpuLoad, ...], host=HostRoom)
"""What the autoscaler reads of a sample: each GPU's load, and what a new worker's burn-in judges
(a lost GPU, ECC errors, row remaps, the health figures where the sample carries them, the host's
memory and disks); none of the processes, holders, jobs or node facts."""

Sample = view_of(NodeSampled, "Sample", tuple(NodeSampled.model_fields))
"""All of a sample, for zombie-detector, whose rules read most of it: the same fields, checked the
same way, decoded by msgspec at a fraction of pydantic's cost; each part of it a struct of all its
model's fields, with the model's properties."""
