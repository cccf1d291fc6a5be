"""gpumedic's NATS JetStream bus: streams, connection settings, publishing and consuming events."""

from gpumedic_bus.consume import (
    Delivery,
    EventConsumer,
    PushConsumer,
    RejectionStats,
    rejection,
    subscribe_events,
)
from gpumedic_bus.publish import publish_event
from gpumedic_bus.runtime import ServiceRuntime, connect_options
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.streams import STREAMS, ensure_streams, stream_of
from gpumedic_bus.tracing import inject_trace, trace_context

__all__ = [
    "STREAMS",
    "Delivery",
    "EventConsumer",
    "NatsSettings",
    "PushConsumer",
    "RejectionStats",
    "ServiceRuntime",
    "connect_options",
    "ensure_streams",
    "inject_trace",
    "publish_event",
    "rejection",
    "stream_of",
    "subscribe_events",
    "trace_context",
]
