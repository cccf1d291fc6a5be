"""`make bench` / `python -m benchmarks`: run every benchmark and print its figures."""

from __future__ import annotations

import asyncio
import sys

from benchmarks import (
    console_pages,
    demand_curve,
    detection_latency,
    fleet_scale,
    incident_to_fix,
    preflight,
    probe_round,
    sample_path,
    sampler_cost,
)


def main() -> int:
    asyncio.run(sample_path.main(sys.argv[1:]))
    print()
    sampler_cost.main(sys.argv[1:])
    print()
    asyncio.run(detection_latency.main(sys.argv[1:]))
    print()
    asyncio.run(fleet_scale.main(sys.argv[1:]))
    print()
    asyncio.run(incident_to_fix.main(sys.argv[1:]))
    print()
    asyncio.run(preflight.main(sys.argv[1:]))
    print()
    asyncio.run(probe_round.main(sys.argv[1:]))
    print()
    demand_curve.main(sys.argv[1:])
    print()
    asyncio.run(console_pages.main(sys.argv[1:]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
