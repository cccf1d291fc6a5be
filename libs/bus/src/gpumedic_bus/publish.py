"""Publishing typed events: to their stream, with a de-duplication id and the trace context."""

from __future__ import annotations

from faststream.nats import NatsBroker

from gpumedic_bus.outage import ride_out
from gpumedic_bus.streams import stream_of
from gpumedic_bus.tracing import inject_trace
from gpumedic_events import Event

PUBLISH_TIMEOUT_S = 5.0


async def publish_event(broker: NatsBroker, event: Event, *, msg_id: str | None = None, patience_s: float = 0.0) -> None:
    """Publish and wait for the stream's acknowledgement.

    `msg_id` becomes the Nats-Msg-Id (else the event id): an event derived from a record passes
    one derived from it, so a retried publish inside the stream's duplicate window is stored once. Raises if the stream
    does not acknowledge, so a handler fails and its input is redelivered rather than lost.
    With `patience_s`, a stream that does not answer (a server restarting, a leader election) is
    asked again for up to that long first: the same Nats-Msg-Id, so stored once.
    """
    headers = inject_trace({"Nats-Msg-Id": msg_id or str(event.event_id)})
    body, stream = event.to_json(), stream_of(type(event)).name
    await ride_out(lambda: broker.publish(body, event.subject, headers=headers, stream=stream, timeout=PUBLISH_TIMEOUT_S),
                   patience_s)
