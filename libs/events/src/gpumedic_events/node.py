"""What a node-sampler says about its node: one message per node per interval, all GPUs in it."""

from __future__ import annotations

from typing import ClassVar

from pydantic import BaseModel, ConfigDict, Field

from gpumedic_events.base import Event, NodeId

_EXAMPLE_PROCESS = {"pid": 41230, "start_ticks": 8812345, "command": "python train.py --epochs 90", "used_memory_mib": 20480}


class GpuProcess(BaseModel):
    """A process with a compute context on a GPU."""

    model_config = ConfigDict(frozen=True, extra="ignore", json_schema_extra={"examples": [_EXAMPLE_PROCESS]})

    pid: int = Field(ge=1, le=4_194_304, description="Process id on the node.")
    start_ticks: int | None = Field(
        default=None,
        ge=0,
        description="Start time in clock ticks since boot (/proc/PID/stat field 22). With the pid it "
        "identifies the process, so a recycled pid is never mistaken for it.",
    )
    command: str = Field(default="", max_length=4096, description="Command line, arguments joined by spaces.")
    used_memory_mib: int | None = Field(default=None, ge=0, description="GPU memory this process holds, MiB.")


class GpuSample(BaseModel):
    """One GPU as NVML reported it at sample time."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    index: int = Field(ge=0, le=63, description="NVML device index.")
    uuid: str = Field(default="", max_length=96, description="NVML device UUID.")
    name: str = Field(default="", max_length=96, description="Product name.")
    utilization_gpu_pct: int | None = Field(
        default=None, ge=0, le=100, description="Share of the last sample period a kernel ran; None if unread."
    )
    utilization_memory_pct: int | None = Field(default=None, ge=0, le=100, description="Memory controller busy share.")
    memory_used_mib: int | None = Field(default=None, ge=0, description="Device memory in use, MiB.")
    memory_total_mib: int | None = Field(default=None, ge=0, description="Device memory in all, MiB.")
    processes: tuple[GpuProcess, ...] = Field(default=(), max_length=256, description="Compute processes.")


class JobsObservation(BaseModel):
    """What the node's job probes said: how many jobs it runs and whether their output grows."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    running: int | None = Field(default=None, ge=0, description="Jobs the node reports running; None if unprobed.")
    output_growing: bool | None = Field(
        default=None, description="Whether watched outputs grew since the last sample; None if none are watched."
    )


class NodeSampled(Event):
    """One node's periodic sample: every GPU, its processes, and the job probes."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.node.sampled"
    subject_key: ClassVar[str | None] = "node_id"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "7d0f4a4e-4b8e-4a53-9f8a-2d0f3c1b6a11",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:00Z",
                    "source": "node-sampler",
                    "node_id": "gpu-node-07",
                    "interval_s": 5.0,
                    "gpus": [
                        {
                            "index": 0,
                            "uuid": "GPU-5f1c2a7e-0000-4000-8000-000000000007",
                            "name": "NVIDIA H100 80GB HBM3",
                            "utilization_gpu_pct": 0,
                            "utilization_memory_pct": 0,
                            "memory_used_mib": 20512,
                            "memory_total_mib": 81559,
                            "processes": [_EXAMPLE_PROCESS],
                        }
                    ],
                    "jobs": {"running": 1, "output_growing": False},
                    "errors": [],
                }
            ]
        }
    )

    node_id: NodeId
    interval_s: float = Field(gt=0, le=3600, description="The sampling interval the sampler runs at, seconds.")
    gpus: tuple[GpuSample, ...] = Field(default=(), max_length=64, description="Every GPU of the node.")
    jobs: JobsObservation = Field(default_factory=JobsObservation, description="Job probe results.")
    errors: tuple[str, ...] = Field(
        default=(),
        max_length=64,
        description="What could not be read this time (the sample still carries what was known).",
    )
