"""Status facts the services publish about themselves and the fleet as a whole."""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_events.base import Event, SubjectToken
from gpumedic_events.node import CpuPressure


class ConsumerLag(BaseModel):
    """How far behind its stream one of a service's consumers is, as it knows itself."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    durable: SubjectToken
    pending: int = Field(ge=0, description="Messages waiting for it in the stream.")
    behind_s: float = Field(ge=0, description="While any wait, the age of the newest message it has handled; else 0.")


class ServiceHeartbeat(Event):
    """A service is ready (published at start and every few seconds) or is stopping."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.service.heartbeat"
    subject_key: ClassVar[str | None] = "service"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "4d5e6f7a-8b9c-4d0e-9f1a-2b3c4d5e6f06",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:00:00Z",
                    "source": "zombie-detector",
                    "service": "zombie-detector",
                    "instance_id": "5e6f7a8b-9c0d-4e1f-8a2b-3c4d5e6f7a07",
                    "state": "ready",
                    "lag": [{"durable": "zombie-detector-samples", "pending": 12, "behind_s": 0.04}],
                    "loop_lag_s": 0.003,
                    "cpu_pressure": {"some_avg10_pct": 4.1, "full_avg10_pct": 0.0},
                }
            ]
        }
    )

    service: SubjectToken
    instance_id: uuid.UUID = Field(description="One id per running process of the service.")
    state: Literal["ready", "stopping"]
    consumers_missing: tuple[SubjectToken, ...] = Field(
        default=(), max_length=64,
        description="Durable consumers of this service that no longer exist (deleted, or never provisioned): it receives "
        "nothing of them until `gpumedic provision` makes them again.",
    )
    lag: tuple[ConsumerLag, ...] = Field(
        default=(), max_length=64, description="How far behind its stream each of its sample consumers is."
    )
    loop_lag_s: float | None = Field(
        default=None, ge=0, description="The worst lateness of its event loop over the last few seconds: how much later "
        "than asked its own timers fired. While it is past a second, what the service times (SSH checks, peer probes, "
        "a node's silence) measures its own starvation, and it judges no timeout. None from services before 2026-12.",
    )
    cpu_pressure: CpuPressure | None = Field(
        default=None, description="Its host's CPU pressure (/proc/pressure/cpu), or its cgroup's where it runs in one."
    )


class PeerProblem(BaseModel):
    """A peer that did not give a usable status, and why (from leader-health's layered probe)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    url: str = Field(max_length=512, description="The status URL probed.")
    state: Literal["unreachable", "down", "blocked", "unhealthy", "bad_answer"] = Field(
        description="unreachable: no TCP answer (the host); down: connection refused (the daemon); blocked: TCP "
        "accepted, HTTP silent (a blocked event loop); unhealthy: /health answered an error; bad_answer: /status "
        "unusable (not JSON, fields missing, too large, a redirect)."
    )
    detail: str = Field(default="", max_length=300)


class PeerJobs(BaseModel):
    """One peer's work as the cluster's leader counts it (its `/status`: `peers[id].selfplay_jobs`,
    `peers[id].gpu_percent` in the runbooks' daemon)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    node_id: str = Field(min_length=1, max_length=253, description="The peer's id as the daemon spells it.")
    jobs: int | None = Field(default=None, ge=0, description="Jobs the leader counts on it; None when it gives none.")
    gpu_percent: float | None = Field(default=None, ge=0, le=100, description="Its GPU utilisation as the leader reports it.")


class PeerRow(BaseModel):
    """One probed peer in a cluster check, as the runbook's table shows it."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    url: str = Field(max_length=512, description="The status URL probed.")
    state: Literal["ok", "unreachable", "down", "blocked", "unhealthy", "bad_answer"]
    node_id: str | None = Field(default=None, max_length=253, description="Its id as it names itself (None: no usable answer).")
    role: str | None = Field(default=None, max_length=32)
    voter: bool | None = Field(default=None, description="Whether the answering daemons count it a voter.")
    answer_ms: float = Field(default=0.0, ge=0, description="How long its probe took.")
    jobs: int | None = Field(default=None, ge=0, description="Its jobs as the leader counts them.")
    gpu_percent: float | None = Field(default=None, ge=0, le=100, description="Its GPU % as the leader reports it.")
    sees: tuple[str, ...] = Field(default=(), max_length=256, description="The peers its answer lists alive (runbook 002's "
                                  "who-sees-whom: a pair seen one way only is NAT or a firewall); empty when it did not answer.")


class ClusterChecked(Event):
    """leader-health's periodic check of a peer cluster: one line of the cluster monitoring log."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.cluster.checked"
    subject_key: ClassVar[str | None] = "cluster"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "6f7a8b9c-0d1e-4f2a-9b3c-4d5e6f7a8b08",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:00:30Z",
                    "source": "leader-health",
                    "cluster": "selfplay",
                    "peers_total": 3,
                    "peers_answering": 2,
                    "leader": "gpu-node-01",
                    "healthy": True,
                    "summary": "2/3 peers answer; leader gpu-node-01; 1 blocked",
                    "problems": [
                        {
                            "url": "http://10.0.0.9:8770/status",
                            "state": "blocked",
                            "detail": "/health: the port accepts TCP but HTTP does not answer within 3s (a blocked event loop)",
                        }
                    ],
                }
            ]
        }
    )

    cluster: SubjectToken
    peers_total: int = Field(ge=0)
    peers_answering: int = Field(ge=0)
    voters_alive: int | None = Field(default=None, ge=0, description="Voters alive as the daemons count them (the leader's count, else the most common); None when they report none.")
    voters_total: int | None = Field(default=None, ge=0, description="Voters configured as the daemons count them; None when they report none.")
    leader: str | None = Field(default=None, max_length=256, description="The leader most peers name, if any.")
    healthy: bool
    summary: str = Field(max_length=1000)
    problems: tuple[PeerProblem, ...] = Field(
        default=(), max_length=200, description="Peers without a usable status and why (the first 200)."
    )
    one_way: tuple[str, ...] = Field(
        default=(),
        max_length=200,
        description="From the answering peers' alive lists: 'a>b' where a sees b alive but b, answering, does not "
        "see a (a NAT or firewall in one direction); the first 200.",
    )
    unseen: tuple[str, ...] = Field(
        default=(), max_length=200, description="Answering peers that no other answering peer lists as alive."
    )
    peers: tuple[PeerRow, ...] = Field(
        default=(), max_length=4096, description="Every probed peer: its state, role, vote, answer time, and jobs and GPU % "
        "as the leader counts them.",
    )
    leader_view: tuple[PeerJobs, ...] = Field(
        default=(), max_length=4096,
        description="Each peer's jobs and GPU % as the answering leader reports them, or with no leader as the answering "
        "peer that reports the most peers does (`view_by` names whose; the runbooks' daemons each list every peer's; empty "
        "when none gives them): the runbooks' own zombie view, which zombie-detector checks against the nodes' samples.",
    )
    view_by: str | None = Field(default=None, max_length=256, description="The peer whose view `leader_view` is: the leader, "
                                "or with none, the answering peer that counts the most peers.")


class WorkerRow(BaseModel):
    """One worker as the autoscaler's round saw it: the provider's word and the task database's
    (runbook 001's workers table: id, status, heartbeat age, host, $/h, task)."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    worker_id: str = Field(min_length=1, max_length=128)
    status: str = Field(max_length=32, description="The provider's: spawning, running, ...")
    record_status: str | None = Field(default=None, max_length=64, description="The task database's worker status; None: no record.")
    heartbeat_age_s: float | None = Field(default=None, ge=0, description="Since its last heartbeat in the task database; None: none.")
    host: str | None = Field(default=None, max_length=253, description="Its SSH host and port, once the provider gives them.")
    gpu_type: str = Field(default="", max_length=128)
    gpus: int = Field(default=0, ge=0, le=64)
    price_per_h: float = Field(default=0.0, ge=0, description="What it costs an hour ($), all its GPUs together.")
    task: str | None = Field(default=None, max_length=128, description="A task the task database has In Progress on it.")
    in_service: bool = Field(description="Counted as capacity (not stuck spawning, not drained, nothing a person must look at).")


class CapacityEvaluated(Event):
    """The autoscaler's periodic view of demand and supply, and what it decided."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.capacity.evaluated"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "7a8b9c0d-1e2f-4a3b-8c4d-5e6f7a8b9c09",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:01:00Z",
                    "source": "autoscaler",
                    "nodes_seen": 4,
                    "gpus_total": 32,
                    "gpus_busy": 27,
                    "decision": "hold",
                    "reason": "27/32 GPUs busy; within target band",
                }
            ]
        }
    )

    nodes_seen: int = Field(ge=0, description="Nodes that sampled within the window.")
    nodes_drained: int = Field(
        default=0, ge=0, description="Of those, drained nodes (NodeDrained): their GPUs are no capacity and are not counted."
    )
    gpus_total: int = Field(ge=0)
    gpus_busy: int = Field(ge=0, description="GPUs above the busy threshold.")
    decision: Literal["hold", "scale_up", "scale_down"]
    reason: str = Field(max_length=1000)
    queued: int | None = Field(default=None, ge=0, description="Tasks waiting, from the demand source (None: none configured or unreadable).")
    in_progress: int | None = Field(default=None, ge=0, description="Tasks running, from the demand source.")
    gpus_wanted: int | None = Field(default=None, ge=0, description="What the queue asks for, within the policy's bounds.")
    change_gpus: int = Field(default=0, ge=0, description="GPUs to add (scale_up) or to free (scale_down).")
    release: tuple[str, ...] = Field(default=(), max_length=100, description="Idle nodes proposed for removal, idlest first.")
    demand_error: str | None = Field(
        default=None, max_length=500, description="Why the demand source could not be read; no decision was made on it."
    )
    provider_error: str | None = Field(
        default=None, max_length=500, description="Why the provider's workers could not be listed; no decision was made."
    )
    workers: int | None = Field(default=None, ge=0, description="Workers the provider bills (spawning or running); None: no provider.")
    workers_in_service: int | None = Field(
        default=None, ge=0, description="Of those, the capacity: not stuck spawning, not drained, no incident a person must look at."
    )
    cost_per_h: float | None = Field(default=None, ge=0, description="What the billed workers cost an hour now ($).")
    cost_total: float | None = Field(default=None, ge=0, description="$ spent on workers since the autoscaler started.")
    idle_gpu_hours: float | None = Field(default=None, ge=0, description="GPU-hours in service but idle since the autoscaler started.")
    cost_per_task: float | None = Field(
        default=None, ge=0, description="$ per task completed over the cost window (None: no task completed in it)."
    )
    tasks_done: int | None = Field(
        default=None, ge=0, description="Tasks the pool finished well over the task database's outcomes window (None: not read)."
    )
    tasks_failed: int | None = Field(default=None, ge=0, description="Tasks that failed over the same window.")
    worker_rows: tuple[WorkerRow, ...] = Field(
        default=(), max_length=1000, description="Each live worker this round (the first 1000): `gpumedic workers`."
    )
