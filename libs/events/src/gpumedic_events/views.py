"""Views of an event: only the fields one consumer reads, checked as the event checks them.

A 6 KB `NodeSampled` carries every GPU's processes, health figures and the host's holders; a
consumer that keeps a few figures of it paid for decoding all of it on every sample (at 10,000
nodes, half of report-builder's CPU). A view is a model made from the event's own field
definitions (type, default and constraints), so what it reads is validated exactly as the event
validates it, and everything else in the body is skipped, not built.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import BaseModel, ConfigDict, ValidationError, create_model

from gpumedic_events.base import MAX_EVENT_BYTES, Event, EventDecodeError, _describe
from gpumedic_events.node import DiskUsage, GpuSample, HostSample, JobsObservation, NodeSampled, TopProcess

V = TypeVar("V", bound=BaseModel)

_VIEW = ConfigDict(frozen=True, extra="ignore")


def view_of(model: type[BaseModel], name: str, fields: tuple[str, ...], **nested: Any) -> type[BaseModel]:
    """A model of `fields` of `model`, each with its definition there; `nested` replaces a field's
    type (a view of its own, or a tuple of one)."""
    definitions = {f: (nested.get(f, model.model_fields[f].annotation), model.model_fields[f]) for f in fields}
    return create_model(name, __config__=_VIEW, __doc__=f"A view of {model.__name__}: {', '.join(fields)}.", **definitions)


def decode_view(view: type[V], event_type: type[Event], data: bytes, *, subject: str) -> V:
    """One message of `event_type` read through `view`; EventDecodeError saying what was wrong, as
    `Event.from_json` says it (its size, its fields, a payload that belongs on another subject)."""
    if len(data) > MAX_EVENT_BYTES:
        raise EventDecodeError(subject, f"payload of {len(data)} bytes exceeds {MAX_EVENT_BYTES}")
    try:
        item = view.model_validate_json(data)
    except ValidationError as exc:
        raise EventDecodeError(subject, _describe(exc)) from None
    if event_type.subject_key is not None and subject != f"{event_type.subject_prefix}.{getattr(item, event_type.subject_key)}":
        raise EventDecodeError(subject, f"payload belongs on {event_type.subject_prefix}.{getattr(item, event_type.subject_key)}, not {subject}")
    return item


_Counted = create_model("Counted", __config__=_VIEW, __doc__="An item of a list only counted: none of its fields is read.")
GpuFigures = view_of(
    GpuSample, "GpuFigures",
    ("index", "utilization_gpu_pct", "memory_used_mib", "memory_total_mib", "temperature_c", "power_w", "sm_clock_mhz", "lost", "processes"),
    processes=tuple[_Counted, ...],
)
HostFigures = view_of(
    HostSample, "HostFigures",
    ("memory_total_mib", "memory_available_mib", "swap_used_mib", "load_1m", "cpus", "disks", "top_processes"),
    disks=tuple[DiskUsage, ...], top_processes=tuple[TopProcess, ...],
)
SampleFigures = view_of(
    NodeSampled, "SampleFigures", ("node_id", "occurred_at", "gpus", "host", "jobs"),
    gpus=tuple[GpuFigures, ...], host=HostFigures, jobs=JobsObservation,
)
"""What report-builder keeps of a sample (the console's tiles and top processes, each node's minute
of history, its GPU count): about half the cost of decoding the whole sample."""
