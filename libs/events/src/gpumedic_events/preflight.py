"""Pre-flight: a job launcher asks, right before it starts a job, whether a node's GPUs are ready.

A request and its reply over core NATS (request-reply on `PREFLIGHT_SUBJECT`), not stored
facts: a launcher waits for the answer, and an old answer is worth nothing. The remediator
answers, since it alone may log in to nodes; with `clean` it removes leftovers through its gate.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar, Self

from pydantic import BaseModel, ConfigDict, Field, Strict, ValidationError, field_validator

from gpumedic_events.base import MAX_EVENT_BYTES, EventDecodeError, NodeId, SubjectToken, describe

PREFLIGHT_SUBJECT = "gpumedic.v1.preflight.check"
MAX_GPUS = 64


class _Message(BaseModel):
    """A request or reply over core NATS request-reply, on `SUBJECT`."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    SUBJECT: ClassVar[str] = PREFLIGHT_SUBJECT

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes | str) -> Self:
        """Parse one message; EventDecodeError says what was wrong and where."""
        if len(data) > MAX_EVENT_BYTES:
            raise EventDecodeError(cls.SUBJECT, f"payload of {len(data)} bytes exceeds {MAX_EVENT_BYTES}")
        try:
            return cls.model_validate_json(data)
        except ValidationError as exc:
            raise EventDecodeError(cls.SUBJECT, describe(exc)) from None


class PreflightRequest(_Message):
    """Are these GPUs of this node free and healthy for a new job? With `clean`, make them so if only
    leftovers on idle GPUs are in the way."""

    node_id: NodeId
    gpus: tuple[Annotated[int, Strict()], ...] | None = Field(
        default=None, max_length=MAX_GPUS, description="GPU indexes to check; None: every GPU of the node."
    )
    clean: bool = Field(default=False, description="Kill leftover processes on idle GPUs, through the remediator's gate.")
    reset: bool = Field(
        default=False, description="Reset (nvidia-smi --gpu-reset), through the remediator's gate, a GPU that nothing uses or "
        "holds (after a clean, when asked too) but that still has memory in use: the driver state a container restart can leave "
        "(runbook 003). The reset checks again on the node that nothing uses it.",
    )
    deep: bool = Field(
        default=False, description="Also run DCGM's diagnostics (dcgmi diag) once the GPUs are free: a minute or more, the GPUs loaded."
    )
    requested_by: SubjectToken = Field(default="launcher", description="Who asks (kept in the audit log with a clean).")

    @field_validator("gpus")
    @classmethod
    def _indexes(cls, value: tuple[int, ...] | None) -> tuple[int, ...] | None:
        if value is None:
            return None
        if not value:
            raise ValueError("name at least one GPU, or none at all for every GPU")
        for index in value:
            if not 0 <= index < MAX_GPUS:
                raise ValueError(f"GPU index {index!r} is not in 0..{MAX_GPUS - 1}")
        return tuple(sorted(set(value)))


class GpuReadiness(_Message):
    """One GPU as pre-flight found it."""

    index: int = Field(ge=0, lt=MAX_GPUS)
    ready: bool
    problems: tuple[str, ...] = Field(default=(), description="Why it is not ready, one line each.")
    utilization_pct: int | None = None
    memory_used_mib: int | None = None
    compute_mode: str | None = None
    compute_pids: tuple[int, ...] = ()
    holder_pids: tuple[int, ...] = Field(default=(), description="Processes holding /dev/nvidiaN open (fuser), daemons excluded.")


class PreflightReport(_Message):
    """The answer: ready or not, per GPU and why, and what a clean did."""

    check_id: uuid.UUID = Field(description="This check; a clean's actions are recorded under it (`gpumedic actions`).")
    node_id: NodeId
    ready: bool
    gpus: tuple[GpuReadiness, ...] = ()
    host_problems: tuple[str, ...] = Field(
        default=(), description="Why the node itself is not ready for a job (disk or memory headroom), one line each."
    )
    cleaned: tuple[str, ...] = Field(default=(), description="What the clean did or why it did not, one line per GPU.")
    reset: tuple[str, ...] = Field(default=(), description="What the reset did or why it did not, one line per GPU not ready.")
    resettable: tuple[int, ...] = Field(
        default=(), description="GPUs not ready that nothing uses or holds, with memory in use: a reset may clear them (ask "
        "again with reset).",
    )
    diagnostics: str = Field(default="", max_length=2000, description="With `deep`: what DCGM's diagnostics said, or why they did not run.")
    error: str = Field(default="", max_length=2000, description="Why the check could not be made (then not ready).")
    took_ms: float = 0.0

    def summary(self) -> str:
        """Lines a person reads: the verdict, then each GPU, then what a clean did."""
        if self.error:
            return f"{self.node_id}: {'could not check' if not self.gpus else 'NOT READY'}: {self.error}"
        lines = [f"{self.node_id}: {'ready' if self.ready else 'NOT READY'} ({self.took_ms:.0f} ms, check {self.check_id})"]
        for gpu in self.gpus:
            state = "ready" if gpu.ready else "not ready: " + "; ".join(gpu.problems)
            lines.append(f"  GPU {gpu.index}: {state}")
        lines.extend(f"  host: not ready: {problem}" for problem in self.host_problems)
        lines.extend(f"  clean: {line}" for line in self.cleaned)
        lines.extend(f"  reset: {line}" for line in self.reset)
        if self.resettable:
            gpus = ", ".join(map(str, self.resettable))
            lines.append(f"  offer: nothing uses or holds GPU {gpus}, yet memory is in use: a reset through the gate may clear it "
                         f"(gpumedic preflight --node {self.node_id} --gpus {gpus.replace(' ', '')} --reset)")
        if self.diagnostics:
            lines.append(f"  diagnostics: {self.diagnostics}")
        return "\n".join(lines)
