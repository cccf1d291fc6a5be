"""The v1 compatibility checker: each kind of breaking change is named, the additive ones are not.

Each case builds a changed copy of a real event model, the way a developer would change it, and
compares its schema with the real one's.
"""

from __future__ import annotations

import uuid
from enum import StrEnum
from typing import Any, Literal

import pytest
from pydantic import BaseModel, ConfigDict, Field, create_model

from gpumedic.proto import breaking_changes, catalogue_breaking_changes, current_schemas
from gpumedic_events import (
    IncidentKind,
    EVENT_TYPES,
    ActionCompleted,
    ActionRequested,
    CapacityEvaluated,
    ClusterChecked,
    GpuProcess,
    GpuSample,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    KillGpuProcesses,
    NodeSampled,
)


def _changed(model: type[BaseModel], *, drop: tuple[str, ...] = (), **fields: Any) -> type[BaseModel]:
    """A copy of `model` (same name, fields, constraints) without `drop` and with `fields` set."""
    definitions: dict[str, Any] = {
        name: (info.annotation, info) for name, info in model.model_fields.items() if name not in drop
    }
    definitions.update(fields)
    return create_model(
        model.__name__,
        __config__=ConfigDict(frozen=True, extra="ignore"),
        __doc__=model.__doc__,
        **definitions,
    )


def _schema(model: type[BaseModel]) -> dict[str, Any]:
    schema = model.model_json_schema(mode="validation")
    schema.pop("examples", None)
    return schema


def _breaks(before: type[BaseModel], after: type[BaseModel]) -> list[str]:
    return breaking_changes(_schema(before), _schema(after), event=before.__name__)


@pytest.mark.parametrize("event", EVENT_TYPES, ids=lambda e: e.__name__)
def test_an_unchanged_copy_has_no_breaking_change(event: type[BaseModel]) -> None:
    assert _schema(_changed(event)) == _schema(event), "the copy helper must be faithful"
    assert _breaks(event, _changed(event)) == []


def test_current_models_pass_against_themselves() -> None:
    schemas = current_schemas()
    assert catalogue_breaking_changes(schemas, schemas) == []


# --- breaking ---------------------------------------------------------------------------------


def test_removed_property() -> None:
    after = _changed(IncidentOpened, drop=("fingerprint",))
    assert _breaks(IncidentOpened, after) == ["IncidentOpened: $.fingerprint: property removed"]


def test_removed_property_deep_in_arrays_and_defs() -> None:
    process = _changed(GpuProcess, drop=("command",))
    gpu = _changed(GpuSample, processes=(tuple[process, ...], GpuSample.model_fields["processes"]))
    after = _changed(NodeSampled, gpus=(tuple[gpu, ...], NodeSampled.model_fields["gpus"]))
    assert _breaks(NodeSampled, after) == ["NodeSampled: $.gpus[].processes[].command: property removed"]


def test_renamed_property_is_reported_as_removed() -> None:
    after = _changed(IncidentEscalated, drop=("reason",), why=(str, Field(max_length=1000)))
    problems = _breaks(IncidentEscalated, after)
    assert "IncidentEscalated: $.reason: property removed" in problems
    assert "IncidentEscalated: $.why: new required property" in problems


def test_new_required_property() -> None:
    after = _changed(ClusterChecked, region=(str, Field(description="Where the cluster runs.")))
    assert _breaks(ClusterChecked, after) == ["ClusterChecked: $.region: new required property"]


def test_property_became_required() -> None:
    after = _changed(IncidentOpened, evidence=(dict[str, str | int | float | bool | None], Field()))
    assert _breaks(IncidentOpened, after) == ["IncidentOpened: $.evidence: property became required"]


def test_nested_property_became_required() -> None:
    jobs = _changed(NodeSampled.model_fields["jobs"].annotation, running=(int, Field(ge=0)))
    after = _changed(NodeSampled, jobs=(jobs, Field(default_factory=jobs)))
    assert _breaks(NodeSampled, after) == [
        "NodeSampled: $.jobs.running: type changed from integer | null to integer",
        "NodeSampled: $.jobs.running: property became required",
    ]


def test_changed_type() -> None:
    after = _changed(CapacityEvaluated, nodes_seen=(str, Field()))
    assert _breaks(CapacityEvaluated, after) == [
        "CapacityEvaluated: $.nodes_seen: type changed from integer to string"
    ]


def test_union_losing_a_member() -> None:
    after = _changed(IncidentOpened, gpu_index=(int, Field(default=0, ge=0, le=63)))
    assert _breaks(IncidentOpened, after) == [
        "IncidentOpened: $.gpu_index: type changed from integer | null to integer"
    ]


def test_union_gaining_a_member_breaks_typed_consumers() -> None:
    after = _changed(ClusterChecked, peers_total=(int | None, Field(default=None, ge=0)))
    assert _breaks(ClusterChecked, after) == [
        "ClusterChecked: $.peers_total: type changed from integer to integer | null"
    ]


def test_removed_enum_value() -> None:
    class Outcome(StrEnum):
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        BLOCKED = "blocked"
        OBSERVED = "observed"

    after = _changed(ActionCompleted, outcome=(Outcome, Field()))
    assert _breaks(ActionCompleted, after) == ['ActionCompleted: $.outcome: enum value "interrupted" removed']


def test_removed_literal_value() -> None:
    after = _changed(CapacityEvaluated, decision=(Literal["hold", "scale_up"], Field()))
    assert _breaks(CapacityEvaluated, after) == ['CapacityEvaluated: $.decision: enum value "scale_down" removed']


def test_changed_const_is_a_removed_value() -> None:
    after = _changed(IncidentResolved, schema_version=(Literal[2], Field(default=2)))
    assert _breaks(IncidentResolved, after) == ["IncidentResolved: $.schema_version: enum value 1 removed"]


def test_removed_union_member_object() -> None:
    kill_only = _changed(ActionRequested, operation=(KillGpuProcesses, Field()))
    assert _breaks(ActionRequested, kill_only) == [
        f"ActionRequested: $.operation: union member {name} removed"
        for name in ("RestartUnit", "GpuReset", "DockerPrune", "RebootNode", "HttpAdmin", "RestartJob", "DrainNode", "UndrainNode", "SpawnWorker", "TerminateWorker", "RestartWorker", "RequeueTasks", "MarkWorkerEnded", "AcceptWorker", "StopJob", "KillPattern")
    ]
    assert _breaks(kill_only, ActionRequested) == [], "a new operation in the catalogue is additive"


def test_tightened_constraint() -> None:
    after = _changed(IncidentResolved, summary=(str, Field(max_length=100)))
    assert _breaks(IncidentResolved, after) == [
        "IncidentResolved: $.summary: constraint tightened: maxLength 1000 -> 100"
    ]


def test_changed_subject() -> None:
    before = {"x-subject": "gpumedic.v1.node.sampled.{node_id}", "type": "object"}
    after = {"x-subject": "gpumedic.v1.node.sample.{node_id}", "type": "object"}
    assert breaking_changes(before, after, event="NodeSampled") == [
        "NodeSampled: $: subject changed from gpumedic.v1.node.sampled.{node_id} to gpumedic.v1.node.sample.{node_id}"
    ]


def test_event_gone_from_the_catalogue() -> None:
    schemas = current_schemas()
    current = {name: s for name, s in schemas.items() if name != "ClusterChecked"}
    assert catalogue_breaking_changes(schemas, current) == [
        "ClusterChecked: event removed from the catalogue (it is in the v1 baseline)"
    ]


# --- not breaking -----------------------------------------------------------------------------


def test_new_optional_property() -> None:
    after = _changed(ClusterChecked, region=(str | None, Field(default=None, description="Where it runs.")))
    assert _breaks(ClusterChecked, after) == []


def test_new_enum_value() -> None:
    members = {k.name: k.value for k in IncidentKind} | {"QUEUE_STALLED": "queue_stalled"}
    Kind = StrEnum("Kind", members)
    Kind.__doc__ = IncidentKind.__doc__
    after = _changed(IncidentOpened, kind=(Kind, IncidentOpened.model_fields["kind"]))
    assert _breaks(IncidentOpened, after) == []


def test_new_literal_value() -> None:
    after = _changed(CapacityEvaluated, decision=(Literal["hold", "scale_up", "scale_down", "replace"], Field()))
    assert _breaks(CapacityEvaluated, after) == []


def test_description_change() -> None:
    after = _changed(IncidentEscalated, reason=(str, Field(max_length=1000, description="Something else.")))
    after.__doc__ = "A new class description."
    assert _breaks(IncidentEscalated, after) == []


def test_loosened_constraints() -> None:
    after = _changed(
        ClusterChecked,
        peers_total=(int, Field()),
        summary=(str, Field(max_length=5000)),
        leader=(str | None, Field(default=None)),
    )
    assert _breaks(ClusterChecked, after) == []


def test_required_property_becoming_optional() -> None:
    after = _changed(IncidentOpened, summary=(str, Field(default="", max_length=1000)))
    assert _breaks(IncidentOpened, after) == []


def test_recursive_models_terminate() -> None:
    class Node(BaseModel):
        name: str
        children: list[Node] = []
        id: uuid.UUID | None = None

    Node.model_rebuild()
    assert breaking_changes(_schema(Node), _schema(Node), event="Tree") == []
