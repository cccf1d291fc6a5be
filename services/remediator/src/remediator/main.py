"""The remediator's composition root: settings, store, SSH executor, handler, broker, app.

Nothing is built at import time; tests call `create_app` with their own settings and get the
same service a deployment runs.
"""

from __future__ import annotations

import asyncio
import logging

from faststream import FastStream

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_bus.follow import GET_TIMEOUT_S
from gpumedic_bus.service import run_service
from gpumedic_events import LOGS_SUBJECT, OPERATION_NAMES, PREFLIGHT_SUBJECT, ROLLOUT_SUBJECT
from gpumedic_incidents import IncidentStates, Policy
from gpumedic_incidents.policy import NodeSelector
from gpumedic_nodes.ssh import SshExecutor
from gpumedic_providers.base import Provider
from gpumedic_providers.config import open_provider
from gpumedic_store import TaskDatabase
from gpumedic_store.engine import create_engine, ping, session_factory
from gpumedic_webhook import read_token
from remediator.handlers import SERVICE, register
from remediator.health import SshHealth
from remediator.gate import Gate
from remediator.logs import LogReader
from remediator.preflight import Preflight
from remediator.rollout import Rollout
from remediator.settings import Settings

log = logging.getLogger(__name__)


def create_app(settings: Settings | None = None) -> FastStream:
    """The remediator as a FastStream app; `app.runtime` is its ServiceRuntime. The policy file is
    read here, once, and what it says is passed down."""
    settings = settings or Settings()
    policy = settings.policy.load()
    gate = gate_of(settings, policy)
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus)
    engine = create_engine(settings.store.url)
    executor = executor_of(settings)
    handler, _ = register(
        runtime, settings, gate=gate, sessions=session_factory(engine), executor=executor,
        hook_url=policy.actions.drain_node.hook_url, provider=provider_of(settings), task_db=task_db_of(settings),
    )
    preflight = Preflight(
        policy=policy,
        executor=executor,
        actions=handler,
        tracer=runtime.tracer,
        verify_timeout_s=settings.verify_timeout_s,
    )
    runtime.respond(PREFLIGHT_SUBJECT, preflight.handle)
    runtime.respond(ROLLOUT_SUBJECT, Rollout(policy=policy, actions=handler, tracer=runtime.tracer).handle)
    runtime.respond(LOGS_SUBJECT, LogReader(policy=policy, executor=executor, inventory=settings.inventory).handle)

    async def _check() -> None:
        settings.check_files()
        await ping(engine)
        # The detectors' open incidents, read-only: the gate checks every request against them.
        # One lookup, given up after GET_TIMEOUT_S: a server bouncing never answers, and the start
        # asks again sooner than the client's 5 s would.
        async with asyncio.timeout(GET_TIMEOUT_S):
            handler.incidents = await IncidentStates.open(runtime.broker.connection.jetstream())
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
            executor, settings.inventory, interval_s=settings.ssh_check_interval_s, concurrency=settings.ssh_check_concurrency,
            loop_lag=runtime.loop_lag,
        )

        async def _publish(event) -> None:
            await publish_event(runtime.broker, event)

        runtime.background(health.loop(_publish, runtime.shares("ssh-health")))
    app = runtime.app()
    app.after_shutdown(engine.dispose)
    return app


def run() -> None:
    """Console script `gpumedic-remediator`: run until SIGINT or SIGTERM."""
    run_service(SERVICE, Settings, _checked_app)


def _checked_app(settings: Settings) -> FastStream:
    """The files and the policy are read before anything starts: a mistake stops it, with file and line."""
    settings.check_files()
    return create_app(settings)


def gate_of(settings: Settings, policy: Policy) -> Gate:
    """The gate's rules: the settings' switch, protected nodes and breaker, and the per-node limit and
    per-operation rules of the policy."""
    return Gate(
        mode=settings.mode,
        actions=policy.actions,
        kinds=policy.kinds,
        preflight=policy.preflight,
        protected_nodes=frozenset(map(NodeSelector, settings.protected_nodes)),
        max_actions_per_node=policy.gate.max_actions_per_node,
        node_window_s=policy.gate.node_window_s,
        breaker_max_nodes=settings.breaker_max_nodes,
        breaker_max_share=settings.breaker_max_share,
        breaker_window_s=settings.breaker_window_s,
        max_request_age_s=settings.max_request_age_s,
    )


def executor_of(settings: Settings) -> SshExecutor:
    return SshExecutor(
        inventory=settings.inventory, known_hosts=settings.known_hosts, client_key=settings.client_key,
        connect_timeout_s=settings.connect_timeout_s, command_timeout_s=settings.command_timeout_s,
    )


def provider_of(settings: Settings) -> Provider | None:
    """The configured provider's client, None without one; ValueError if its key file is unusable."""
    if settings.provider is None:
        return None
    return open_provider(settings.provider, read_token(settings.provider.api_key_file, "GPUMEDIC_REMEDIATOR_PROVIDER api_key_file"))


def task_db_of(settings: Settings) -> TaskDatabase | None:
    """The task database, None without one; ValueError if its URL file is unusable."""
    if settings.task_db_url_file is None:
        return None
    where = f"GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE {settings.task_db_url_file}"
    return TaskDatabase(read_token(settings.task_db_url_file, "GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE"), where)


def _enforced(gate: Gate) -> str:
    """Which operations this remediator may run, for the start-up line."""
    acting = [op for op in OPERATION_NAMES if gate.mode_for(op) == "enforce"]
    return f" (runs {', '.join(acting) or 'nothing'})" if gate.mode == "enforce" else ""


if __name__ == "__main__":
    run()
