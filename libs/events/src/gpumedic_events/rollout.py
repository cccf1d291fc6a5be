"""Fleet operations: an operator asks the remediator to act on many nodes, batch by batch, through
its gate (runbook 002's restart of the daemon across the fleet; a rolling restart; draining a
group before maintenance; runbook 001's "terminate all workers" when workers are stuck).

A request and its reply over core NATS (request-reply on `ROLLOUT_SUBJECT`): the operator waits
for the answer. The remediator runs one batch at a time, each node's action verified before the
next batch starts, and stops after the first batch in which a node's action did not succeed, or
before a batch that would take the breaker past its limit. Each action is in the audit log under
the rollout's id.
"""

from __future__ import annotations

import uuid
from typing import ClassVar, Literal

from pydantic import Field, field_validator, model_validator

from gpumedic_events.action import UNIT_PATTERN, WorkerId
from gpumedic_events.base import MAX_EVENT_BYTES, NodeId, SubjectToken
from gpumedic_events.preflight import _Message

ROLLOUT_SUBJECT = "gpumedic.v1.rollout.run"
ROLLOUT_OPERATIONS = ("restart_unit", "drain_node", "undrain_node", "terminate_worker")
MAX_ROLLOUT_NODES = 10_000
FINE = ("succeeded", "planned", "silenced")
"""A step's statuses that are no failure: done, to be done, or left alone on purpose (a person's maintenance window)."""


class RolloutRequest(_Message):
    """Run `operation` on every node the selectors name (`gpu-node-07`, `group:NAME`, `label:KEY=VALUE`),
    or, for terminate_worker, on the provider's workers `workers` names (`all`: every live one),
    `batch` at a time; with `dry_run`, only say what would run."""

    SUBJECT: ClassVar[str] = ROLLOUT_SUBJECT

    operation: Literal["restart_unit", "drain_node", "undrain_node", "terminate_worker"]
    unit: str | None = Field(default=None, pattern=UNIT_PATTERN, description="The unit restart_unit restarts (on the policy's allow-list).")
    nodes: tuple[str, ...] = Field(default=(), max_length=64, description="Node selectors: a node, group:NAME or label:KEY=VALUE.")
    workers: tuple[WorkerId | Literal["all"], ...] = Field(
        default=(), max_length=1000, description="terminate_worker: the provider's worker ids, or all (every live worker)."
    )
    batch: int = Field(default=1, ge=1, le=1000, description="Nodes acted on at once; the next batch starts once all of them are verified.")
    dry_run: bool = False
    requested_by: SubjectToken = "operator"

    @field_validator("nodes")
    @classmethod
    def _selectors(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        # their grammar is the policy's NodeSelector, which the remediator applies; here only their shape
        for text in value:
            if not text or len(text) > 200 or any(c.isspace() for c in text):
                raise ValueError(f"{text[:100]!r} is not a node selector (NODE, group:NAME or label:KEY=VALUE)")
        return value

    @model_validator(mode="after")
    def _its_targets(self) -> RolloutRequest:
        if (self.operation == "restart_unit") != (self.unit is not None):
            raise ValueError("restart_unit needs unit, and only restart_unit takes one")
        if self.operation == "terminate_worker":
            if not self.workers or self.nodes:
                raise ValueError("terminate_worker names workers (their ids, or all), not nodes")
        elif not self.nodes or self.workers:
            raise ValueError(f"{self.operation} names nodes (NODE, group:NAME or label:KEY=VALUE), not workers")
        return self


class RolloutStep(_Message):
    """One node's action in the rollout, as the gate decided it and the node answered."""

    SUBJECT: ClassVar[str] = ROLLOUT_SUBJECT

    batch: int = Field(ge=1)
    node_id: NodeId
    status: str = Field(max_length=32, description="succeeded, failed, blocked, observed, interrupted; planned in a dry run; "
                        "silenced: a person's silence of the whole node holds it out, and it was left alone.")
    detail: str = Field(default="", max_length=2000)
    action_id: uuid.UUID | None = None


class RolloutReport(_Message):
    SUBJECT: ClassVar[str] = ROLLOUT_SUBJECT

    rollout_id: uuid.UUID
    operation: str = Field(max_length=32)
    dry_run: bool = False
    batches: tuple[tuple[NodeId, ...], ...] = Field(default=(), max_length=MAX_ROLLOUT_NODES, description="The plan, batch by batch.")
    steps: tuple[RolloutStep, ...] = Field(default=(), max_length=MAX_ROLLOUT_NODES)
    stopped: str = Field(default="", max_length=2000, description="Why it stopped before the last batch ('' when it did not).")
    left_out: int = Field(default=0, ge=0, description="Steps that succeeded (or were planned) left out to keep the reply "
                          "within a message's size; `gpumedic actions` lists every action.")
    error: str = Field(default="", max_length=2000, description="Why nothing ran (no node selected, a unit off the allow-list).")
    took_ms: float = 0.0

    def fitted(self, budget: int = MAX_EVENT_BYTES - 8 * 1024) -> RolloutReport:
        """This report within `budget` bytes of JSON: first each step's detail is cut short, then
        steps that succeeded (or were planned) are left out, the last first; those that did not stay."""
        report = self
        if len(report.to_json()) > budget:
            report = report.model_copy(update={"steps": tuple(s.model_copy(update={"detail": s.detail[:120]}) for s in report.steps)})
        while len(report.to_json()) > budget:
            fine = [i for i, s in enumerate(report.steps) if s.status in FINE]
            if not fine:
                break
            drop = set(fine[-max(1, len(fine) // 4):])
            report = report.model_copy(update={"steps": tuple(s for i, s in enumerate(report.steps) if i not in drop),
                                               "left_out": report.left_out + len(drop)})
        return report

    @property
    def ok(self) -> bool:
        return not self.error and not self.stopped and all(s.status in FINE for s in self.steps)

    def summary(self) -> str:
        nodes = sum(len(b) for b in self.batches)
        head = f"rollout {self.rollout_id}: {self.operation} on {nodes} node(s) in {len(self.batches)} batch(es)"
        if self.error:
            return f"{head}: nothing ran: {self.error}"
        lines = [head + (" (dry run: nothing ran)" if self.dry_run else "")]
        for step in self.steps:
            action = f" [action {step.action_id}]" if step.action_id else ""
            lines.append(f"  batch {step.batch}  {step.node_id}  {step.status}: {step.detail}{action}")
        if self.left_out:
            lines.append(f"  ... and {self.left_out} more that succeeded (gpumedic actions lists them)")
        if self.stopped:
            lines.append(f"stopped: {self.stopped}")
        elif not self.dry_run:
            lines.append("done: every batch ran" + ("" if self.ok else ", not every node's action succeeded"))
        return "\n".join(lines)
