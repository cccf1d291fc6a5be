"""The remediator's composition root: settings, store, SSH executor, handler, broker, app.

Nothing is built at import time; tests call `create_app` with their own settings and get the
same service a deployment runs.
"""

from __future__ import annotations

import logging

from faststream import FastStream

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_bus.service import run_service
from gpumedic_events import OPERATION_NAMES, PREFLIGHT_SUBJECT
from gpumedic_incidents import IncidentStates
from gpumedic_store.engine import create_engine, ping, session_factory
from remediator.handlers import SERVICE, register
from remediator.health import SshHealth
from remediator.logic import Gate
from remediator.preflight import Preflight
from remediator.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastStream:
    """The remediator as a FastStream app; `app.runtime` is its ServiceRuntime."""
    settings = settings or Settings()
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    engine = create_engine(settings.store.url)
    executor = settings.executor()
    handler, _ = register(runtime, settings, sessions=session_factory(engine), executor=executor)
    preflight = Preflight(
        policy=settings.policy.load(),
        executor=executor,
        actions=handler,
        tracer=runtime.tracer,
        verify_timeout_s=settings.verify_timeout_s,
    )
    runtime.respond(PREFLIGHT_SUBJECT, preflight.handle)

    async def _check() -> None:
        settings.check_files()
        await ping(engine)
        # The detectors' open incidents, read-only: the gate checks every request against them.
        handler.incidents = await IncidentStates.open(runtime.broker.connection.jetstream())
        gate = settings.gate()
        log.info(
            "remediator: mode %s%s, store %s, inventory %s, breaker %d nodes / %gs, %d actions per node / %gs, "
            "requests refused after %gs, %d at once, protected %s",
            gate.mode,
            _enforced(gate),
            settings.store.safe_url,
            settings.inventory,
            gate.breaker_max_nodes,
            gate.breaker_window_s,
            gate.max_actions_per_node,
            gate.node_window_s,
            gate.max_request_age_s,
            settings.max_concurrent_actions,
            ", ".join(sorted(s.text for s in gate.protected_nodes)) or "none",
        )

    runtime.on_startup(_check)
    if settings.ssh_check_interval_s > 0:
        health = SshHealth(
            executor, settings.inventory, interval_s=settings.ssh_check_interval_s, concurrency=settings.ssh_check_concurrency
        )

        async def _publish(event) -> None:
            await publish_event(runtime.broker, event)

        runtime.background(health.loop(_publish), one_instance="ssh-health")
    app = runtime.app()
    app.after_shutdown(engine.dispose)
    return app


def run() -> None:
    """Console script `gpumedic-remediator`: run until SIGINT or SIGTERM."""
    run_service(SERVICE, Settings, _checked_app)


def _checked_app(settings: Settings) -> FastStream:
    """The files and the policy are read before anything starts: a mistake stops it, with file and line."""
    settings.check_files()
    settings.gate()
    return create_app(settings)


def _enforced(gate: Gate) -> str:
    """Which operations this remediator may run, for the start-up line."""
    acting = [op for op in OPERATION_NAMES if gate.mode_for(op) == "enforce"]
    return f" (runs {', '.join(acting) or 'nothing'})" if gate.mode == "enforce" else ""


if __name__ == "__main__":
    run()
