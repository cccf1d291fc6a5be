"""leader-health's composition root: `create_app` builds everything; `run` is the console script.

The service probes one peer cluster and is its incident detector: each round's answers (beside what
the peers' own nodes say of their daemons' accept queues) go through the cluster rules into the
shared incident lifecycle, and the fixes (an election through
a peer's admin endpoint, a restart of a peer's daemon) through the remediator's gate.
"""

from __future__ import annotations

import logging

from faststream import FastStream

from gpumedic_bus import Delivery, ServiceRuntime
from gpumedic_bus.service import run_service
from gpumedic_events import ListenBacklogReported
from gpumedic_incidents import Policy
from gpumedic_incidents.detector import Detector
from leader_health.handlers import check_loop
from leader_health.judge import SOURCE as SERVICE
from leader_health.judge import ClusterIncidents
from leader_health.settings import Settings
from leader_health.status import StatusReader

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, policy: Policy | None = None) -> FastStream:
    """`policy` overrides the policy file (tests)."""
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    policy = policy or settings.policy.load()
    if missing := policy.unconfigured():
        log.info("leader-health: these escalate to a person until set: %s", ", ".join(f"{k} ({v})" for k, v in missing.items()))
    if settings.http_timeout_s <= policy.kinds.slow_peer.slower_than_s:
        log.warning("leader-health: GPUMEDIC_LEADER_HTTP_TIMEOUT_S (%gs) is not above kinds.slow_peer.slower_than_s (%gs): "
                    "a slow peer is taken for a blocked one", settings.http_timeout_s, policy.kinds.slow_peer.slower_than_s)
    logic = ClusterIncidents(settings.cluster, policy)
    detector = Detector(runtime, logic, SERVICE)
    detector.attach("leader-health-actions")

    async def on_backlog(event: ListenBacklogReported, delivery: Delivery) -> None:
        await detector.decide(lambda now: logic.on_backlog(event, now))

    runtime.consume("leader-health-ListenBacklogReported", on_backlog)
    reader = StatusReader(policy.peer_status.expressions())
    runtime.background(check_loop(runtime, settings, detector, logic, reader))
    return runtime.app()


def run() -> None:
    """Console script `gpumedic-leader-health`."""
    run_service(SERVICE, Settings, create_app)
