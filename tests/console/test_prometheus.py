"""GPU history from a real Prometheus (Debian's): it scrapes node-sampler's per-GPU series (the
real collector, served as node-sampler serves them) every second; the console's node history then
takes its GPU charts from Prometheus's range queries, the host's from the store, and says which
came from where. With Prometheus gone, the page says so and shows the store's GPU charts."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from datetime import UTC, datetime, timedelta

import httpx
import pytest
from aiohttp import web
from prometheus_client import CollectorRegistry, generate_latest

from gpumedic.stack import free_port
from gpumedic_events import GpuSample, HostSample, NodeSampled
from gpumedic_store import create_engine, history, session_factory, upgrade
from node_sampler.metrics import GpuCollector
from report_builder.console import Console, ConsoleConfig
from report_builder.history import PrometheusHistory
from tests.fixtures.real import needs

PROMETHEUS = shutil.which("prometheus")
NODE = "gpu-node-42"

pytestmark = needs(PROMETHEUS, "Debian's prometheus (apt-get install prometheus; .ci/run does)")


def sample(util: int) -> NodeSampled:
    return NodeSampled(
        source="test", occurred_at=datetime.now(UTC), node_id=NODE, interval_s=1.0,
        gpus=tuple(GpuSample(index=i, uuid=f"GPU-{i}", name="NVIDIA H100", utilization_gpu_pct=util if i == 0 else 5, memory_used_mib=40_960,
                             memory_total_mib=81_920, temperature_c=70, power_w=500.0, sm_clock_mhz=1980) for i in range(2)),
        host=HostSample(memory_total_mib=100_000, memory_available_mib=60_000),
    )


@pytest.mark.timeout(120)
async def test_gpu_charts_from_prometheus_and_the_rest_from_the_store(tmp_path):
    latest = {"sample": sample(80)}
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: latest["sample"], dict, NODE))

    async def metrics(_request):
        return web.Response(body=generate_latest(registry), content_type="text/plain")

    app = web.Application()
    app.add_routes([web.get("/metrics", metrics)])
    runner = web.AppRunner(app)
    await runner.setup()
    exporter = free_port()
    await web.TCPSite(runner, "127.0.0.1", exporter).start()

    port = free_port()
    config = tmp_path / "prometheus.yml"
    config.write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: nodes\n    static_configs: [{{targets: ['127.0.0.1:{exporter}']}}]\n"
    )
    server = subprocess.Popen(
        [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp_path / 'tsdb'}", f"--web.listen-address=127.0.0.1:{port}"],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "prometheus.log").open("w"),
    )
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)
    now = datetime.now(UTC)
    async with sessions() as session, session.begin():  # the store's minute: host figures, and GPU 0 at 3 %
        folder = history.MinuteFolder(history.minute_of(now))
        folder.add(sample(3))
        await history.write(session, {NODE: [folder.minute_figures()]})
    console = None
    try:
        prometheus_url = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            for _ in range(300):  # ready, and a few scrapes in
                try:
                    answer = await client.get(f"{prometheus_url}/api/v1/query", params={"query": f'count_over_time(DCGM_FI_DEV_GPU_UTIL{{Hostname="{NODE}"}}[1m])'})
                    result = answer.json()["data"]["result"]
                    if result and float(result[0]["value"][1]) >= 3:
                        break
                except (httpx.HTTPError, KeyError, ValueError):
                    pass
                await asyncio.sleep(0.2)
            else:
                pytest.fail((tmp_path / "prometheus.log").read_text()[-2000:])

        reader = PrometheusHistory(prometheus_url)
        first = int(now.timestamp()) - 20
        charts = {c.key: c for c in await reader.gpu_charts(NODE, list(range(first, first + 40, 2)), 2)}
        assert set(charts) == {"gpu_util", "gpu_memory", "gpu_temperature", "gpu_power", "gpu_clock"}
        util = {s.label: [v for v in s.values if v is not None] for s in charts["gpu_util"].series}
        assert util["GPU 0"] and set(util["GPU 0"]) == {80.0} and set(util["GPU 1"]) == {5.0}
        assert {v for v in charts["gpu_memory"].series[0].values if v is not None} == {40.0}  # MiB as GiB
        assert await reader.gpu_charts("gpu-node-nosuch", list(range(first, first + 40, 2)), 2) == []

        console = Console(sessions, ConsoleConfig(port=0), publish=lambda e: asyncio.sleep(0), prometheus=reader)
        await console.start()
        window = f"from={(now - timedelta(minutes=5)).strftime('%Y-%m-%dT%H:%M')}&to={(now + timedelta(minutes=2)).strftime('%Y-%m-%dT%H:%M')}"
        async with httpx.AsyncClient(base_url=console.url.rstrip("/")) as client:
            body = (await client.get(f"/nodes/{NODE}/history.json?{window}")).json()
            assert body["source"].startswith("Prometheus (") and body["source_error"] is None
            by_id = {c["id"]: c for c in body["charts"]}
            gpu0 = [v for v in by_id["gpu_util"]["series"][0]["values"] if v is not None]
            assert gpu0 and set(gpu0) == {80.0}  # Prometheus's, not the store's 3 %
            assert [v for v in by_id["host_memory"]["series"][0]["values"] if v is not None] == [round(40_000 / 1024, 2)]  # the store's

            server.terminate()
            server.wait(timeout=30)
            gone = await client.get(f"/nodes/{NODE}?{window}")
            assert "Prometheus did not give the GPU figures" in gone.text and "they are the store&#39;s" in gone.text
            body = (await client.get(f"/nodes/{NODE}/history.json?{window}")).json()
            assert body["source"] == "the store" and "ConnectError" in body["source_error"]
            assert [v for v in body["charts"][0]["series"][0]["values"] if v is not None] == [3.0]
    finally:
        if console is not None:
            await console.stop()
        server.terminate()
        server.wait(timeout=30)
        await runner.cleanup()
        await engine.dispose()


def test_a_prometheus_that_answers_nonsense_is_said_so(tmp_path):
    """An error answer and a body that is not a range vector are each one clear error."""
    from report_builder.history import PrometheusUnavailable

    async def refuses(_request):
        return web.json_response({"status": "error", "error": "parse error at char 3"}, status=400)

    async def garbles(_request):
        return web.json_response({"status": "success", "data": {"result": [{"values": 7}]}})

    async def run() -> list[str]:
        app = web.Application()
        app.add_routes([web.get("/bad/api/v1/query_range", refuses), web.get("/odd/api/v1/query_range", garbles)])
        runner = web.AppRunner(app)
        await runner.setup()
        port = free_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        said = []
        try:
            for where in ("bad", "odd"):
                with pytest.raises(PrometheusUnavailable) as caught:
                    await PrometheusHistory(f"http://127.0.0.1:{port}/{where}").gpu_charts(NODE, [0, 60], 60)
                said.append(str(caught.value))
        finally:
            await runner.cleanup()
        return said

    bad, odd = asyncio.run(run())
    assert "HTTP 400: parse error at char 3" in bad
    assert "not a range vector" in odd
