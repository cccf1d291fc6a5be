"""Trace context on NATS headers, and a span processor that carries finished spans over the bus.

Incident handlers start spans named for the business step (detect, decide, act, verify,
record) with the context taken from the message headers; samples are never traced one by one.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Awaitable, Callable, Mapping
from itertools import islice
from datetime import UTC, datetime

from opentelemetry import propagate
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor

from gpumedic_events import SpanRecord, SpansExported

log = logging.getLogger(__name__)


def inject_trace(headers: dict[str, str]) -> dict[str, str]:
    """Add the current span's W3C trace context (traceparent) to outgoing headers."""
    propagate.inject(headers)
    return headers


def trace_context(headers: Mapping[str, str] | None) -> Context:
    """The context a message's headers carry (an empty one if none)."""
    return propagate.extract(dict(headers or {}))


def traceparent_of(headers: Mapping[str, str] | None) -> str | None:
    return (headers or {}).get("traceparent")


class BusSpanRecorder(SpanProcessor):
    """Buffers finished spans; `run` publishes them as SpansExported every half second."""

    def __init__(self, service: str, max_buffer: int = 10_000, batch: int = 256, *, publish_as: str | None = None) -> None:
        self._service = service
        self._publish_as = publish_as or service
        self._buffer: deque[SpanRecord] = deque(maxlen=max_buffer)
        self._batch = batch

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        if ctx is None or span.start_time is None or span.end_time is None:
            return
        self._buffer.append(
            SpanRecord(
                trace_id=format(ctx.trace_id, "032x"),
                span_id=format(ctx.span_id, "016x"),
                parent_span_id=format(span.parent.span_id, "016x") if span.parent else None,
                name=span.name[:256],
                service=self._service,
                started_at=datetime.fromtimestamp(span.start_time / 1e9, UTC),
                ended_at=datetime.fromtimestamp(span.end_time / 1e9, UTC),
                status=span.status.status_code.name,
                attributes={k: v for k, v in (span.attributes or {}).items() if isinstance(v, str | int | float | bool)},
            )
        )

    async def flush(self, publish: Callable[[SpansExported], Awaitable[None]]) -> None:
        while self._buffer:
            spans = tuple(islice(self._buffer, self._batch))
            await publish(SpansExported(source=self._service, service=self._publish_as, spans=spans))
            for _ in spans:  # dropped only once published, so a failed publish keeps them
                self._buffer.popleft()

    async def run(self, publish: Callable[[SpansExported], Awaitable[None]], every_s: float = 0.5) -> None:
        while True:
            await asyncio.sleep(every_s)
            try:
                await self.flush(publish)
            except Exception:  # the bus may be reconnecting; spans stay buffered (bounded)
                log.warning("could not publish spans yet; will retry", exc_info=True)
