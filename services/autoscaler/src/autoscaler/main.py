"""autoscaler's composition root: `create_app` builds everything; `run` is the console script.

With a provider (GPUMEDIC_AUTOSCALER_PROVIDER, a read-only key is enough: the remediator rents and
ends) and a demand source, the service is the worker pool's incident detector; without them it
publishes its decisions only. Either way it detects the repeat offenders (`autoscaler.offenders`).
"""

from __future__ import annotations

import logging

from faststream import FastStream

from autoscaler.demand import open_source
from autoscaler.handlers import CapacityHandlers
from autoscaler.pool import SOURCE as SERVICE
from autoscaler.pool import HostIncidents, PoolIncidents
from autoscaler.settings import Settings
from gpumedic_bus import ServiceRuntime
from gpumedic_bus.service import run_service
from gpumedic_events import IncidentMarked, IncidentOpened, IncidentResolved, NodeDrained, NodeUndrained
from gpumedic_events.views import SampleLoad
from gpumedic_incidents import Policy
from gpumedic_incidents.detector import Detector

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None, *, policy: Policy | None = None) -> FastStream:
    """`policy` overrides the policy file (tests)."""
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    demand = open_source(settings.demand) if settings.demand else None
    provider = settings.provider_client()
    policy = policy or settings.policy.load()
    if demand is not None and provider is not None:
        logic: PoolIncidents | HostIncidents = PoolIncidents(
            settings.pool, policy, settings.scaling, busy_util_pct=settings.busy_util_pct, stale_after_s=settings.stale_after_s,
            provider=provider.name,
        )
    else:
        if provider is not None:
            log.warning("autoscaler: a provider without a demand source (GPUMEDIC_AUTOSCALER_DEMAND): decisions are published only")
        logic = HostIncidents(policy, stale_after_s=settings.stale_after_s)
    if isinstance(logic, PoolIncidents):
        runtime.metrics.gauge("gpumedic_worker_tasks", "Tasks each worker finished over the task database's outcomes window, "
                              "by its host and how they ended (done, failed).", ["worker", "host", "outcome"], logic.task_figures)
    detector = Detector(runtime, logic, SERVICE)
    detector.attach("autoscaler-actions")
    handlers = CapacityHandlers(runtime, settings, detector, demand, provider, behind_after_s=policy.kinds.control_plane_behind.after_s)
    runtime.replay((NodeDrained, NodeUndrained), handlers.on_drain)
    # Every incident ever opened, a history that grows with the fleet's: read once the service is
    # ready (a restart is back in seconds), the repeat offenders judged once it has caught up.
    offenders = logic.offenders
    marks = runtime.replay((IncidentMarked,), handlers.on_incident, before_ready=False)
    opened = runtime.replay((IncidentOpened, IncidentResolved), handlers.on_incident, before_ready=False)
    offenders.known = lambda: marks.is_set() and opened.is_set()
    runtime.consume_fast("autoscaler-samples", handlers.on_sample, view=SampleLoad)  # its load and burn-in figures only
    runtime.background(handlers.evaluate_loop)
    return runtime.app()


def run() -> None:
    """Console script `gpumedic-autoscaler`."""
    run_service(SERVICE, Settings, create_app)
