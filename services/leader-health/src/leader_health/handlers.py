"""leader-health consumes nothing from the bus yet: it probes peers and publishes its checks."""

from __future__ import annotations

import asyncio
import logging

from gpumedic_bus import ServiceRuntime, publish_event
from leader_health.logic import assess
from leader_health.probe import probe_all
from leader_health.settings import Settings

log = logging.getLogger(__name__)


def check_loop(runtime: ServiceRuntime, settings: Settings):
    async def check_cluster() -> None:
        while True:
            answers = await probe_all(
                settings.peers,
                connect_timeout_s=settings.connect_timeout_s,
                http_timeout_s=settings.http_timeout_s,
                concurrency=settings.probe_concurrency,
            )
            for answer in answers:
                if answer.state != "ok":
                    log.info("peer %s: %s: %s", answer.url, answer.state, answer.detail)
            checked = assess(settings.cluster, answers)
            try:
                await publish_event(runtime.broker, checked)
            except Exception as exc:
                log.warning("cluster check not published (%r); the bus may be reconnecting", exc)
            await asyncio.sleep(settings.interval_s)

    return check_cluster
