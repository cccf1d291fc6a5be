"""Each service's Prometheus metrics, served on `GPUMEDIC_METRICS_PORT` (off when unset) at
`GPUMEDIC_METRICS_ADDR` (0.0.0.0).

Every service counts the events it handled by type and outcome, with a latency histogram, and
exports its process's CPU and memory; a service adds its own (incidents by kind and state, actions
by outcome, the breaker) to `ServiceMetrics.registry`. Each service has a registry of its own, so
several services in one process (the tests) never mix their figures. Scrape `/metrics` at
`http://HOST:PORT/metrics`; `deploy/grafana/gpumedic.json` is a dashboard over these names.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterable
from wsgiref.simple_server import WSGIServer

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, Info, ProcessCollector, start_http_server
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

log = logging.getLogger(__name__)

PORT_VARIABLE = "GPUMEDIC_METRICS_PORT"
ADDRESS_VARIABLE = "GPUMEDIC_METRICS_ADDR"
"""Where the endpoint listens: 0.0.0.0 by default (a container's), 127.0.0.1 in the embedded stack."""
HANDLING_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)
"""Seconds: a sample takes well under a millisecond, an action over SSH tens of seconds."""


def metrics_port(environ: dict[str, str] | None = None) -> int | None:
    """The port from GPUMEDIC_METRICS_PORT (None: unset or empty, no endpoint); ValueError names a bad one."""
    value = (os.environ if environ is None else environ).get(PORT_VARIABLE, "").strip()
    if not value:
        return None
    if not value.isdigit() or not 0 <= int(value) <= 65535:
        raise ValueError(f"{PORT_VARIABLE}={value!r} is not a port (0 to 65535; 0 picks a free one)")
    return int(value)


class ServiceMetrics:
    def __init__(self, service: str) -> None:
        self.service = service
        self.registry = CollectorRegistry()
        Info("gpumedic_service", "The service these figures are of.", registry=self.registry).info({"service": service})
        ProcessCollector(registry=self.registry)
        self.handled = Counter(
            "gpumedic_events_handled", "Events consumed, by event type and outcome: ok, invalid (dead-lettered), "
            "retried (the handler failed, redelivery follows), failed (dead-lettered after the last delivery), "
            "skipped (read live, did not validate: its durable consumers dead-letter it).",
            ["event", "outcome"], registry=self.registry,
        )
        self.handling = Histogram(
            "gpumedic_event_handling_seconds", "Seconds a handler took for one event, by event type.",
            ["event"], buckets=HANDLING_BUCKETS, registry=self.registry,
        )
        self.waiting = Gauge(
            "gpumedic_events_waiting", "Events held while a dependency their handler needs (the store) is down: "
            "neither failed nor dead-lettered, handled once it is back.", registry=self.registry,
        )
        self.port: int | None = None
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None

    def rejected(self) -> int:
        """Messages refused so far (invalid, or failed past the last delivery): all dead-lettered."""
        return int(sum(s.value for metric in self.handled.collect() for s in metric.samples
                       if s.name.endswith("_total") and s.labels["outcome"] in ("invalid", "failed")))

    def gauge(self, name: str, documentation: str, labels: list[str], read: Callable[[], Iterable[tuple[tuple[str, ...], float]]]) -> None:
        """A gauge computed at scrape time from the service's own state: `read` gives (label values, value)."""
        self.registry.register(_Computed(name, documentation, labels, read))

    def serve(self, port: int, addr: str | None = None) -> int:
        """Start `/metrics` on `port` (0: a free one); the port it listens on."""
        addr = addr or os.environ.get(ADDRESS_VARIABLE, "").strip() or "0.0.0.0"
        self._server, self._thread = start_http_server(port, addr=addr, registry=self.registry)
        self.port = self._server.server_port
        log.info("%s: metrics on http://%s:%d/metrics", self.service, addr, self.port)
        return self.port

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None


class _Computed(Collector):
    def __init__(self, name: str, documentation: str, labels: list[str], read) -> None:
        self._name, self._documentation, self._labels, self._read = name, documentation, labels, read

    def collect(self) -> Iterable[Metric]:
        family = GaugeMetricFamily(self._name, self._documentation, labels=self._labels)
        for values, value in self._read():
            family.add_metric(list(values), value)
        yield family


CONNECTED = "gpumedic_bus_connected"
"""1 while the service's NATS connection is up; the metrics endpoint itself answers once the service is ready."""


def healthcheck() -> None:
    """`gpumedic-healthcheck`, a container's health check: exits 0 when this service's `/metrics`
    answers (it starts once the service is ready) and says its NATS connection is up; otherwise
    1 with the reason in one line."""
    import sys
    import urllib.request

    try:
        port = metrics_port()
        if port is None:
            sys.exit(f"unhealthy: {PORT_VARIABLE} is not set, so there is no endpoint to ask")
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=3) as reply:
            text = reply.read().decode()
    except (OSError, ValueError) as exc:
        sys.exit(f"unhealthy: no answer on the metrics port ({exc}): starting, or not ready")
    if f"{CONNECTED} 1.0" not in text.splitlines():
        sys.exit("unhealthy: the service is not connected to NATS")
