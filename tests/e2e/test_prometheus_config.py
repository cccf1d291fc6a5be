"""`deploy/prometheus.yml` as shipped, read by Debian's real Prometheus beside the embedded stack's
own targets file: Prometheus resolves a file_sd path against the config file's directory, so the
file must name `../var/prometheus-targets.json` for the stack's services to be found at all. The
simulated fleet's GPU series are listed there too (as `gpumedic demo` and `up --demo` list them),
and the queries of NVIDIA's DCGM dashboard find one series per simulated GPU under its node id."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from gpumedic.stack import Stack, free_port
from gpumedic_sim.fleet.nodes import SimFleet
from tests.fixtures.real import needs

ROOT = Path(__file__).resolve().parents[2]
PROMETHEUS = shutil.which("prometheus")

pytestmark = needs(PROMETHEUS, "Debian's prometheus (apt-get install prometheus; .ci/run does)")


@pytest.mark.long
@pytest.mark.timeout(120)
async def test_the_shipped_config_scrapes_the_embedded_stacks_services(tmp_path):
    # A checkout's layout: deploy/prometheus.yml as shipped, the stack under var/.
    (tmp_path / "deploy").mkdir()
    config = tmp_path / "deploy" / "prometheus.yml"
    shutil.copy(ROOT / "deploy" / "prometheus.yml", config)
    stack = Stack(tmp_path / "var", say=lambda *_: None)
    prometheus = None
    fleet = SimFleet(2, 2, tmp_path / "fleet")
    sampling = None
    try:
        stack.start_bus()
        await stack.provision()
        stack.migrate()
        stack.start_services(["leader-health", "autoscaler"])
        await stack.wait_ready()
        await fleet.start()

        async def nowhere(event) -> None:  # the series come from the samplers' latest samples, not the bus
            pass

        sampling = asyncio.create_task(fleet.run_samplers(nowhere, 0.5))
        gpu_series = await fleet.serve_metrics()
        stack.add_targets(gpu_series, {"service": "node-sampler", "fleet": "simulated"})
        port = free_port()  # only now: the stack's services take free ports as they start
        prometheus = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
            stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
        )
        expected = {f"http://127.0.0.1:{p}/metrics": s for s, p in stack.metrics_ports.items()} | {f"http://{gpu_series}/metrics": "fleet"}
        seen: dict[str, str] = {}
        async with httpx.AsyncClient() as client:
            for _ in range(300):  # discovered, then scraped once (the job scrapes every 15 s)
                try:
                    active = (await client.get(f"http://127.0.0.1:{port}/api/v1/targets")).json()["data"]["activeTargets"]
                    seen = {t["scrapeUrl"]: t["health"] for t in active if t["labels"]["job"] == "gpumedic-embedded"}
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                if set(seen) == set(expected) and all(h == "up" for h in seen.values()):
                    break
                await asyncio.sleep(0.2)
        assert set(seen) == set(expected), ((tmp_path / "prometheus.log").read_text()[-2000:], seen)
        assert all(h == "up" for h in seen.values()), seen
        # NVIDIA's DCGM dashboard's panels, one series per GPU by the labels it groups on
        async with httpx.AsyncClient() as client:
            for metric in ("DCGM_FI_DEV_GPU_TEMP", "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_FB_USED",
                           "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL"):
                answer = (await client.get(f"http://127.0.0.1:{port}/api/v1/query",
                                           params={"query": f"count by (Hostname, gpu, UUID) ({metric})"})).json()
                series = {(r["metric"]["Hostname"], r["metric"]["gpu"]) for r in answer["data"]["result"]}
                assert series == {(n, g) for n in fleet.nodes for g in ("0", "1")}, (metric, answer)
    finally:
        if sampling is not None:
            sampling.cancel()
        await fleet.stop()
        if prometheus is not None:
            prometheus.terminate()
            prometheus.wait(10)
        stack.stop()
