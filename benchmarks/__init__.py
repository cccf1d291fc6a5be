"""gpumedic's benchmarks. Each compares side by side in one run and prints ratios: these
machines are shared and noisy, so absolute rates mean little, ratios of interleaved rounds more."""

from gpumedic_events import GpuProcess, GpuSample, JobsObservation, NodeSampled


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def node_sample(node_id: str, *, gpus: int = 8, zombie: bool = False, **fields) -> NodeSampled:
    """One node's sample as the benchmarks replay it: every GPU busy with one training rank and its
    output growing; with `zombie`, GPU 0 held at 0 % and no output growing. `fields` set the
    event's own (an id, a time)."""
    samples = tuple(
        GpuSample(
            index=g, uuid=f"GPU-{node_id}-{g}", name="NVIDIA H100 80GB HBM3",
            utilization_gpu_pct=0 if zombie and g == 0 else 87, utilization_memory_pct=41,
            memory_used_mib=40960, memory_total_mib=81559,
            processes=(GpuProcess(pid=10_000 + g, start_ticks=123_456, command=f"python train.py --rank {g}", used_memory_mib=40_900),),
        )
        for g in range(gpus)
    )
    jobs = JobsObservation(running=gpus, output_growing=not zombie)
    return NodeSampled(source="node-sampler", node_id=node_id, interval_s=5, gpus=samples, jobs=jobs, **fields)
