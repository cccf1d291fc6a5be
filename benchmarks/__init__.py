"""gpumedic's benchmarks. Each compares side by side in one run and prints ratios: these
machines are shared and noisy, so absolute rates mean little, ratios of interleaved rounds more."""

import statistics
import time

from gpumedic_events import GpuHealth, GpuProcess, GpuSample, JobsObservation, NodeSampled

HEALTH_EVERY = 120
"""A node's samples per health figures sent in steady state: unchanged figures go out every
health_refresh_s (600 s) at a 5 s sample interval (a change sends them at the next 30 s read)."""
H100_HEALTH = GpuHealth(
    sm_clock_max_mhz=1980, memory_clock_mhz=2619, memory_clock_max_mhz=2619, temperature_slowdown_c=89,
    temperature_shutdown_c=95, temperature_max_operating_c=87, memory_temperature_max_c=95, pcie_link_gen=5,
    pcie_link_gen_max=5, pcie_link_width=16, pcie_link_width_max=16, pcie_replay_count=0, ecc_corrected_aggregate=0,
    ecc_uncorrected_aggregate=0, remapped_rows_corrected=0, remapped_rows_uncorrected=0, nvlink_count=18,
)
"""What a healthy H100's health read says (its 18 NVLinks up and quiet: only counted)."""


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def time_pages(base_url: str, pages: dict[str, str], runs: int) -> dict[str, list[float]]:
    """Milliseconds each page took, `runs` times each, in turns, after one warm-up round in which
    every page must answer."""
    import httpx  # here, not above: the sampler's benchmark measures what its process imports

    took: dict[str, list[float]] = {name: [] for name in pages}
    async with httpx.AsyncClient(base_url=base_url, timeout=60) as client:
        for path in pages.values():
            (await client.get(path)).raise_for_status()
        for _ in range(runs):
            for name, path in pages.items():
                started = time.perf_counter()
                (await client.get(path)).raise_for_status()
                took[name].append((time.perf_counter() - started) * 1000)
    return took


def print_pages(took: dict[str, list[float]], *, target_ms: float, floor: str = "floor (/healthz)") -> None:
    """p50 and p95 of each page, and its p50 over the floor's (the same server doing no work)."""
    base = statistics.median(took[floor])
    print(f"  {'page':<34} {'p50 ms':>8} {'p95 ms':>8} {'x floor':>8}")
    for name, values in took.items():
        p50, p95 = statistics.median(values), percentile(values, 0.95)
        mark = "" if name == floor or p95 < target_ms else f"  (above the {target_ms:.0f} ms target)"
        print(f"  {name:<34} {p50:8.1f} {p95:8.1f} {p50 / base:8.1f}{mark}")


def node_sample(node_id: str, *, gpus: int = 8, zombie: bool = False, health: bool = False, **fields) -> NodeSampled:
    """One node's sample as the benchmarks replay it, with every field the sampler sends: every GPU
    busy with one training rank at its power limit (SW power cap) and its output growing; with
    `zombie`, GPU 0 held at 0 % and no output growing; with `health`, each GPU's health figures
    (one sample in HEALTH_EVERY carries them). `fields` set the event's own (an id, a time)."""
    samples = tuple(
        GpuSample(
            index=g, uuid=f"GPU-{node_id}-{g}", name="NVIDIA H100 80GB HBM3",
            utilization_gpu_pct=0 if zombie and g == 0 else 87, utilization_memory_pct=41,
            memory_used_mib=40960, memory_total_mib=81559,
            processes=(GpuProcess(pid=10_000 + g, start_ticks=123_456, command=f"python train.py --rank {g}", used_memory_mib=40_900),),
            temperature_c=61, power_w=612.3, power_limit_w=700.0, ecc_uncorrected_volatile=0, ecc_corrected_volatile=0,
            remapped_rows_pending=False, remapped_rows_failed=False, sm_clock_mhz=345 if zombie and g == 0 else 1755,
            clock_event_reasons=1 if zombie and g == 0 else 4, memory_temperature_c=52,
            health=H100_HEALTH if health else None,
        )
        for g in range(gpus)
    )
    jobs = JobsObservation(running=gpus, output_growing=not zombie)
    return NodeSampled(source="node-sampler", node_id=node_id, interval_s=5, gpus=samples, jobs=jobs, **fields)
