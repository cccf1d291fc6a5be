"""The node-sampler's composition root: settings, sources, the sampling loop and the bus.

Nothing happens at import time. Tests and the simulated fleet pass their own NVML and process
table; on a real node the defaults are the `pynvml` module and /proc.
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

from faststream import FastStream
from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_bus.lateness import own_cgroup_pressure, read_pressure
from gpumedic_bus.service import run_service
from gpumedic_bus.topology import node_user
from gpumedic_events import Event

from node_sampler.cgroups import ContainerCgroups
from node_sampler.checks import CheckScripts
from node_sampler.files import ExpectedFiles
from node_sampler.logwatch import LogPatterns
from node_sampler.host import HostReader, watched_disks
from node_sampler.jobs import JobProbe, OutputGrowthProbe, ProcessPatternProbe, RowGrowthProbe, StatusEndpointProbe
from node_sampler.listen import ListenQueue
from node_sampler.metrics import GpuCollector, IbCollector
from node_sampler.procs import ProcessTable, ProcFsTable
from node_sampler.ras import RasWatch
from node_sampler.sampler import Sampler
from node_sampler.settings import Settings

SERVICE = "node-sampler"

log = logging.getLogger(__name__)


def build_probes(settings: Settings, processes: ProcessTable) -> list[JobProbe]:
    """The job probes the settings ask for, the node's own status endpoint first."""
    probes: list[JobProbe] = []
    if settings.status_url:
        probes.append(
            StatusEndpointProbe(settings.status_url, settings.status_jobs_path, timeout_s=settings.status_timeout_s)
        )
    if settings.job_process_pattern:
        probes.append(ProcessPatternProbe(re.compile(settings.job_process_pattern), processes))
    if settings.watch_paths:
        probes.append(OutputGrowthProbe.for_paths(settings.watch_paths))
    if settings.watch_rows:
        probes += RowGrowthProbe.parse(settings.watch_rows)
    return probes


def create_app(
    settings: Settings | None = None,
    *,
    nvml: Any = None,
    processes: ProcessTable | None = None,
    probes: list[JobProbe] | None = None,
) -> FastStream:
    settings = settings or Settings()
    if nvml is None:
        import pynvml

        nvml = pynvml
    processes = processes or ProcFsTable(settings.proc_root, job_label=settings.job_label_env)
    runtime = ServiceRuntime(SERVICE, settings.nats, trace_to_bus=settings.trace_to_bus, spans_as=node_user(settings.node_id))
    sampler = Sampler(
        settings.node_id,
        nvml,
        processes,
        build_probes(settings, processes) if probes is None else probes,
        settings.interval_s,
        host=HostReader(settings.proc_root, watched_disks(None if settings.disk_paths is None else [str(p) for p in settings.disk_paths]),
                        ib_root=settings.ib_root),
        holder_scan_interval_s=settings.holder_scan_interval_s,
        health_interval_s=settings.health_interval_s,
        health_refresh_s=settings.health_refresh_s,
        xid_events=settings.xid_events,
        kernel_log=settings.kernel_log,
        docker_socket=settings.docker_socket,
        container_log_lines=settings.container_log_lines,
        ras=RasWatch(settings.ras_host, settings.ras_port, after_s=settings.ras_after_s, every_s=settings.ras_every_s,
                     timeout_s=settings.ras_timeout_s) if settings.ras_port else None,
        files=ExpectedFiles(settings.expect_files, settings.files_root) if settings.expect_files else None,
        checks=CheckScripts(settings.checks_dir, interval_s=settings.checks_interval_s, timeout_s=settings.checks_timeout_s,
                            root=settings.files_root) if settings.checks_dir else None,
        logs=LogPatterns(settings.log_patterns, interval_s=settings.interval_s, root=settings.files_root,
                         docker_socket=settings.docker_socket) if settings.log_patterns else None,
        cgroups=ContainerCgroups(settings.files_root / "sys/fs/cgroup"),
        own_pressure=(lambda: read_pressure(own)) if (own := own_cgroup_pressure()) is not None else None,
        listen=(ListenQueue(settings.listen_port) if settings.listen_port else None) if settings.listen_port is not None
        else ListenQueue.of_status_url(settings.status_url),
    )

    async def publish(event: Event) -> None:
        await publish_event(runtime.broker, event)

    async def sample_loop() -> None:
        await sampler.run(publish)

    async def release_nvml() -> None:
        await asyncio.to_thread(sampler.close)

    # dcgm-exporter's per-GPU series from the latest sample, for the GPU dashboards people already
    # have. Their `Hostname` is the node id: the machine's own name is a container's id under
    # compose and a pod's under RunPod, and the console looks a node's GPU history up by its id.
    runtime.metrics.registry.register(GpuCollector.of(sampler, settings.node_id))
    runtime.metrics.registry.register(IbCollector(lambda: sampler.last))
    runtime.background(sample_loop)
    app = runtime.app()
    app.after_shutdown(release_nvml)
    log.debug("node-sampler for %s every %.1fs", settings.node_id, settings.interval_s)
    return app


def run() -> None:
    """Console script `gpumedic-node-sampler`."""
    run_service(SERVICE, Settings, create_app)
