"""gpumedic's benchmarks. Each compares side by side in one run and prints ratios: these
machines are shared and noisy, so absolute rates mean little, ratios of interleaved rounds more."""


def percentile(values: list[float], q: float) -> float:
    """The `q` quantile (0..1) of `values`, nearest rank."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]
