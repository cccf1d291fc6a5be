"""One function returns a tracer provider configured from the standard OTEL_* variables.

OTEL_TRACES_EXPORTER picks exporters (`otlp`, `console`, `none`; comma-separated). When it is
unset, OTLP over HTTP is used only if OTEL_EXPORTER_OTLP_ENDPOINT (or the traces variant) is set,
so a machine without a collector does not log export errors. OTEL_SERVICE_NAME and
OTEL_RESOURCE_ATTRIBUTES are honoured through `Resource.create`. Callers may add processors
(the embedded mode adds one that carries spans over the bus to the store).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable

from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter

log = logging.getLogger(__name__)

INCIDENT_ID = "gpumedic.incident_id"
NODE_ID = "gpumedic.node_id"
ACTION_ID = "gpumedic.action_id"
"""Span attribute names shared by every service, so a trace UI can search by them."""


def create_tracer_provider(
    service_name: str,
    *,
    processors: Iterable[SpanProcessor] = (),
    environ: dict[str, str] | None = None,
) -> TracerProvider:
    env = os.environ if environ is None else environ
    resource = Resource.create({SERVICE_NAME: env.get("OTEL_SERVICE_NAME", service_name)})
    provider = TracerProvider(resource=resource)
    for exporter in _exporters_from_env(env):
        provider.add_span_processor(BatchSpanProcessor(exporter))
    for processor in processors:
        provider.add_span_processor(processor)
    return provider


def _exporters_from_env(env) -> list[SpanExporter]:
    names = env.get("OTEL_TRACES_EXPORTER")
    if names is None:
        has_endpoint = env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT")
        names = "otlp" if has_endpoint else "none"
    exporters: list[SpanExporter] = []
    for name in (n.strip().lower() for n in names.split(",")):
        if name in ("", "none"):
            continue
        if name == "console":
            exporters.append(ConsoleSpanExporter())
        elif name == "otlp":
            protocol = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL", env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf"))
            if protocol != "http/protobuf":
                raise ValueError(
                    f"OTEL_EXPORTER_OTLP_PROTOCOL={protocol!r} is not supported; gpumedic ships the "
                    "http/protobuf exporter (point it at port 4318)"
                )
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

            exporters.append(OTLPSpanExporter())
        else:
            raise ValueError(f"OTEL_TRACES_EXPORTER names unknown exporter {name!r} (use otlp, console or none)")
    return exporters
