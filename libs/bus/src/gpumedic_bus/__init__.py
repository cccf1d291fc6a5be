"""gpumedic's NATS JetStream bus: streams, topology and permissions, provisioning, publishing and consuming events."""

from gpumedic_bus import compat

compat.install()  # before any consumer fetches: see compat's docstring

from gpumedic_bus.connect import connect, connect_options  # noqa: E402 - after the fix above
from gpumedic_bus.consume import (
    Delivery,
    EventConsumer,
    PacedConsumer,
    rejection,
)
from gpumedic_bus.provision import provision
from gpumedic_bus.publish import publish_event
from gpumedic_bus.runtime import BusNotProvisioned, ServiceRuntime
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.streams import STREAMS, stream_of
from gpumedic_bus.tracing import inject_trace, trace_context

__all__ = [
    "STREAMS",
    "BusNotProvisioned",
    "Delivery",
    "EventConsumer",
    "NatsSettings",
    "PacedConsumer",
    "ServiceRuntime",
    "connect",
    "connect_options",
    "inject_trace",
    "provision",
    "publish_event",
    "rejection",
    "stream_of",
    "trace_context",
]
