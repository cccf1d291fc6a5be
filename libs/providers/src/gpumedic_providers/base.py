"""What every provider offers: create a worker, terminate or restart it, list the workers with their status,
GPU type, $/h and SSH details. A provider that errors, times out or answers nonsense raises
`ProviderError` naming the provider and what was wrong, and never with the API key in it."""

from __future__ import annotations

from datetime import datetime
from typing import Literal, Protocol

from pydantic import BaseModel, ConfigDict, Field

WorkerStatus = Literal["spawning", "running", "stopped", "terminated", "error"]


class ProviderError(Exception):
    """A provider call that did not give a trustworthy answer; the message says which and why."""


class SshDetails(BaseModel):
    model_config = ConfigDict(frozen=True)

    host: str = Field(min_length=1, max_length=253)
    port: int = Field(ge=1, le=65535)


class Worker(BaseModel):
    """One rented machine as its provider reports it."""

    model_config = ConfigDict(frozen=True)

    worker_id: str = Field(min_length=1, max_length=128)
    name: str = Field(default="", max_length=253)
    status: WorkerStatus
    gpu_type: str = Field(max_length=128)
    gpus: int = Field(ge=0, le=64)
    price_per_h: float = Field(ge=0, description="What the worker costs an hour, all its GPUs together.")
    ssh: SshDetails | None = Field(default=None, description="None until the provider gives them (and for some spawns, never).")
    created_at: datetime | None = None
    started_at: datetime | None = Field(default=None, description="When it last started (a restart moves it on).")
    image: str | None = Field(default=None, max_length=512, description="The container image it runs, as the provider says (RunPod's `image`).")
    host_id: str | None = Field(
        default=None, max_length=128,
        description="The provider's id of the machine it runs on (RunPod's machineId): a machine is known again when a new worker lands on it.",
    )


class Provider(Protocol):
    name: str

    async def create(self, name: str, gpu_type: str, gpus: int) -> Worker: ...

    async def terminate(self, worker_id: str) -> None: ...

    async def restart(self, worker_id: str) -> None: ...

    async def workers(self) -> list[Worker]: ...

    async def close(self) -> None: ...
