"""`make bench` / `python -m benchmarks`: run every benchmark and print its figures."""

from __future__ import annotations

import asyncio
import inspect
import sys

from benchmarks import (
    console_pages,
    demand_curve,
    detection_latency,
    fleet_scale,
    incident_to_fix,
    node_history,
    overload,
    preflight,
    probe_round,
    sample_path,
    sampler_cost,
)

ALL = (sample_path, sampler_cost, detection_latency, fleet_scale, overload, incident_to_fix, preflight, probe_round, demand_curve, console_pages, node_history)
"""In the order they run; each has `main(argv)`, a coroutine or not, taking the options it knows."""


def run(benchmark, argv: list[str]) -> None:
    ran = benchmark.main(argv)
    if inspect.iscoroutine(ran):
        asyncio.run(ran)


def main() -> int:
    for i, benchmark in enumerate(ALL):
        if i:
            print()
        run(benchmark, sys.argv[1:])
    return 0


if __name__ == "__main__":
    sys.exit(main())
