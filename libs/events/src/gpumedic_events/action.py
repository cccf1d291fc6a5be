"""Action requests from the brains (detectors, autoscaler) and results from the hands (remediator).

Actions are a closed catalogue of typed operations; there is no free-form command.
"""

from __future__ import annotations

import hashlib
import uuid
from enum import StrEnum
from typing import Annotated, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from gpumedic_events.base import Event, NodeId
from gpumedic_events.node import JOB_ID_PATTERN

_ACTION_NAMESPACE = uuid.UUID("6c1f0a3e-9b1d-4e55-a2f4-0d3c2b1a9e8f")
_INCIDENT_ID = "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"
_ACTION_ID = "1f7e3b2a-6c5d-5e4f-9a8b-7c6d5e4f3a21"


def action_id_for(incident_id: uuid.UUID, attempt: int) -> uuid.UUID:
    """The deterministic id of an incident's n-th action: a retried request de-duplicates."""
    return uuid.uuid5(_ACTION_NAMESPACE, f"{incident_id}/{attempt}")


class ProcessTarget(BaseModel):
    """A process to act on, identified by pid, start time and command line, so a recycled pid is never hit.

    The remediator refuses a target that lacks any of the three: a pid alone names whatever
    process holds that number now.
    """

    model_config = ConfigDict(frozen=True, extra="ignore")

    pid: int = Field(ge=2, le=4_194_304, description="Process id; 1 (init) is never a target.")
    start_ticks: int | None = Field(
        default=None,
        ge=0,
        description="Expected /proc/PID/stat start time (field 22). Required by the remediator, which refuses on mismatch.",
    )
    command: str = Field(
        default="",
        max_length=4096,
        description="Expected command line (arguments joined by spaces). Required by the remediator, which refuses on mismatch.",
    )


class KillGpuProcesses(BaseModel):
    """Kill the processes holding one GPU, after checking each is still the process that was seen.

    With `signal: TERM` a target that outlives `grace_s` gets SIGKILL (its identity checked again)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["kill_gpu_processes"] = "kill_gpu_processes"
    gpu_index: int = Field(ge=0, le=63, strict=True, description="A JSON integer; `true` is not GPU 1.")
    targets: tuple[ProcessTarget, ...] = Field(min_length=1, max_length=64)
    signal: Literal["TERM", "KILL"] = Field(default="KILL", description="Signal to send first.")
    grace_s: float = Field(
        default=0.0,
        ge=0,
        le=300,
        description="After SIGTERM: how long a target may take to exit before it gets SIGKILL (0: never SIGKILL).",
    )
    max_gpu_utilization_pct: int | None = Field(
        default=None,
        ge=0,
        le=100,
        description="The GPU state the incident describes: the remediator reads the GPU's utilisation on the node "
        "just before acting and refuses if it is above this (the job came back to life). Required by the remediator.",
    )

    def describe(self) -> str:
        how = f"SIGTERM, SIGKILL after {self.grace_s:g}s" if self.signal == "TERM" and self.grace_s else f"SIG{self.signal}"
        return f"kill pid {', '.join(str(t.pid) for t in self.targets)} on GPU {self.gpu_index} ({how})"


UNIT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9:_.@-]{0,246}[.]service$"
"""A systemd service name: letters, digits and `:_.@-`, ending in `.service`; never a path, an
option, a glob or an escape."""


class RestartUnit(BaseModel):
    """Restart one systemd service on the node (from the policy's allow-list for the node's groups)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["restart_unit"] = "restart_unit"
    unit: str = Field(pattern=UNIT_PATTERN, max_length=255, description="e.g. gpumedic-node-sampler.service")

    def describe(self) -> str:
        return f"restart {self.unit}"


class GpuReset(BaseModel):
    """Reset one GPU (`nvidia-smi --gpu-reset`), only when nothing holds it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["gpu_reset"] = "gpu_reset"
    gpu_index: int = Field(ge=0, le=63, strict=True, description="A JSON integer; `true` is not GPU 1.")

    def describe(self) -> str:
        return f"reset GPU {self.gpu_index}"


class DockerPrune(BaseModel):
    """Free space under /var/lib/docker: stopped containers, dangling images, build cache (volumes
    only when the request asks and the policy allows it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["docker_prune"] = "docker_prune"
    volumes: bool = Field(default=False, description="Also unused volumes; refused unless the policy allows it.")

    def describe(self) -> str:
        return "prune /var/lib/docker" + (" (volumes too)" if self.volumes else "")


class RebootNode(BaseModel):
    """Reboot the node; refused unless the policy enables it explicitly."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["reboot_node"] = "reboot_node"

    def describe(self) -> str:
        return "reboot the node"


ENDPOINT_PATTERN = r"^[a-z][a-z0-9_]{0,39}$"
"""The name of an admin endpoint in the policy's closed list: never a URL, a path or a method."""


class HttpAdmin(BaseModel):
    """Call one admin endpoint of a peer daemon (reset a node's job count, force an election), by
    its name in the policy's closed list, with the bearer token of the remediator's secrets file.
    The policy says where it is called: on the incident's node, or on the cluster's leader (`at`,
    as the detector knows it); and the JSON body, filled from the incident."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["http_admin"] = "http_admin"
    endpoint: str = Field(pattern=ENDPOINT_PATTERN, description="e.g. force_election; the policy gives its URL.")
    at: NodeId | None = Field(
        default=None, description="The node to call it on, for an endpoint the policy calls on the cluster's leader."
    )

    def describe(self) -> str:
        return f"call the {self.endpoint} endpoint on {self.at}" if self.at else f"call the node's {self.endpoint} endpoint"


class RankTarget(ProcessTarget):
    """One rank of a job across nodes: where it runs (node and GPU) and the process as it was seen."""

    node_id: NodeId
    gpu_index: int = Field(ge=0, le=63, strict=True, description="A JSON integer; `true` is not GPU 1.")


class StopJob(BaseModel):
    """Stop a hung job's ranks on every node of the job, so that its launcher (torchrun's agents, a
    scheduler's requeue) starts it again from its last checkpoint without the node that stopped.

    Nothing is signalled unless every rank's GPU is still idle (at most `max_gpu_utilization_pct`)
    and every node but the incident's answers; each rank is checked to be the process seen (start
    time, command line) right before its signal: SIGTERM, SIGKILL after `grace_s`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["stop_job"] = "stop_job"
    job: str = Field(pattern=JOB_ID_PATTERN, description="The job's id, as its ranks' launcher named it.")
    ranks: tuple[RankTarget, ...] = Field(min_length=1, max_length=512)
    grace_s: float = Field(default=10.0, ge=0, le=300, description="After SIGTERM: how long a rank may take to exit before SIGKILL.")
    max_gpu_utilization_pct: int = Field(ge=0, le=100, description="The state the hang was judged in: a rank's GPU busier than "
                                         "this means the job works again, and nothing is stopped.")

    def describe(self) -> str:
        nodes = len({r.node_id for r in self.ranks})
        return f"stop the {len(self.ranks)} rank(s) of the job {self.job} on {nodes} node(s)"


class KillPattern(BaseModel):
    """End every process on the node whose command line matches one of the policy's allow-listed
    patterns, named (runbook 000's `pkill -f 'python.*selfplay'`, when a job's launcher starts its
    killed processes again): a request names the pattern, never carries one.

    Nothing is signalled unless every GPU of the node still idles (at most `max_gpu_utilization_pct`:
    the pattern would end the work of a busy one too); each match is checked to be the process
    listed (start time, command line still matching) right before SIGTERM, SIGKILL after `grace_s`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["kill_pattern"] = "kill_pattern"
    pattern: str = Field(pattern=ENDPOINT_PATTERN, description="The pattern's name in actions.kill_pattern.patterns.")
    grace_s: float = Field(default=10.0, ge=0, le=300, description="After SIGTERM: how long a process may take to exit before SIGKILL.")
    max_gpu_utilization_pct: int = Field(ge=0, le=100, description="The state the node was judged in: a GPU busier than this "
                                         "means work the pattern would end too, and nothing is signalled.")

    def describe(self) -> str:
        return f"end the processes matching {self.pattern} (SIGTERM, SIGKILL after {self.grace_s:g}s)"


class RestartJob(BaseModel):
    """Start the work again after a verified kill (the runbook's `--cleanup-zombies`) or a hung job's
    verified stop: one job of the policy's allow-list, by name (a systemd unit, or an absolute path
    run without arguments), on the incident's node or, for a job across nodes, on `nodes`."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["restart_job"] = "restart_job"
    job: str = Field(pattern=ENDPOINT_PATTERN, description="The job's name in actions.restart_job.jobs.")
    nodes: tuple[NodeId, ...] = Field(
        default=(), max_length=512, description="Where a job across nodes starts again (never the node that stopped, the "
        "incident's); empty: on the incident's node."
    )

    @field_validator("nodes")
    @classmethod
    def _each_once(cls, nodes: tuple[str, ...]) -> tuple[str, ...]:
        if len(set(nodes)) != len(nodes):
            raise ValueError("a node is listed twice")
        return nodes

    def describe(self) -> str:
        return f"restart the job {self.job} on {len(self.nodes)} node(s)" if self.nodes else f"restart the job {self.job}"


class DrainNode(BaseModel):
    """Take the node out of service: no new jobs. Nothing runs on the node; the remediator records
    the drain, calls the scheduler's hook where the policy names one, and publishes NodeDrained."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["drain_node"] = "drain_node"

    def describe(self) -> str:
        return "drain the node"


class UndrainNode(BaseModel):
    """Give the node back to the scheduler once its incident is fixed and validated. The node stays
    drained while another incident still holds it, or the policy's check command fails on it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["undrain_node"] = "undrain_node"

    def describe(self) -> str:
        return "undrain the node"


WORKER_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
"""A worker's id is also the node id of its incidents (one subject token)."""
TASK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$"
WorkerId = Annotated[str, Field(pattern=WORKER_ID_PATTERN, description="The provider's id for a worker.")]
TaskId = Annotated[str, Field(pattern=TASK_ID_PATTERN, description="A task's id in the user's task table.")]


class SpawnWorker(BaseModel):
    """Rent `count` workers from the provider, each with `gpus` GPUs of `gpu_type` (from the
    policy's allow-list). Runs nothing on a node; harms no job, so outside the per-node limit and
    the breaker's count."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["spawn_worker"] = "spawn_worker"
    gpu_type: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9 ._-]{0,63}$", description="The provider's GPU type id.")
    gpus: int = Field(ge=1, le=8)
    count: int = Field(default=1, ge=1, le=16, description="Workers to rent, alike.")

    def describe(self) -> str:
        return f"rent {self.count} worker(s) with {self.gpus} x {self.gpu_type}"


class TerminateWorker(BaseModel):
    """End rented workers at the provider (whatever runs on them ends with them)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["terminate_worker"] = "terminate_worker"
    worker_ids: tuple[WorkerId, ...] = Field(min_length=1, max_length=16)

    def describe(self) -> str:
        return f"terminate worker(s) {', '.join(self.worker_ids)}"


class RestartWorker(BaseModel):
    """Restart the rented pod the request's node runs on, through the provider's API (RunPod:
    `POST /pods/{podId}/restart`): the whole pod, not its container, which is what frees a GPU
    that stays busy after every kill (runbook 003). Everything on the pod restarts with it. The
    worker is the provider's pod whose id or name is the node's id."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["restart_worker"] = "restart_worker"

    def describe(self) -> str:
        return "restart the node's rented pod through the provider"


class RequeueTasks(BaseModel):
    """Put tasks left `In Progress` on a worker that is gone back in the queue, with the policy's
    statement on the user's task database (which requeues only tasks still in progress, so a task
    is requeued once however often this is asked)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["requeue_tasks"] = "requeue_tasks"
    task_ids: tuple[TaskId, ...] = Field(min_length=1, max_length=500)

    def describe(self) -> str:
        return f"requeue {len(self.task_ids)} task(s)"


class MarkWorkerEnded(BaseModel):
    """Mark a worker's record ended in the user's database (the provider no longer has it)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["mark_worker_ended"] = "mark_worker_ended"
    worker_id: WorkerId

    def describe(self) -> str:
        return f"mark worker {self.worker_id} ended in the task database"


class AcceptWorker(BaseModel):
    """Accept a newly rented worker (its burn-in): pre-flight on the node and DCGM's diagnostic where
    installed, read-only, then the policy's promotion statement in the task database. Harms no job,
    so outside the per-node limit and the breaker's count."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    operation: Literal["accept_worker"] = "accept_worker"

    def describe(self) -> str:
        return "check a new worker's GPUs and accept it"


Operation = Annotated[
    KillGpuProcesses | RestartUnit | GpuReset | DockerPrune | RebootNode | HttpAdmin | RestartJob | DrainNode | UndrainNode
    | SpawnWorker | TerminateWorker | RestartWorker | RequeueTasks | MarkWorkerEnded | AcceptWorker | StopJob | KillPattern,
    Field(discriminator="operation"),
]
"""The closed catalogue: every operation an ActionRequested may carry, told apart by `operation`."""

OPERATION_NAMES: tuple[str, ...] = (
    "kill_gpu_processes", "restart_unit", "gpu_reset", "docker_prune", "reboot_node", "http_admin", "restart_job", "drain_node", "undrain_node",
    "spawn_worker", "terminate_worker", "restart_worker", "requeue_tasks", "mark_worker_ended", "accept_worker", "stop_job",
    "kill_pattern",
)


def operation_gpu(operation: BaseModel) -> int | None:
    """The GPU an operation acts on, None for the node as a whole."""
    return getattr(operation, "gpu_index", None)


FINGERPRINT_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}(/[A-Za-z0-9][A-Za-z0-9_-]{0,62}){1,3}$"


class ActionEvent(Event):
    """Fields shared by action events; routed by node."""

    subject_key: ClassVar[str | None] = "node_id"

    action_id: uuid.UUID = Field(description="Deterministic per (incident, attempt), so predictable: with what the request asks, the idempotency key.")
    incident_id: uuid.UUID
    node_id: NodeId
    attempt: int = Field(ge=1, le=100, description="Which attempt at fixing the incident this is.")


class ActionRequested(ActionEvent):
    """A brain asks the remediator to act on a node."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.action.requested"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "2a3b4c5d-6e7f-4a8b-9c0d-1e2f3a4b5c04",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:05Z",
                    "source": "zombie-detector",
                    "action_id": _ACTION_ID,
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "attempt": 1,
                    "operation": {
                        "operation": "kill_gpu_processes",
                        "gpu_index": 0,
                        "targets": [{"pid": 41230, "start_ticks": 8812345, "command": "python train.py --epochs 90"}],
                        "signal": "TERM",
                        "grace_s": 10.0,
                        "max_gpu_utilization_pct": 4,
                    },
                    "reason": "zombie job on GPU 0",
                    "fingerprint": "gpu-node-07/zombie_job/0",
                }
            ]
        }
    )

    operation: Operation = Field(description="What to do, from the closed catalogue.")
    reason: str = Field(max_length=1000, description="Why, in one sentence.")
    fingerprint: str | None = Field(
        default=None,
        pattern=FINGERPRINT_PATTERN,
        description="The open incident's fingerprint (node/kind/gpu). The remediator looks the incident up by it "
        "and refuses a request whose incident is unknown, closed, or waiting for another action. Required by the remediator.",
    )

    @property
    def request_sha256(self) -> str:
        """SHA-256 of what the request asks (who, for which incident and attempt, on which node, what):
        every field but its event id, time and wording. The action id is predictable, so it alone
        names no request: a forgery sent first under a real action id is another request, and
        takes neither its place in the stream nor in the remediator's ledger."""
        asked = self.model_dump_json(include={"source", "action_id", "incident_id", "node_id", "attempt", "operation", "fingerprint"})
        return hashlib.sha256(asked.encode()).hexdigest()


class ActionOutcome(StrEnum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    BLOCKED = "blocked"
    """The remediator's gate refused; `detail` says which rule."""
    OBSERVED = "observed"
    """Observe mode: the action was decided and recorded, never run."""
    INTERRUPTED = "interrupted"
    """The remediator stopped mid-action; it is not run again blindly."""


class ActionCompleted(ActionEvent):
    """The remediator's answer to a request: what it did, or why it did not."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.action.completed"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "3c4d5e6f-7a8b-4c9d-8e0f-1a2b3c4d5e05",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:06Z",
                    "source": "remediator",
                    "action_id": _ACTION_ID,
                    "incident_id": _INCIDENT_ID,
                    "node_id": "gpu-node-07",
                    "attempt": 1,
                    "outcome": "succeeded",
                    "detail": "sent KILL to 41230",
                    "steps": ["cat /proc/41230/stat", "kill -s KILL 41230"],
                    "request_sha256": "428ba2b39224a85d2949f8aad3db7b993f5edd6553aa0ed9f86d4758d0b5907c",
                }
            ]
        }
    )

    outcome: ActionOutcome
    detail: str = Field(max_length=2000, description="What happened, for a person.")
    steps: tuple[str, ...] = Field(default=(), max_length=64, description="Commands run on the node, in order.")
    request_sha256: str | None = Field(
        default=None,
        pattern=r"^[0-9a-f]{64}$",
        description="The answered request's `request_sha256`: an asker takes only the answer to its own request, "
        "not one to a forgery sent under the same action id.",
    )
    in_use: bool = Field(
        default=False,
        description="Blocked only because its target is in use (a GPU reset while a process holds the GPU): asking "
        "again once it is free may succeed. False for every other outcome and refusal.",
    )
