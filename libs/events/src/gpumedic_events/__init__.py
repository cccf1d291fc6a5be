"""gpumedic's event contracts. `EVENT_TYPES` is the catalogue `proto/` is generated from."""

from gpumedic_events.action import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    KillGpuProcesses,
    ProcessTarget,
    action_id_for,
)
from gpumedic_events.base import (
    MAX_EVENT_BYTES,
    SCHEMA_VERSION,
    SUBJECT_ROOT,
    Event,
    EventDecodeError,
    NodeId,
    SubjectToken,
)
from gpumedic_events.deadletter import MessageRejected
from gpumedic_events.faults import ContainerExited, GpuLost, GpuXidReported, ProcessOomKilled
from gpumedic_events.incident import IncidentEscalated, IncidentKind, IncidentOpened, IncidentResolved
from gpumedic_events.node import (
    ComputeMode,
    DeviceHolder,
    DiskUsage,
    GpuProcess,
    GpuSample,
    HostSample,
    JobsObservation,
    NodeSampled,
    ProcessIdentity,
)
from gpumedic_events.status import CapacityEvaluated, ClusterChecked, ServiceHeartbeat
from gpumedic_events.telemetry import SpanRecord, SpansExported

EVENT_TYPES: tuple[type[Event], ...] = (
    NodeSampled,
    GpuXidReported,
    GpuLost,
    ProcessOomKilled,
    ContainerExited,
    IncidentOpened,
    IncidentResolved,
    IncidentEscalated,
    ActionRequested,
    ActionCompleted,
    ServiceHeartbeat,
    ClusterChecked,
    CapacityEvaluated,
    MessageRejected,
    SpansExported,
)

__all__ = [
    "EVENT_TYPES",
    "MAX_EVENT_BYTES",
    "SCHEMA_VERSION",
    "SUBJECT_ROOT",
    "ActionCompleted",
    "ActionOutcome",
    "ActionRequested",
    "CapacityEvaluated",
    "ClusterChecked",
    "ComputeMode",
    "ContainerExited",
    "DeviceHolder",
    "DiskUsage",
    "Event",
    "EventDecodeError",
    "GpuLost",
    "GpuProcess",
    "GpuSample",
    "GpuXidReported",
    "HostSample",
    "IncidentEscalated",
    "IncidentKind",
    "IncidentOpened",
    "IncidentResolved",
    "JobsObservation",
    "KillGpuProcesses",
    "MessageRejected",
    "NodeId",
    "NodeSampled",
    "ProcessIdentity",
    "ProcessOomKilled",
    "ProcessTarget",
    "ServiceHeartbeat",
    "SpanRecord",
    "SpansExported",
    "SubjectToken",
    "action_id_for",
]
