"""The dead-letter record: a message a service could not process, kept with the reason."""

from __future__ import annotations

from typing import ClassVar

from pydantic import ConfigDict, Field

from gpumedic_events.base import Event, SubjectToken

MAX_KEPT_PAYLOAD = 64 * 1024


class MessageRejected(Event):
    """A consumer refused a message (invalid, oversize, or failing past its redeliveries)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.message.rejected"
    subject_key: ClassVar[str | None] = "service"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "8b9c0d1e-2f3a-4b4c-9d5e-6f7a8b9c0d10",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T10:02:00Z",
                    "source": "zombie-detector",
                    "service": "zombie-detector",
                    "original_subject": "gpumedic.v1.node.sampled.gpu-node-07",
                    "reason": "gpus.0.utilization_gpu_pct: Input should be less than or equal to 100",
                    "deliveries": 1,
                    "payload_bytes": 412,
                    "payload_sha256": "9f2c4a1d8e7b6a5f4e3d2c1b0a9f8e7d6c5b4a3f2e1d0c9b8a7f6e5d4c3b2a10",
                    "payload": "{\"node_id\": \"gpu-node-07\", \"...\": \"...\"}",
                    "payload_truncated": False,
                    "stream": "GPUMEDIC_SAMPLES",
                    "stream_sequence": 81223,
                }
            ]
        }
    )

    service: SubjectToken = Field(description="The service that rejected the message.")
    original_subject: str = Field(max_length=512)
    reason: str = Field(max_length=2000, description="What was wrong and where.")
    deliveries: int = Field(ge=1, description="How often the message had been delivered.")
    payload_bytes: int = Field(ge=0)
    payload_sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    payload: str = Field(
        max_length=MAX_KEPT_PAYLOAD,
        description="The payload as text (undecodable bytes replaced), cut at 64 KiB.",
    )
    payload_truncated: bool
    stream: str | None = Field(
        default=None, max_length=32, pattern=r"^[A-Za-z0-9_-]+$",
        description="The stream that stores the refused message (None: it came over core NATS, no stream keeps it).",
    )
    stream_sequence: int | None = Field(
        default=None, ge=1, description="Its sequence in that stream: where `gpumedic dead-letters replay` finds the "
        "original, and checks it against this record, before it delivers it again.",
    )
