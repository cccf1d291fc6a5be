"""Finished trace spans carried over the bus, so the embedded stack keeps traces in its store
without a trace backend."""

from __future__ import annotations

from typing import ClassVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field

from gpumedic_events.base import Event, SubjectToken


class SpanRecord(BaseModel):
    """One finished span, flattened."""

    model_config = ConfigDict(frozen=True, extra="ignore")

    trace_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    span_id: str = Field(pattern=r"^[0-9a-f]{16}$")
    parent_span_id: str | None = Field(default=None, pattern=r"^[0-9a-f]{16}$")
    name: str = Field(max_length=256)
    service: str = Field(max_length=128)
    started_at: AwareDatetime
    ended_at: AwareDatetime
    status: str = Field(max_length=16, description="UNSET, OK or ERROR.")
    attributes: dict[str, str | int | float | bool] = Field(default_factory=dict)

    @property
    def duration_ms(self) -> float:
        return (self.ended_at - self.started_at).total_seconds() * 1000


class SpansExported(Event):
    """A batch of spans a service finished (embedded mode; OTLP exporters are unaffected)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.telemetry.spans"
    subject_key: ClassVar[str | None] = "service"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "9c0d1e2f-3a4b-4c5d-8e6f-7a8b9c0d1e11",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:15:06Z",
                    "source": "remediator",
                    "service": "remediator",
                    "spans": [
                        {
                            "trace_id": "4bf92f3577b34da6a3ce929d0e0e4736",
                            "span_id": "00f067aa0ba902b7",
                            "parent_span_id": "a3ce929d0e0e4736",
                            "name": "act",
                            "service": "remediator",
                            "started_at": "2026-11-22T10:15:05.100Z",
                            "ended_at": "2026-11-22T10:15:05.900Z",
                            "status": "OK",
                            "attributes": {"gpumedic.incident_id": "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11"},
                        }
                    ],
                }
            ]
        }
    )

    service: SubjectToken = Field(description="Who sent them, and so the subject: a control-plane service, or a node's "
                                  "sampler as node-<node id> (each node publishes its spans on its own subject only).")
    spans: tuple[SpanRecord, ...] = Field(max_length=512)


