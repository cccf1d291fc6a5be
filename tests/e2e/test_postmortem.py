"""The container post-mortem end to end: a simulated node's jobs die in different ways, the real
node-sampler reports what its kernel log and Docker engine say, the real zombie-detector names
each death's cause, report-builder stores it, and `gpumedic incidents ID` shows the cause with
its evidence. A container the node stops on purpose opens nothing."""

from __future__ import annotations

import asyncio

from gpumedic.incidents import incident_text
from gpumedic_store import create_engine, session_factory, views
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import fleet_publishing, samplers_running
from tests.e2e.test_thin_path import detector


async def _died(store_url: str, expected: int, timeout_s: float = 40.0) -> list:
    engine = create_engine(store_url)
    try:
        for _ in range(int(timeout_s / 0.25)):
            async with session_factory(engine)() as session:
                rows = [i for i in await views.list_incidents(session, limit=100) if i.kind == "container_died"]
            if len(rows) >= expected and all(r.diagnosis for r in rows):
                return rows
            await asyncio.sleep(0.25)
    finally:
        await engine.dispose()
    raise AssertionError(f"fewer than {expected} container deaths recorded within {timeout_s}s")


async def test_each_death_is_named_by_its_cause_and_shown_with_its_evidence(nats_settings, store_url, apps, tmp_path):
    async with fleet_publishing(tmp_path, 1, 6, nats_settings.url) as (fleet, publish):
        await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url})))
        await apps.start(detector(nats_settings))
        node = fleet.node("sim-node-01")
        async with samplers_running(fleet, publish, 0.5):
            await asyncio.sleep(1.5)  # the engine's event stream is open, as on a node that has run a while
            jobs = {gpu: node.live_processes(gpu)[0] for gpu in range(6)}
            node.inject_oom_kill(0)
            node.inject_segfault(1)
            node.inject_sigterm(2)
            node.inject_gpu_oom(3)
            node.kill(jobs[4].pid, "KILL")  # somebody killed it by hand
            node.stop_job(5)  # the node stopped it on purpose
            rows = await _died(store_url, 5)
            await asyncio.sleep(2)  # the planned stop had its chance to show up too
            rows = await _died(store_url, 5)
        await apps.stop_all()

    by_container = {r.evidence["container_id"][:12]: r for r in rows}
    causes = {gpu: by_container[jobs[gpu].container_id[:12]].diagnosis["cause"] for gpu in range(5)}
    assert causes == {0: "cgroup_oom", 1: "segfault", 2: "sigterm", 3: "gpu_oom", 4: "killed"}
    assert jobs[5].container_id[:12] not in by_container  # a stop the node asked for is no incident
    assert len(rows) == 5

    oom = by_container[jobs[0].container_id[:12]]
    _, text = await incident_text(store_url, oom.id[:8])
    assert "container_died on sim-node-01" in text
    assert "cause: cgroup_oom (confidence 95%): it reached its memory limit: the engine says OOMKilled and the kernel's OOM killer ended pid" in text
    assert "remedy: the container reached its memory limit" in text
    assert "exit_code=137" in text and "oom_kernel_line=" in text


async def test_a_lost_gpu_reported_by_its_event_and_its_sample_at_once_is_one_incident(nats_settings, store_url, apps, tmp_path):
    """The sampler publishes GpuLost the moment NVML says so, and its next sample shows the GPU
    lost too; the detector consumes the two concurrently and must open one incident, not two."""
    async with fleet_publishing(tmp_path, 1, 4, nats_settings.url) as (fleet, publish):
        await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url})))
        await apps.start(detector(nats_settings))
        node = fleet.node("sim-node-01")
        async with samplers_running(fleet, publish, 0.2):
            await asyncio.sleep(0.5)
            for gpu in range(4):
                node.inject_gpu_lost(gpu)  # the next sample shows it lost, and GpuLost goes out with it
            await asyncio.sleep(3.0)
        await apps.stop_all()

    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        rows = [i for i in await views.list_incidents(session, limit=100) if i.kind == "gpu_lost"]
    await engine.dispose()
    assert sorted(r.gpu_index for r in rows) == [0, 1, 2, 3]
