"""The incident lifecycle: opened by a detector, then resolved or escalated to a person."""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpumedic_events.base import Event, NodeId

_INCIDENT_ID = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"


class IncidentKind(StrEnum):
    """What went wrong. New kinds may be added within v1; consumers must accept unknown ones."""

    ZOMBIE_JOB = "zombie_job"
    """A GPU is held but idle while the node claims jobs, and no output grows."""
    ORPHAN_GPU_HOLDER = "orphan_gpu_holder"
    """A process holds a GPU (compute context or /dev/nvidia*) whose container is gone."""
    GPU_XID = "gpu_xid"
    """The driver reported XID errors that point at the GPU rather than at a job."""
    GPU_LOST = "gpu_lost"
    """The GPU fell off the bus (NVML: GPU is lost; XID 79)."""
    CONTAINER_DIED = "container_died"
    """A container exited abnormally; the incident names the cause with its evidence."""
    DISK_PRESSURE = "disk_pressure"
    HOST_MEMORY_PRESSURE = "host_memory_pressure"
    NODE_SILENT = "node_silent"
    """No sample from the node for several of its intervals."""
    NVML_UNAVAILABLE = "nvml_unavailable"
    """The node's sampler cannot reach NVML at all (driver missing or broken)."""
    SSH_UNREACHABLE = "ssh_unreachable"
    """The remediator cannot log in to the node (refused, timeout, auth, host key changed)."""
    FLEET_ANOMALY = "fleet_anomaly"
    """One kind fired on much of the fleet at once: one incident, no node actions."""
    NO_LEADER = "no_leader"
    """A peer cluster keeps its quorum but no leader has one (leader-health)."""
    QUORUM_LOST = "quorum_lost"
    """Fewer than a majority of a peer cluster's voters are alive (without voter counts: of its peers answer)."""
    SPLIT_BRAIN = "split_brain"
    """Answering peers name different leaders."""
    LEADER_FLAPPING = "leader_flapping"
    """The cluster's leader changes too often within a window."""
    PEER_BLOCKED = "peer_blocked"
    """A peer's port accepts TCP but its HTTP never answers (a blocked event loop)."""
    PEER_DOWN = "peer_down"
    """A peer refuses connections (its daemon is not running) or its host does not answer."""
    SLOW_PEER = "slow_peer"
    """A peer answers, but slower than the policy's limit, round after round (a lagging event loop)."""
    GPU_THERMAL = "gpu_thermal"
    """A GPU at or above its slowdown temperature, or slowing itself down for heat."""
    GPU_THROTTLED = "gpu_throttled"
    """A busy GPU held down by a hardware slowdown or power brake (not by its power cap)."""
    ECC_ERRORS = "ecc_errors"
    """New uncorrectable (double-bit) ECC errors, or corrected ones faster than the policy allows."""
    ROW_REMAP = "row_remap"
    """A row remap waits for a GPU reset, or remapping failed (the GPU needs service)."""
    PCIE_DEGRADED = "pcie_degraded"
    """A busy GPU's PCIe link below its generation or width, or replaying faster than the policy allows."""
    NVLINK_DEGRADED = "nvlink_degraded"
    """An NVLink down, or its errors rising faster than the policy allows."""
    NIC_DEGRADED = "nic_degraded"
    """An InfiniBand or RoCE port that was up is down, or runs below the rate it ran at."""
    NIC_FLAPPING = "nic_flapping"
    """An InfiniBand or RoCE link keeps going down, or counts errors faster than the policy allows."""
    JOB_HUNG = "job_hung"
    """Most ranks of a job across nodes idle together with no output (a hung collective): one incident
    for the job, on the node that stopped where one is known (its ranks gone, its samples stopped, a
    fault of its GPU, NIC or host), instead of a zombie per rank."""
    GPU_STRAGGLER = "gpu_straggler"
    """A GPU far slower (clocks or power) than its siblings on the same job, and than the fleet's GPUs of its model."""
    PHANTOM_JOBS = "phantom_jobs"
    """Jobs are counted for a node (by its own status or its cluster's leader) while no process
    holds its GPUs and they idle: the processes are gone, the count stayed."""
    STUCK_PROCESS = "stuck_process"
    """An old process holds an idle GPU on a node that gives no job count to judge by."""
    IDLE_JOBS = "idle_jobs"
    """The cluster's leader counts jobs on a peer whose GPU idles, and no sampler there says more."""
    PEER_PARTITIONED = "peer_partitioned"
    """A peer sees the cluster but much of the cluster does not see it (NAT, a firewall)."""
    PEERS_BELOW_TARGET = "peers_below_target"
    """The cluster has fewer members than its target, for a while."""
    CAPACITY_SHORT = "capacity_short"
    """The task queue wants more GPUs than the workers in service give (the autoscaler rents more)."""
    CAPACITY_SURPLUS = "capacity_surplus"
    """Workers idle past the idle timeout that the queue does not need (the autoscaler ends them)."""
    QUEUE_STALLED = "queue_stalled"
    """Tasks wait in the queue while the GPUs in service idle: the workers do not take them."""
    STUCK_SPAWNING = "stuck_spawning"
    """A rented worker has been spawning too long (never got SSH details, or never came up)."""
    STALE_HEARTBEAT = "stale_heartbeat"
    """A running worker whose heartbeat in the task database is too old."""
    ORPHANED_TASKS = "orphaned_tasks"
    """Tasks In Progress on a worker the provider no longer runs."""
    UNRECORDED_WORKER = "unrecorded_worker"
    """The provider bills a worker the task database has no record of."""
    VANISHED_WORKER = "vanished_worker"
    """The task database has an active worker the provider no longer runs."""
    BURN_IN = "burn_in"
    """A newly rented worker on trial (informational): no capacity until it passes the policy's acceptance checks."""
    BURN_IN_FAILED = "burn_in_failed"
    """A newly rented worker failed its acceptance checks, or was not accepted in time: ended and replaced."""
    REPEAT_OFFENDER = "repeat_offender"
    """A host (a rented worker's machine, or an owned node) with too many incidents of one kind
    within the policy's window: a bad machine, or a fix that does not hold (fixed, back, fixed)."""
    BLACK_HOLE = "black_hole"
    """A worker whose finished tasks fail far more often than the rest of the pool's, by the task
    database: a bad image, a broken driver and CUDA pairing or a flaky host, however healthy its GPUs look."""
    FAILURE_JUMP = "failure_jump"
    """The whole pool's tasks fail far more often than they did (a bad image or driver rolled out to
    every worker, so no worker stands out from the rest): one incident that names what changed."""
    CONTROL_PLANE_BEHIND = "control_plane_behind"
    """A control-plane service handles samples later than they come (its key names it): meanwhile it
    judges no node silent, and the autoscaler scales on no samples, rather than act on what they did not see."""
    FILE_MISSING = "file_missing"
    """A file every node must have (node-sampler's expected files: the canonical models) is missing on
    a node, or differs from the copy most nodes have."""
    CHECK_FAILED = "check_failed"
    """One of the operator's own check scripts on a node says there is a problem (exit 1) for its
    check's `for_s` (its key names the check); each check may have its own ladder in the policy."""
    UNKNOWN_PEER = "unknown_peer"
    """A peer the cluster's daemons count as a member is in no inventory (runbook 002's `test`): a
    stray daemon, a test instance, a node renamed; its key names it."""
    LOG_PATTERN = "log_pattern"
    """One of the operator's log patterns matched `count` lines on a node within its `window_s`
    (its key names the pattern); each pattern may have its own ladder in the policy."""
    SAMPLES_LOST = "samples_lost"
    """Samples of many nodes were not acknowledged by the bus (dropped at ingest, or the bus away), as
    the nodes say in their next samples: one incident for the control plane, none for the nodes."""


WHOLE_KINDS = frozenset({
    IncidentKind.FLEET_ANOMALY, IncidentKind.CAPACITY_SHORT, IncidentKind.CAPACITY_SURPLUS, IncidentKind.QUEUE_STALLED,
    IncidentKind.ORPHANED_TASKS, IncidentKind.NO_LEADER, IncidentKind.QUORUM_LOST, IncidentKind.SPLIT_BRAIN,
    IncidentKind.LEADER_FLAPPING, IncidentKind.PEERS_BELOW_TARGET, IncidentKind.CONTROL_PLANE_BEHIND,
    IncidentKind.SAMPLES_LOST, IncidentKind.FAILURE_JUMP,
})
"""Kinds about the fleet, the worker pool, the peer cluster or gpumedic itself as a whole: no one host's doing."""


class IncidentEvent(Event):
    """Fields shared by every incident event; routed by node."""

    subject_key: ClassVar[str | None] = "node_id"

    incident_id: uuid.UUID = Field(description="The incident this event belongs to.")
    node_id: NodeId
    kind: IncidentKind = Field(description="What kind of failure the incident is.")
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="The GPU concerned, if one.")


Evidence = dict[str, str | int | float | bool | None]

Severity = Literal["info", "warning", "critical"]


class Diagnosis(BaseModel):
    """Why it happened, as far as the evidence goes: one cause, how sure, and what to do about it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    cause: str = Field(max_length=64, description="The cause, e.g. host_oom, cgroup_oom, gpu_oom, segfault, sigterm.")
    confidence: float = Field(ge=0, le=1, description="How sure the evidence makes it, 0 to 1.")
    explanation: str = Field(max_length=1000, description="The evidence that names this cause, in one or two sentences.")
    remedies: tuple[str, ...] = Field(default=(), max_length=8, description="What the job's owner or the operator can do.")


class IncidentOpened(IncidentEvent):
    """A detector saw a failure and opened an incident for it."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.opened"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "0c6f1e0a-2a55-4e8e-8f61-6a3f1b2c3d01",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:05Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "fingerprint": "gpu-node-07/zombie_job/0",
                    "summary": "GPU 0 below 5% for 600s while the node reports 1 job and no output grows",
                    "evidence": {"idle_seconds": 600.0, "jobs_running": 1, "holder_pids": "41230"},
                    "severity": "warning",
                    "recommended_action": "kill the hung job's processes (kill_gpu_processes)",
                }
            ]
        }
    )

    fingerprint: str = Field(max_length=200, description="(node, kind, gpu): one open incident per fingerprint.")
    summary: str = Field(max_length=1000, description="One sentence a person understands.")
    evidence: Evidence = Field(default_factory=dict, description="The measurements that led to the incident.")
    severity: Severity = Field(default="warning", description="How bad: info, warning or critical.")
    diagnosis: Diagnosis | None = Field(default=None, description="The cause with its confidence, where one is named.")
    recommended_action: str = Field(default="", max_length=500, description="What fixes it: gpumedic's next action, or a person's.")
    related_incident_id: uuid.UUID | None = Field(
        default=None, description="The incident this one belongs to, e.g. the fleet incident it is part of."
    )
    silence_id: uuid.UUID | None = Field(
        default=None, description="Set when a silence covered it: recorded, and no action is requested."
    )


class IncidentUpdated(IncidentEvent):
    """An open incident learned more: it repeated, or a related fact or incident joined it."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.updated"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "7d1e2f3a-4b5c-4d6e-8f70-81a2b3c4d5e6",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:20:00Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "gpu_xid",
                    "gpu_index": 0,
                    "occurrences": 42,
                    "summary": "XID 48 (double-bit ECC error) on GPU 0, 42 times in 3 minutes",
                    "evidence": {"xid": 48, "count": 42},
                }
            ]
        }
    )

    occurrences: int = Field(ge=1, description="How often the fault was seen since the incident opened.")
    summary: str = Field(max_length=1000)
    evidence: Evidence = Field(default_factory=dict, description="What is new.")
    related_incident_id: uuid.UUID | None = Field(default=None, description="An incident this one is now linked to.")


class IncidentResolved(IncidentEvent):
    """The failure is gone: fixed by an action and verified, or cleared by itself."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.resolved"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "5e2d7c10-7a4b-4f0e-b1a2-3c4d5e6f7a02",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:20Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "resolution": "fixed",
                    "summary": "GPU 0 holds no process after the kill; verified by the next sample",
                }
            ]
        }
    )

    resolution: Literal["fixed", "cleared"] = Field(
        description="fixed: an action ran and the next samples confirmed it; cleared: it went away by itself."
    )
    summary: str = Field(max_length=1000)


class IncidentEscalated(IncidentEvent):
    """gpumedic will not (or could not) fix this; a person must look."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.escalated"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c03",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:16:00Z",
                    "source": "zombie-detector",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "reason": "2 kill attempts did not free GPU 0",
                }
            ]
        }
    )

    reason: str = Field(max_length=1000, description="Why a person is needed.")


class IncidentCosted(IncidentEvent):
    """What a closed incident cost: the GPU time it kept from work, and its price (report-builder
    works it out when the incident resolves or escalates: `gpumedic_store.cost`)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.incident.costed"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "0c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e04",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:21Z",
                    "source": "report-builder",
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "kind": "zombie_job",
                    "gpu_index": 0,
                    "opened_at": "2026-11-22T10:12:00Z",
                    "closed_at": "2026-11-22T10:15:20Z",
                    "gpu_hours": 0.5556,
                    "usd": 1.38,
                    "price_per_gpu_hour": 2.49,
                    "price_from": "the inventory's price_per_gpu_hour",
                    "provider": "lambda",
                    "what": "GPU 0 idle from 1800 s before it opened",
                }
            ]
        }
    )

    opened_at: AwareDatetime = Field(description="When the incident opened.")
    closed_at: AwareDatetime = Field(description="When it resolved or escalated.")
    gpu_hours: float = Field(ge=0, description="GPU-hours kept from work, the idle time before it opened included.")
    usd: float | None = Field(default=None, ge=0, description="Their price in dollars; None where no price is known.")
    price_per_gpu_hour: float | None = Field(default=None, ge=0, description="The price of one GPU-hour used.")
    price_from: str = Field(default="", max_length=200, description="Where the price came from: the provider's, or the inventory's.")
    provider: str | None = Field(default=None, max_length=128, description="Who rents the node or worker out, where known.")
    what: str = Field(default="", max_length=1000, description="What was counted, in words.")
