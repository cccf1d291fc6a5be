"""`gpumedic sim` with a worker pool, the whole stack on the bus: the autoscaler reads a real
SQLite task database and the simulated provider over RunPod's API, the remediator rents, ends and
requeues through its gate, and the workers are simulated nodes whose real node-sampler feeds the
detectors. A short demand curve (a burst, quiet, a second burst) with a worker that never comes up
and one that dies with tasks In Progress: every check of the pool's done-when must pass."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gpumedic_sim.scenario import Scenario
from gpumedic_sim.workers import PoolFigures, PoolPlan, judge
from gpumedic_sim.simulate import run_simulation

PLAN = PoolPlan.model_validate({
    "demand": [{"for": "15s", "tasks_per_min": 80}, {"for": "25s", "tasks_per_min": 0}, {"for": "10s", "tasks_per_min": 40},
               # a long quiet end: on a loaded machine the queue may empty late, and scaling down
               # needs the idle timeout and the cool-down after that
               {"for": "90s", "tasks_per_min": 0}],
    "task": "6s", "spawn": "2s", "never_ssh_every": 3, "workers_die_at": ["12s"],
    "scaling": {"min_active_gpus": 2, "max_active_gpus": 8, "tasks_per_gpu": 2, "idle_timeout_s": 3, "cooldown_s": 8, "gpus_per_worker": 2},
})


# Slow: in the full suite (6 workers on 2 cores) its scale-down check failed 3 runs in 6: the
# autoscaler saw new workers late and opened no surplus within 80 s of idleness; alone it passes.
@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_the_pool_scales_with_the_curve_replaces_bad_workers_and_requeues_orphans_once(tmp_path):
    lines: list[str] = []
    plan = Scenario(name="demand-short", description="", duration_s=190, faults=(), pool=PLAN)
    code = await run_simulation(tmp_path / "var", nodes=12, gpus=1, scenario=lambda ids, gpus: plan, interval_s=1.0,
                                json_path=tmp_path / "score.json", say=lines.append)
    assert code == 0, "\n".join(lines)
    pool = json.loads((tmp_path / "score.json").read_text())["pool"]
    failed = [c["check"] for c in pool["checks"] if not c["ok"]]
    decisions = (tmp_path / "var" / "logs" / "autoscaler.log").read_text().splitlines()[-40:]
    assert not failed, "\n".join([*lines, "", "the autoscaler's last log lines:", *decisions])
    assert pool["never_came_up"] and pool["died"] and pool["orphaned"] >= 1, "\n".join(lines)


def _figures(**update) -> PoolFigures:
    base = dict(tasks=4, done=4, wait_p95_s=1.0, gpu_s=10, fixed_gpu_s=20, idle_gpu_s=1, cost=0.1, peak_gpus_billed=2,
                rented=["simw0001", "simw0002"], never_came_up=[], never_came_up_ended=0, died=[], died_ended=0,
                ended_busy=[], orphaned=0, requeued={})
    return PoolFigures(**base | update)


def test_an_orphaned_task_is_explained_by_a_death_or_a_scale_down_that_raced_a_task_and_nothing_else():
    incident = SimpleNamespace(kind="orphaned_tasks", node_id="simw0002")
    unexplained = "1 incident(s) on the pool that no fault explains: orphaned_tasks on simw0002"
    checks = dict((what, ok) for ok, what in judge(_figures(), PLAN, [incident], []))
    assert checks[unexplained] is False
    raced = _figures(ended_busy=["simw0002"], orphaned=1, requeued={"task0003": 1})
    lines = [what for _, what in judge(raced, PLAN, [incident], [])]
    assert unexplained not in lines and "0 incident(s) on the pool that no fault explains" in lines
    assert "1 task(s) orphaned, 1 requeued, 0 more than once (simw0002 took a task just before a scale-down ended it)" in lines
