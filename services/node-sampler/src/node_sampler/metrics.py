"""Per-GPU series on node-sampler's `/metrics`, under dcgm-exporter's names and labels.

Grafana's GPU dashboards read dcgm-exporter's series (`DCGM_FI_DEV_GPU_UTIL{gpu, UUID, modelName,
Hostname}` ...); serving the same names from the sample the sampler already takes makes those
dashboards work on a node without DCGM, at no second NVML pass. Only what the sample measures is
served: a field NVML did not give (None) has no series, rather than a made-up zero. Names and
help follow dcgm-exporter's `etc/default-counters.csv` (the ECC totals are among its optional
counters there). The slowly changing figures (memory clock, PCIe replays, lifetime ECC, remapped
rows) come from the GPU's last health read, which the sampler keeps between its health samples. Every series is typed gauge: dcgm-exporter calls the ECC totals counters, but the
Prometheus client library writes a counter's HELP and TYPE under `<name>_total`, which would no
longer name dcgm-exporter's samples; the values and the queries over them (`increase`, `rate`)
are the same.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from prometheus_client.core import Metric
from prometheus_client.registry import Collector

from gpumedic_events import GpuHealth, GpuSample, IbPort, NodeSampled

LABELS = ("gpu", "UUID", "modelName", "Hostname")
Value = float | int | bool | None


@dataclass(frozen=True)
class Series:
    name: str
    help: str
    read: Callable[[GpuSample], Value] | None = None
    """From the latest sample; else `health` reads the GPU's last health figures."""
    health: Callable[[GpuHealth], Value] | None = None


def _free(gpu: GpuSample) -> int | None:
    if gpu.memory_total_mib is None or gpu.memory_used_mib is None:
        return None
    return max(0, gpu.memory_total_mib - gpu.memory_used_mib)


def _nvlink_total(counter: str) -> Callable[[GpuHealth], Value]:
    # a healthy link is left out of the health figures because its counters are 0: the sum holds
    def total(health: GpuHealth) -> Value:
        if health.nvlink_count is None:
            return None
        return sum(getattr(link, counter) or 0 for link in health.nvlinks)

    return total


SERIES: tuple[Series, ...] = (
    Series("DCGM_FI_DEV_SM_CLOCK", "SM clock frequency (in MHz).", lambda g: g.sm_clock_mhz),
    Series("DCGM_FI_DEV_MEM_CLOCK", "Memory clock frequency (in MHz).", health=lambda h: h.memory_clock_mhz),
    Series("DCGM_FI_DEV_MEMORY_TEMP", "Memory temperature (in C).", lambda g: g.memory_temperature_c),
    Series("DCGM_FI_DEV_GPU_TEMP", "GPU temperature (in C).", lambda g: g.temperature_c),
    Series("DCGM_FI_DEV_POWER_USAGE", "Power draw (in W).", lambda g: g.power_w),
    Series("DCGM_FI_DEV_PCIE_REPLAY_COUNTER", "Total number of PCIe retries.", health=lambda h: h.pcie_replay_count),
    Series("DCGM_FI_DEV_GPU_UTIL", "GPU utilization (in %).", lambda g: g.utilization_gpu_pct),
    Series("DCGM_FI_DEV_MEM_COPY_UTIL", "Memory utilization (in %).", lambda g: g.utilization_memory_pct),
    Series("DCGM_FI_DEV_FB_FREE", "Framebuffer memory free (in MiB).", _free),
    Series("DCGM_FI_DEV_FB_USED", "Framebuffer memory used (in MiB).", lambda g: g.memory_used_mib),
    Series("DCGM_FI_DEV_ECC_SBE_VOL_TOTAL", "Total number of single-bit volatile ECC errors.", lambda g: g.ecc_corrected_volatile),
    Series("DCGM_FI_DEV_ECC_DBE_VOL_TOTAL", "Total number of double-bit volatile ECC errors.", lambda g: g.ecc_uncorrected_volatile),
    Series(
        "DCGM_FI_DEV_ECC_SBE_AGG_TOTAL",
        "Total number of single-bit persistent ECC errors.",
        health=lambda h: h.ecc_corrected_aggregate,
    ),
    Series(
        "DCGM_FI_DEV_ECC_DBE_AGG_TOTAL",
        "Total number of double-bit persistent ECC errors.",
        health=lambda h: h.ecc_uncorrected_aggregate,
    ),
    Series(
        "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL",
        "Total number of NVLink retries.",
        health=_nvlink_total("replay_errors"),
    ),
    Series(
        "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL",
        "Total number of NVLink recovery errors.",
        health=_nvlink_total("recovery_errors"),
    ),
    Series(
        "DCGM_FI_DEV_UNCORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for uncorrectable errors",
        health=lambda h: h.remapped_rows_uncorrected,
    ),
    Series(
        "DCGM_FI_DEV_CORRECTABLE_REMAPPED_ROWS",
        "Number of remapped rows for correctable errors",
        health=lambda h: h.remapped_rows_corrected,
    ),
    Series("DCGM_FI_DEV_ROW_REMAP_FAILURE", "Whether remapping of rows has failed", lambda g: g.remapped_rows_failed),
)
XID = Series("DCGM_FI_DEV_XID_ERRORS", "Value of the last XID error encountered.")


class GpuCollector(Collector):
    """Reads the sampler's latest sample, and each GPU's last health figures, at scrape time."""

    def __init__(
        self,
        latest: Callable[[], NodeSampled | None],
        last_xid: Callable[[], dict[int, int]],
        hostname: str,
        last_health: Callable[[], dict[int, GpuHealth]] = dict,
    ) -> None:
        self._latest, self._last_xid, self._hostname, self._last_health = latest, last_xid, hostname, last_health

    @classmethod
    def of(cls, sampler, hostname: str) -> GpuCollector:
        """A running `Sampler`'s series: its latest sample, XIDs and health at each scrape."""
        return cls(lambda: sampler.last, lambda: sampler.last_xid, hostname, lambda: sampler.last_health)

    def collect(self) -> Iterable[Metric]:
        sample = self._latest()
        gpus = [g for g in sample.gpus if not g.lost] if sample is not None else []
        healths = self._last_health()
        for series in SERIES:
            metric = Metric(series.name, series.help, "gauge")
            for gpu in gpus:
                if series.read is not None:
                    value = series.read(gpu)
                else:
                    health = healths.get(gpu.index)
                    value = series.health(health) if health is not None and series.health is not None else None
                if value is not None:
                    metric.add_sample(series.name, self._labels(gpu), float(value))
            yield metric
        xids = self._last_xid()
        metric = Metric(XID.name, XID.help, "gauge")
        for gpu in gpus:
            metric.add_sample(XID.name, self._labels(gpu), float(xids.get(gpu.index, 0)))
        yield metric

    def _labels(self, gpu: GpuSample) -> dict[str, str]:
        return {"gpu": str(gpu.index), "UUID": gpu.uuid, "modelName": gpu.name, "Hostname": self._hostname}


STATE_IDS = {"DOWN": 1, "INIT": 2, "ARMED": 3, "ACTIVE": 4, "ACTIVE_DEFER": 5}
PHYS_STATE_IDS = {"Sleep": 1, "Polling": 2, "Disabled": 3, "PortConfigurationTraining": 4, "LinkUp": 5, "LinkErrorRecovery": 6,
                  "Phy Test": 7}
"""The kernel's numbers for the names it prints ("4: ACTIVE"), as node_exporter serves them."""
IB_SERIES: tuple[tuple[str, str, Callable[[IbPort], Value]], ...] = (
    ("node_infiniband_state_id", "State of the InfiniBand port (1: down, 2: init, 3: armed, 4: active, 5: act defer)",
     lambda p: STATE_IDS.get(p.state or "")),
    ("node_infiniband_physical_state_id", "Physical state of the InfiniBand port (2: polling, 3: disable, 5: link up, ...)",
     lambda p: PHYS_STATE_IDS.get(p.phys_state or "")),
    ("node_infiniband_rate_bytes_per_second", "Maximum signal transfer rate", lambda p: None if p.rate_gbps is None else p.rate_gbps * 125_000_000),
    ("node_infiniband_link_downed_total", "Number of times the link failed to recover from an error state and went down",
     lambda p: p.link_downed),
    ("node_infiniband_link_error_recovery_total", "Number of times the link successfully recovered from an error state",
     lambda p: p.link_error_recovery),
    ("node_infiniband_symbol_error_total", "Number of minor link errors detected on one or more physical lanes", lambda p: p.symbol_error),
    ("node_infiniband_port_errors_received_total", "Number of packets containing an error that were received on this port",
     lambda p: p.port_rcv_errors),
    ("node_infiniband_local_link_integrity_errors_total", "Number of times that the count of local physical errors exceeded the threshold",
     lambda p: p.local_link_integrity_errors),
    ("node_infiniband_excessive_buffer_overrun_errors_total", "Number of times that OverrunErrors consecutive flow control update periods "
     "occurred, each having at least one overrun error", lambda p: p.excessive_buffer_overrun_errors),
    ("node_infiniband_port_discards_transmitted_total", "Number of outbound packets discarded by the port because the port is down or "
     "congested", lambda p: p.port_xmit_discards),
)
"""node_exporter's infiniband collector's names and labels (device, port), from the same sample: the
fabric dashboards built on node_exporter read them unchanged. Gauges, for the reason above."""


class IbCollector(Collector):
    """The latest sample's InfiniBand and RoCE ports at scrape time (none on a node without them)."""

    def __init__(self, latest: Callable[[], NodeSampled | None]) -> None:
        self._latest = latest

    def collect(self) -> Iterable[Metric]:
        sample = self._latest()
        ports = sample.host.ib_ports if sample is not None else ()
        for name, help_text, read in IB_SERIES:
            metric = Metric(name, help_text, "gauge")
            for port in ports:
                value = read(port)
                if value is not None:
                    metric.add_sample(name, {"device": port.device, "port": str(port.port)}, float(value))
            yield metric
