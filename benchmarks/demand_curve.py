"""The autoscaler on a day's demand curve (a burst, a quiet night, a second burst), against a
fixed fleet of `max_active_gpus` workers on the same arrivals, side by side in one run.

Simulated time (`gpumedic_sim.fleet.pool`): the task queue, the simulated provider's workers (every 7th
spawn never comes up, two workers die with a task In Progress) and the autoscaler's real pool
logic, whose requests are carried out as the remediator does. Figures: queue wait p95, GPU-hours
billed, cost, idle GPU-hours, actions, reversals and flaps, requeues.
"""

from __future__ import annotations

import argparse

from autoscaler.scaling import ScalingPolicy
from gpumedic_sim.fleet.pool import DAY, run_curve

KNOBS = ScalingPolicy(
    min_active_gpus=1, max_active_gpus=32, tasks_per_gpu=3, idle_timeout_s=600, cooldown_s=300, gpu_type="H100", gpus_per_worker=1,
)


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--curve-seed", type=int, default=7)
    args, _ = parser.parse_known_args(argv)
    phases = ", ".join(f"{p.hours:g}h at {p.tasks_per_h:g}/h" for p in DAY)
    print(f"demand curve ({phases}; 10-minute tasks, one per GPU): the autoscaler (MIN {KNOBS.min_active_gpus}, "
          f"MAX {KNOBS.max_active_gpus}, {KNOBS.tasks_per_gpu:g} tasks/GPU, idle {KNOBS.idle_timeout_s:g}s, cool-down "
          f"{KNOBS.cooldown_s:g}s) against a fixed fleet of MAX workers")
    scaled = run_curve(KNOBS, seed=args.curve_seed)
    fixed = run_curve(KNOBS, fixed=True, seed=args.curve_seed)
    rows = [
        ("tasks done / arrived", f"{scaled.done}/{scaled.tasks}", f"{fixed.done}/{fixed.tasks}"),
        ("queue wait p95 (min)", scaled.wait_p95_min, fixed.wait_p95_min),
        ("GPU-hours billed", scaled.gpu_hours, fixed.gpu_hours),
        ("cost ($)", scaled.cost, fixed.cost),
        ("idle GPU-hours", scaled.idle_gpu_hours, fixed.idle_gpu_hours),
        ("peak GPUs billed", scaled.peak_gpus, fixed.peak_gpus),
        ("scale reversals (flaps)", f"{scaled.reversals} ({scaled.flaps})", "-"),
        ("workers replaced (stuck, silent)", scaled.workers_replaced, "-"),
        ("tasks requeued (twice)", f"{scaled.requeued} ({scaled.requeued_twice})", "-"),
    ]
    print(f"  {'':34} {'autoscaled':>12} {'fixed MAX':>12}")
    for name, a, b in rows:
        print(f"  {name:34} {a!s:>12} {b!s:>12}")
    print(f"  actions: {', '.join(f'{k} {v}' for k, v in sorted(scaled.actions.items()))}")
    print(f"  cost ratio autoscaled/fixed: {scaled.cost / fixed.cost:.2f}; GPU-hours ratio: {scaled.gpu_hours / fixed.gpu_hours:.2f}")
