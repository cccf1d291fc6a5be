"""What a node-sampler reports the moment it happens, between samples: an XID error, a GPU that
fell off the bus, a process the kernel's OOM killer ended, a container that exited.

Each carries the node id as its subject key, so `gpumedic.v1.*.*.gpu-node-07` style filters and
per-node consumers work as for samples. Free text from the node (kernel lines, container logs,
names) is length-capped here, so a hostile or runaway node cannot grow a message without bound.
"""

from __future__ import annotations

from typing import Annotated, ClassVar

from pydantic import AwareDatetime, ConfigDict, Field

from gpumedic_events.base import Event, NodeId

MAX_LINE = 1024
LogLine = Annotated[str, Field(max_length=MAX_LINE)]


class GpuXidReported(Event):
    """The driver reported an XID error on a GPU (NVML event set: XID critical error)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.gpu.xid_reported"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "0b7e2f44-9b43-4d55-8f3e-1f2a3b4c5d6e",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:16:02Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "gpu_index": 3,
                    "gpu_uuid": "GPU-5f1c2a7e-0000-4000-8000-000000000007",
                    "xid": 79,
                    "description": "GPU has fallen off the bus",
                }
            ]
        }
    )

    node_id: NodeId
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="NVML index; None if not resolvable.")
    gpu_uuid: str = Field(default="", max_length=96, description="NVML device UUID.")
    xid: int = Field(ge=0, le=2**32 - 1, description="The XID number (e.g. 79: fallen off the bus).")
    description: str = Field(default="", max_length=200, description="What this XID usually means; empty if unknown.")


class GpuLost(Event):
    """A GPU stopped answering NVML: fallen off the bus, or gone from the device list."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.gpu.lost"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "1c8f3055-ac54-4e66-9f4f-2a3b4c5d6e7f",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:16:05Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "gpu_index": 3,
                    "gpu_uuid": "GPU-5f1c2a7e-0000-4000-8000-000000000007",
                    "reason": "NVMLError_GpuIsLost",
                }
            ]
        }
    )

    node_id: NodeId
    gpu_index: int = Field(ge=0, le=63, description="NVML index of the GPU.")
    gpu_uuid: str = Field(default="", max_length=96, description="Its UUID as last read; empty if never read.")
    reason: str = Field(max_length=200, description="What said so, e.g. NVMLError_GpuIsLost.")


class ProcessOomKilled(Event):
    """The kernel's OOM killer ended a process (parsed from the kernel log)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.process.oom_killed"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "2d904166-bd65-4f77-8a5a-3b4c5d6e7f80",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:17:41Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "pid": 41230,
                    "process_name": "python",
                    "uid": 1000,
                    "constraint": "CONSTRAINT_MEMCG",
                    "cgroup": "/system.slice/docker-3f9c2a7d.scope",
                    "container_id": "3f9c2a7d",
                    "anon_rss_kib": 31457280,
                    "kernel_lines": [
                        "oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=docker-3f9c2a7d.scope,"
                        "mems_allowed=0,oom_memcg=/system.slice/docker-3f9c2a7d.scope,"
                        "task_memcg=/system.slice/docker-3f9c2a7d.scope,task=python,pid=41230,uid=1000",
                        "Memory cgroup out of memory: Killed process 41230 (python) total-vm:62914560kB, "
                        "anon-rss:31457280kB, file-rss:0kB, shmem-rss:0kB, UID:1000 pgtables:61440kB oom_score_adj:0",
                    ],
                }
            ]
        }
    )

    node_id: NodeId
    pid: int = Field(ge=1, le=4_194_304, description="The killed process.")
    process_name: str = Field(default="", max_length=64, description="Its name as the kernel printed it (comm).")
    uid: int | None = Field(default=None, ge=0, description="Its user id.")
    constraint: str = Field(
        default="", max_length=64, description="CONSTRAINT_MEMCG (a cgroup limit) or CONSTRAINT_NONE (the host ran out)."
    )
    cgroup: str = Field(default="", max_length=512, description="The victim's memory cgroup (task_memcg).")
    container_id: str = Field(default="", max_length=128, description="Container id from that cgroup; empty if none.")
    anon_rss_kib: int | None = Field(default=None, ge=0, description="Its anonymous resident memory when killed, KiB.")
    kernel_lines: tuple[LogLine, ...] = Field(
        default=(), max_length=16, description=f"The kernel's own lines about this kill (each cut at {MAX_LINE} characters)."
    )
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="The GPU it computed on in the sampler's last look "
                                  "(a job's process); None when it held none.")
    command: str = Field(default="", max_length=256, description="Its command line from that look (a GPU process's only).")


class ContainerExited(Event):
    """A container on the node exited (Docker engine `die` event)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.container.exited"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "3ea15277-ce76-4088-9b6b-4c5d6e7f8091",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:17:42Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "container_id": "3f9c2a7d4b1e8f6a0c5d2e9b7a4f1c8d3e6b9a2f5c8e1d4a7b0c3f6e9d2a5b8c",
                    "name": "selfplay-3",
                    "image": "registry.example/selfplay:2026.11",
                    "exit_code": 137,
                    "oom_killed": True,
                    "signal": "SIGKILL",
                    "finished_at": "2026-11-22T10:17:41Z",
                    "last_log_lines": ["game 18231 done in 41.2s", "game 18232 done in 40.9s"],
                }
            ]
        }
    )

    node_id: NodeId
    container_id: str = Field(min_length=1, max_length=128, description="The engine's container id.")
    name: str = Field(default="", max_length=256, description="Container name.")
    image: str = Field(default="", max_length=512, description="Image it ran.")
    exit_code: int = Field(description="Exit code: 137 SIGKILL (OOM killer or a kill), 139 SIGSEGV, 143 SIGTERM.")
    oom_killed: bool | None = Field(default=None, description="The engine's State.OOMKilled; None if unread.")
    signal: str | None = Field(
        default=None, max_length=16, description="The signal an exit code above 128 stands for, e.g. SIGKILL."
    )
    finished_at: AwareDatetime | None = Field(default=None, description="When it exited, per the engine.")
    last_log_lines: tuple[LogLine, ...] = Field(
        default=(), max_length=50, description=f"Its last log lines (each cut at {MAX_LINE} characters)."
    )
    engine_signal: str | None = Field(
        default=None,
        max_length=16,
        description="The signal the engine itself sent just before the exit (docker stop, kill or restart), e.g. "
        "SIGTERM: an exit somebody asked for. None when the engine sent none or it is unknown.",
    )
    logs_lost: str | None = Field(
        default=None,
        max_length=300,
        description="Why its last log lines are missing where they were asked for: the engine had removed the "
        "container (docker run --rm), or it cannot give the log (logging driver none, or a remote driver without "
        "its local cache). None: read, or not asked.",
    )


class ListenBacklogReported(Event):
    """Connections wait in the accept queue of the node's own peer daemon (runbook 002: "TCP
    connections succeed, HTTP requests time out, connection backlog grows (26-33 pending
    connections)": an event loop that accepts nothing). Sent while at least two wait, and once
    with `waiting` 0 when the queue drained; leader-health reads it beside its probes."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.listen_backlog"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "7c1d2e3f-4a5b-4c6d-8e7f-9a0b1c2d3e4f",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:17:45Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "port": 8770,
                    "waiting": 29,
                    "limit": 128,
                }
            ]
        }
    )

    node_id: NodeId
    port: int = Field(ge=1, le=65535, description="The listening port (the status endpoint's).")
    waiting: int = Field(ge=0, description="Connections the kernel completed that the daemon has not accepted yet (ss -ltn's Recv-Q).")
    limit: int = Field(ge=0, description="How many may wait before new ones are dropped (the listen backlog, ss -ltn's Send-Q).")
