"""zombie-detector's composition root: `create_app` builds everything; `run` is the console script.

The service is the node-incident detector: every rule over node samples and node events (the
zombie job was its first), fed through one incident book. Detector cells run the rules that look
at one node at a time over their partitions; the decider keeps the book and the rules that
compare nodes.
"""

from __future__ import annotations


from faststream import FastStream

from gpumedic_bus import ServiceRuntime
from gpumedic_bus.service import run_service
from gpumedic_bus.topology import NODE_INCIDENT_INPUTS
from gpumedic_events import ServiceHeartbeat
from gpumedic_events.views import Sample
from gpumedic_incidents import Policy
from zombie_detector.cell import Cell
from zombie_detector.handlers import DetectorHandlers
from zombie_detector.node_incidents import SOURCE as SERVICE
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules import decider_rules
from zombie_detector.rules.control_plane import SamplesLostRule
from zombie_detector.settings import Settings


def create_app(settings: Settings | None = None, *, policy: Policy | None = None) -> FastStream:
    """`policy` overrides the policy file (tests). With `settings.cells`, every instance runs a
    detector cell over its share of the partitions (`zombie_detector.cell`), and the one that holds
    the lease keeps only the rules that compare nodes; without, that one runs every rule itself."""
    settings = settings or Settings()
    policy = policy or settings.policy.load()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    if settings.cells:
        runtime.alongside(Cell(runtime, policy).run)
    handlers = DetectorHandlers(runtime, NodeIncidents(policy, decider_rules(policy) if settings.cells else None))
    handlers.attach("zombie-detector-actions")
    runtime.on_startup(handlers.recall_memory)  # after the lease and the open incidents, before any input
    runtime.background(handlers.keep_memory)
    for rule in handlers.logic.rules:
        if isinstance(rule, SamplesLostRule):
            runtime.metrics.gauge("gpumedic_samples_unacknowledged", "Samples the nodes said the bus did not acknowledge "
                                  "(NodeSampled.unacknowledged), since this detector started.", [], lambda rule=rule: [((), float(rule.total))])
    runtime.consume_fast("zombie-detector-samples", handlers.on_event, view=Sample)  # all of it, decoded by msgspec
    runtime.follow(ServiceHeartbeat, handlers.on_event)  # how far behind each sample consumer is
    runtime.background(handlers.watch_own_lag)
    # a cell's finding is a sample's verdict: handled within 50 ms, not when a batch of 16 would fill
    runtime.consume("zombie-detector-findings", handlers.on_findings, fetch_within_s=0.05)
    for event_type in NODE_INCIDENT_INPUTS:  # with cells, only what the rules that compare nodes read is judged here
        runtime.consume(f"zombie-detector-{event_type.__name__}", handlers.on_event)
    return runtime.app()


def run() -> None:
    """Console script `gpumedic-zombie-detector`."""
    run_service(SERVICE, Settings, create_app)
