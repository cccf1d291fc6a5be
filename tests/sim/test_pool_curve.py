"""The autoscaler's pool on a demand curve in simulated time (`gpumedic_sim.fleet.pool`): it follows a
burst, a quiet spell and a second burst within the knobs, replaces stuck and dead workers,
requeues a dead worker's tasks exactly once, never flaps, and costs less than a fixed fleet."""

from __future__ import annotations

from autoscaler.scaling import ScalingPolicy
from gpumedic_sim.fleet.pool import Phase, run_curve

CURVE = (Phase(0.5, 10), Phase(1, 90), Phase(2, 4), Phase(1, 70), Phase(0.5, 4))
KNOBS = ScalingPolicy(min_active_gpus=1, max_active_gpus=12, tasks_per_gpu=3, idle_timeout_s=600, cooldown_s=300,
                      gpu_type="H100", gpus_per_worker=1)


def test_the_pool_follows_the_curve_within_the_knobs_and_fixes_its_workers():
    scaled = run_curve(KNOBS, curve=CURVE, never_ssh_every=5, die_at_h=(1.0, 4.0))
    fixed = run_curve(KNOBS, curve=CURVE, fixed=True)
    assert scaled.done == scaled.tasks == fixed.tasks  # every task done (a dead worker's too, once requeued)
    assert scaled.peak_in_service == KNOBS.max_active_gpus  # the burst reaches MAX and never passes it
    assert scaled.flaps == 0 and scaled.reversals >= 2  # up for each burst, down after each, never within the cool-down
    assert scaled.requeued >= 2 and scaled.requeued_twice == 0
    assert scaled.workers_replaced >= 3  # stuck spawns (every 5th) and the two dead workers
    assert scaled.actions["spawn_worker"] >= 2 and scaled.actions["terminate_worker"] >= 3
    assert scaled.cost < 0.7 * fixed.cost and scaled.idle_gpu_hours < fixed.idle_gpu_hours / 3
