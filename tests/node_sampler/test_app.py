"""The service as composed by `create_app`, publishing through a real nats-server, and its `/metrics`."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from pathlib import Path

from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from gpumedic_bus.streams import SAMPLES, partition_of
from gpumedic_events import GpuHealth, GpuSample, HostSample, IbPort, NodeSampled, NvLinkSample

from node_sampler.main import build_probes, create_app
from node_sampler.metrics import SERIES, XID, GpuCollector, IbCollector
from node_sampler.settings import Settings
from tests.node_sampler.fakes import table_for_two_gpus, two_gpus


async def test_samples_land_in_the_samples_stream(nats_settings, js):
    nvml = two_gpus()
    settings = Settings(nats=nats_settings, node_id="gpu-node-07", interval_s=0.2)
    app = create_app(settings, nvml=nvml, processes=table_for_two_gpus())
    sub = await js.pull_subscribe(SAMPLES.stored_subject(NodeSampled, "gpu-node-07"), stream=SAMPLES.name)

    await app.start()
    try:
        messages = []
        async with asyncio.timeout(10):
            while len(messages) < 2:
                messages += await sub.fetch(2 - len(messages), timeout=5)
    finally:
        await app.stop()

    assert messages[0].subject == f"gpumedic.v1.node.sampled.gpu-node-07.{partition_of('gpu-node-07')}"  # stored by partition
    events = [NodeSampled.from_json(m.data, subject=SAMPLES.as_published(m.subject)) for m in messages]
    assert events[0].source == "node-sampler" and events[0].interval_s == 0.2
    assert [p.pid for p in events[0].gpus[0].processes] == [41230]
    assert events[0].gpus[0].processes[0].start_ticks == 8812345
    assert messages[0].headers["Nats-Msg-Id"] == str(events[0].event_id)
    assert events[1].occurred_at > events[0].occurred_at
    # the app gave the NVML sessions (sampling, XID watching) back when it stopped
    assert nvml.init_calls >= 2 and nvml.shutdown_calls == nvml.init_calls


def test_probes_follow_the_settings(tmp_path):
    settings = Settings(
        node_id="n1", status_url="http://127.0.0.1:1/status", job_process_pattern="selfplay", watch_paths=[tmp_path],
        watch_rows=[f"{tmp_path}/selfplay.db:games"],
    )
    kinds = [type(p).__name__ for p in build_probes(settings, table_for_two_gpus())]
    assert kinds == ["StatusEndpointProbe", "ProcessPatternProbe", "OutputGrowthProbe", "RowGrowthProbe"]
    assert build_probes(Settings(node_id="n1"), table_for_two_gpus()) == []


# dcgm-exporter's names for what a sample measures (its etc/default-counters.csv; the ECC totals
# are among the counters it ships commented out), and the labels its series carry.
DCGM_EXPORTER = {
    "DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_MEM_COPY_UTIL", "DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_TEMP",
    "DCGM_FI_DEV_POWER_USAGE", "DCGM_FI_DEV_XID_ERRORS", "DCGM_FI_DEV_ROW_REMAP_FAILURE", "DCGM_FI_DEV_ECC_SBE_VOL_TOTAL",
    "DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "DCGM_FI_DEV_SM_CLOCK", "DCGM_FI_DEV_MEM_CLOCK", "DCGM_FI_DEV_MEMORY_TEMP",
    "DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL", "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL", "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
    "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS", "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
}
DCGM_LABELS = {"gpu", "UUID", "modelName", "Hostname"}


async def test_metrics_serve_each_gpu_under_dcgm_exporters_names_from_the_latest_sample(nats_settings, monkeypatch):
    monkeypatch.setenv("GPUMEDIC_METRICS_PORT", "0")
    monkeypatch.setenv("GPUMEDIC_METRICS_ADDR", "127.0.0.1")
    app = create_app(Settings(nats=nats_settings, node_id="gpu-node-07", interval_s=0.2), nvml=two_gpus(), processes=table_for_two_gpus())
    await app.start()
    try:
        port = app.runtime.metrics.port
        async with asyncio.timeout(10):
            while "DCGM_FI_DEV_GPU_UTIL{" not in (text := await asyncio.to_thread(_scrape, port)):
                await asyncio.sleep(0.1)
    finally:
        await app.stop()
    families = {f.name: f for f in text_string_to_metric_families(text)}  # the Prometheus client's own parser
    served = {name for name in families if name.startswith("DCGM_")}
    assert served == DCGM_EXPORTER and all(families[name].type == "gauge" for name in served)
    util = {s.labels["gpu"]: s for s in families["DCGM_FI_DEV_GPU_UTIL"].samples}
    assert set(util) == {"0", "1"} and all(set(s.labels) == DCGM_LABELS for s in util.values())
    # `Hostname` is the node id (the machine's name is a container's id under compose, a pod's on RunPod)
    assert {s.labels["Hostname"] for name in served for s in families[name].samples} == {"gpu-node-07"}
    assert util["1"].value == 0.0 and util["1"].labels["UUID"] == "GPU-bbbb"
    assert {s.labels["gpu"]: s.value for s in families["DCGM_FI_DEV_FB_USED"].samples}["1"] == 8192.0
    assert all(s.value == 0 for s in families["DCGM_FI_DEV_XID_ERRORS"].samples)


def test_the_slow_figures_come_from_each_gpus_last_health_read():
    link = NvLinkSample(link=3, up=False, replay_errors=4, recovery_errors=2, crc_errors=9)
    health = GpuHealth(memory_clock_mhz=3201, pcie_replay_count=12, ecc_uncorrected_aggregate=1, nvlink_count=18, nvlinks=(link,))
    sample = NodeSampled(source="node-sampler", node_id="n1", interval_s=5, gpus=(
        GpuSample(index=0, uuid="GPU-a", name="NVIDIA H200", sm_clock_mhz=1470, memory_temperature_c=46),
        GpuSample(index=1, uuid="GPU-b", name="NVIDIA H200", sm_clock_mhz=345),
    ))
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: sample, dict, "node-a", lambda: {0: health}))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}

    def served(name: str) -> list[tuple[str, float]]:
        return [(s.labels["gpu"], s.value) for s in families[name].samples]

    assert served("DCGM_FI_DEV_SM_CLOCK") == [("0", 1470.0), ("1", 345.0)]
    assert served("DCGM_FI_DEV_MEMORY_TEMP") == [("0", 46.0)]
    # GPU 1 had no health read yet: no series, not a zero
    assert served("DCGM_FI_DEV_MEM_CLOCK") == [("0", 3201.0)] and served("DCGM_FI_DEV_PCIE_REPLAY_COUNTER") == [("0", 12.0)]
    assert served("DCGM_FI_DEV_ECC_DBE_AGG_TOTAL") == [("0", 1.0)] and not families["DCGM_FI_DEV_ECC_SBE_AGG_TOTAL"].samples
    assert served("DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL") == [("0", 4.0)]
    assert served("DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL") == [("0", 2.0)]


def _scrape(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as reply:
        return reply.read().decode()


def test_the_collector_serves_the_last_xid_and_nothing_for_a_lost_gpu_or_an_unread_field():
    sample = NodeSampled(source="node-sampler", node_id="n1", interval_s=5, gpus=(
        GpuSample(index=0, uuid="GPU-a", name="NVIDIA H100", utilization_gpu_pct=None, memory_used_mib=10, memory_total_mib=80),
        GpuSample(index=1, uuid="GPU-b", name="NVIDIA H100", utilization_gpu_pct=50, lost=True),
    ))
    registry = CollectorRegistry()
    registry.register(GpuCollector(lambda: sample, lambda: {0: 79}, "node-a"))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}
    assert [(s.labels["gpu"], s.value) for s in families["DCGM_FI_DEV_XID_ERRORS"].samples] == [("0", 79.0)]
    assert [(s.labels["gpu"], s.value) for s in families["DCGM_FI_DEV_FB_FREE"].samples] == [("0", 70.0)]
    assert "DCGM_FI_DEV_GPU_UTIL" not in families or not families["DCGM_FI_DEV_GPU_UTIL"].samples
    assert "DCGM_FI_DEV_PCIE_REPLAY_COUNTER" not in families or not families["DCGM_FI_DEV_PCIE_REPLAY_COUNTER"].samples
    empty = CollectorRegistry()
    empty.register(GpuCollector(lambda: None, dict, "node-a"))  # before the first sample: no GPU series
    assert not any(f.samples for f in text_string_to_metric_families(generate_latest(empty).decode()))


def test_the_ib_ports_are_served_under_node_exporter_s_infiniband_names():
    port = IbPort(device="mlx5_0", port=1, state="ACTIVE", phys_state="LinkUp", rate_gbps=400.0, link_layer="InfiniBand",
                  link_downed=3, symbol_error=17)
    down = IbPort(device="mlx5_1", port=1, state="DOWN", phys_state="Polling")
    sample = NodeSampled(source="node-sampler", node_id="n1", interval_s=5, host=HostSample(ib_ports=(port, down)))
    registry = CollectorRegistry()
    registry.register(IbCollector(lambda: sample))
    families = {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}

    def served(name: str) -> list[tuple[str, str, float]]:
        return [(s.labels["device"], s.labels["port"], s.value) for s in families[name].samples]

    assert served("node_infiniband_state_id") == [("mlx5_0", "1", 4.0), ("mlx5_1", "1", 1.0)]
    assert served("node_infiniband_physical_state_id") == [("mlx5_0", "1", 5.0), ("mlx5_1", "1", 2.0)]
    assert served("node_infiniband_rate_bytes_per_second") == [("mlx5_0", "1", 5e10)]  # 400 Gb/s; none for a port with no rate
    assert served("node_infiniband_link_downed_total") == [("mlx5_0", "1", 3.0)]
    assert served("node_infiniband_symbol_error_total") == [("mlx5_0", "1", 17.0)]
    empty = CollectorRegistry()
    empty.register(IbCollector(lambda: None))
    assert not any(f.samples for f in text_string_to_metric_families(generate_latest(empty).decode()))


def test_the_shipped_dashboards_gpu_panels_ask_only_for_series_node_sampler_serves():
    dashboard = json.loads((Path(__file__).parents[2] / "deploy" / "grafana" / "gpumedic.json").read_text())
    asked = {name for p in dashboard["panels"] for t in p["targets"] for name in re.findall(r"\bDCGM_\w+", t["expr"])}
    assert asked and asked <= {s.name for s in (*SERIES, XID)}, asked
