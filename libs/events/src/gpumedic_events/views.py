"""Views of an event: only the fields one consumer reads, checked as the event checks them.

A 6 KB `NodeSampled` carries every GPU's processes, health figures and the host's holders; a
consumer that keeps a few figures of it paid for decoding all of it on every sample (at 10,000
nodes, half of report-builder's CPU). A view is a model made from the event's own field
definitions (type, default and constraints), so what it reads is validated exactly as the event
validates it, and everything else in the body is skipped, not built. A message is read through
a view with `Event.decode_as(view, body, subject=...)`, which checks it as `from_json` does.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, create_model

from gpumedic_events.node import ContainerUsage, DiskUsage, GpuSample, HostSample, JobsObservation, NodeSampled, TopProcess

_VIEW = ConfigDict(frozen=True, extra="ignore")


def view_of(model: type[BaseModel], name: str, fields: tuple[str, ...], **nested: Any) -> type[BaseModel]:
    """A model of `fields` of `model`, each with its definition there; `nested` replaces a field's
    type (a view of its own, or a tuple of one)."""
    definitions = {f: (nested.get(f, model.model_fields[f].annotation), model.model_fields[f]) for f in fields}
    return create_model(name, __config__=_VIEW, __doc__=f"A view of {model.__name__}: {', '.join(fields)}.", **definitions)


_Counted = create_model("Counted", __config__=_VIEW, __doc__="An item of a list only counted: none of its fields is read.")
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
of history, its GPU count): about half the cost of decoding the whole sample."""

GpuLoad = view_of(
    GpuSample, "GpuLoad",
    ("index", "utilization_gpu_pct", "lost", "ecc_uncorrected_volatile", "remapped_rows_pending", "remapped_rows_failed", "health"),
)
HostRoom = view_of(HostSample, "HostRoom", ("memory_total_mib", "memory_available_mib", "disks"), disks=tuple[DiskUsage, ...])
SampleLoad = view_of(NodeSampled, "SampleLoad", ("node_id", "occurred_at", "gpus", "host"), gpus=tuple[GpuLoad, ...], host=HostRoom)
"""What the autoscaler reads of a sample: each GPU's load, and what a new worker's burn-in judges
(a lost GPU, ECC errors, row remaps, the health figures where the sample carries them, the host's
memory and disks); none of the processes, holders, jobs or node facts."""
