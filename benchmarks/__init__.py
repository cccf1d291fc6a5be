"""gpumedic's benchmarks. Each compares side by side in one run and prints ratios: these
machines are shared and noisy, so absolute rates mean little, ratios of interleaved rounds more."""
