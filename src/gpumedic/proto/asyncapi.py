"""proto/asyncapi.yaml: the bus as an AsyncAPI 3 document (channels, operations, who sends and
receives each event), for tools that read AsyncAPI."""

from __future__ import annotations

from typing import Any

from gpumedic.proto.documents import CONSUMERS, NATS_URL, golden_example, producers_of, subject_pattern, summary_of
from gpumedic_bus.streams import stream_of
from gpumedic_events import EVENT_TYPES


def asyncapi_document() -> dict[str, Any]:
    """An AsyncAPI 3.0.0 document: one channel per event, who sends and who receives it."""
    channels: dict[str, Any] = {}
    operations: dict[str, Any] = {}
    messages: dict[str, Any] = {}
    for event in EVENT_TYPES:
        name = event.__name__
        stream = stream_of(event)
        channel: dict[str, Any] = {
            "address": subject_pattern(event),
            "title": name,
            "description": f"{summary_of(event)} Subscribe with `{event.subject_filter()}`.",
            "messages": {name: {"$ref": f"#/components/messages/{name}"}},
            "x-subject-filter": event.subject_filter(),
            "x-stream": stream.name,
        }
        if event.subject_key is not None:
            field_info = event.model_fields[event.subject_key]
            channel["parameters"] = {
                event.subject_key: {
                    "description": field_info.description or f"The event's `{event.subject_key}`.",
                    "location": f"$message.payload#/{event.subject_key}",
                }
            }
        channels[name] = channel
        messages[name] = {
            "name": name,
            "title": name,
            "summary": summary_of(event),
            "contentType": "application/json",
            "headers": {"$ref": "#/components/schemas/NatsHeaders"},
            "payload": {"$ref": f"./schemas/{name}.json"},
            "examples": [
                {"name": "golden", "summary": f"proto/examples/{name}.json", "payload": golden_example(event)}
            ],
        }
        for service in producers_of(event):
            operations[f"{service}.send.{name}"] = _operation("send", service, name)
    for service, events in CONSUMERS.items():
        for event in events:
            operations[f"{service}.receive.{event.__name__}"] = _operation("receive", service, event.__name__)
    return {
        "asyncapi": "3.0.0",
        "info": {
            "title": "gpumedic events",
            "version": "1.0.0",
            "description": "The events gpumedic's services exchange over NATS JetStream. "
            "Generated from the event models by `make proto`; do not edit.",
        },
        "defaultContentType": "application/json",
        "servers": {
            "local": {
                "host": NATS_URL.removeprefix("nats://"),
                "protocol": "nats",
                "description": f"The embedded stack's nats-server ({NATS_URL}), JetStream enabled.",
            }
        },
        "channels": channels,
        "operations": operations,
        "components": {"messages": messages, "schemas": {"NatsHeaders": _nats_headers()}},
    }


def _operation(action: str, service: str, event: str) -> dict[str, Any]:
    verb = "publishes" if action == "send" else "consumes"
    return {
        "action": action,
        "channel": {"$ref": f"#/channels/{event}"},
        "messages": [{"$ref": f"#/channels/{event}/messages/{event}"}],
        "title": f"{service} {verb} {event}",
        "tags": [{"name": service}],
    }


def _nats_headers() -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "Nats-Msg-Id": {
                "type": "string",
                "description": "JetStream de-duplication id: the action id for action requests, "
                "'<action id>:completed' for action results, otherwise the event id.",
            },
            "traceparent": {"type": "string", "description": "W3C trace context of the publishing span, if any."},
            "tracestate": {"type": "string", "description": "W3C trace state, if any."},
        },
    }
