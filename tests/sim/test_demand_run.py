"""`gpumedic sim` with a worker pool, the whole stack on the bus: the autoscaler reads a real
SQLite task database and the simulated provider over RunPod's API, the remediator rents, ends and
requeues through its gate, and the workers are simulated nodes whose real node-sampler feeds the
detectors. A short demand curve (a burst, quiet, a second burst) with a worker that never comes up
and one that dies with tasks In Progress: every check of the pool's done-when must pass."""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpumedic_sim.runs.scenario import Scenario
from gpumedic_sim.fleet.plan import PoolFigures, PoolPlan
from gpumedic_sim.runs.pool_judge import judge
from gpumedic_sim.runs.simulate import run_simulation

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


HOSTILE = PoolPlan.model_validate({
    "demand": [{"for": "30s", "tasks_per_min": 120}, {"for": "90s", "tasks_per_min": 0}],
    "task": "8s", "spawn": "2s", "machines": 3, "burn_in": True,
    "bad_machines": [{"machine": 1, "gpu": 0, "fault": "gpu_lost", "after": "8s"}, {"machine": 2, "gpu": 1, "fault": "pcie_narrow"}],
    "scaling": {"min_active_gpus": 2, "max_active_gpus": 8, "tasks_per_gpu": 1, "idle_timeout_s": 3, "cooldown_s": 8, "gpus_per_worker": 2},
})


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_machine_that_breaks_again_is_returned_and_a_worker_failing_burn_in_never_takes_a_task(tmp_path):
    """Three machines rented in turn: machine 1 loses a GPU a few seconds into every rental, machine
    2 has a GPU's PCIe link at half width. Every worker is on trial first (burn-in over SSH, promoted
    in the task database)."""
    lines: list[str] = []
    plan = Scenario(name="hostile-machines", description="", duration_s=150, faults=(), pool=HOSTILE)
    # a dozen nodes besides the pool: the breaker's share (half the inventory in the sim) must allow
    # the bad rentals' returns
    code = await run_simulation(tmp_path / "var", nodes=12, gpus=1, scenario=lambda ids, gpus: plan, interval_s=1.0,
                                json_path=tmp_path / "score.json", say=lines.append)
    assert code == 0, "\n".join(lines)
    pool = json.loads((tmp_path / "score.json").read_text())["pool"]
    machines = [c for c in pool["checks"] if c["check"].startswith("machine ")]
    assert len(machines) == 2 and all(c["ok"] for c in machines), "\n".join(lines)
    assert "rented 1 time" not in machines[0]["check"], "machine 1 must be rented again to be recognised: " + machines[0]["check"]
    assert sum(pool["took"].values()) >= 1 and all(pool["machines"][w] not in ("sim-host-002",) for w in pool["took"]), "\n".join(lines)


BLACK_HOLE = PoolPlan.model_validate({
    "demand": [{"for": "40s", "tasks_per_min": 150}, {"for": "60s", "tasks_per_min": 0}],
    "task": "3s", "spawn": "2s", "machines": 3, "bad_machines": [{"machine": 2, "fault": "fails_tasks"}],
    "scaling": {"min_active_gpus": 6, "max_active_gpus": 8, "tasks_per_gpu": 1, "idle_timeout_s": 3, "cooldown_s": 8, "gpus_per_worker": 2},
})


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_machine_that_fails_every_task_with_healthy_gpus_is_a_black_hole_and_ended(tmp_path):
    """Three machines rented in turn; every task a worker on machine 2 finishes fails, while its GPUs
    sample as healthy as the others'. Only the task database's outcomes show it."""
    lines: list[str] = []
    plan = Scenario(name="black-hole", description="", duration_s=130, faults=(), pool=BLACK_HOLE)
    await run_simulation(tmp_path / "var", nodes=12, gpus=1, scenario=lambda ids, gpus: plan, interval_s=1.0,
                         json_path=tmp_path / "score.json", say=lines.append)
    pool = json.loads((tmp_path / "score.json").read_text())["pool"]
    (machine,) = [c for c in pool["checks"] if c["check"].startswith("machine sim-host-002")]
    assert machine["ok"], "\n".join(lines)
    unexplained = [c for c in pool["checks"] if "no fault explains" in c["check"]]
    assert unexplained and unexplained[0]["ok"], "\n".join(lines)
    # every task on machine 2 failed, however many it took, and went back to the queue once it was ended
    assert sum(pool["failed_first_on"].values()) >= 10 and sum(pool["retried_from"].values()) >= 10, "\n".join(lines)


ROLLED_OUT = PoolPlan.model_validate({
    "demand": [{"for": "90s", "tasks_per_min": 150}, {"for": "40s", "tasks_per_min": 0}],
    "task": "3s", "spawn": "2s", "machines": 3, "rollout": {"at": "45s", "image": "acme/selfplay:8-bad", "fail_share": 0.6},
    "scaling": {"min_active_gpus": 6, "max_active_gpus": 8, "tasks_per_gpu": 1, "idle_timeout_s": 3, "cooldown_s": 8, "gpus_per_worker": 2},
})


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_bad_image_rolled_out_to_the_whole_pool_is_one_failure_jump_naming_it_and_no_worker_s_incident(tmp_path):
    """Every worker lists the new image from 45 s on and its tasks fail 60 % of the time: no worker
    stands out from the rest, so only the pool against its own earlier rate shows it."""
    lines: list[str] = []
    plan = Scenario(name="rollout-everywhere", description="", duration_s=140, faults=(), pool=ROLLED_OUT)
    await run_simulation(tmp_path / "var", nodes=12, gpus=1, scenario=lambda ids, gpus: plan, interval_s=1.0,
                         json_path=tmp_path / "score.json", say=lines.append)
    pool = json.loads((tmp_path / "score.json").read_text())["pool"]
    (rollout,) = [c for c in pool["checks"] if c["check"].startswith("image acme/selfplay:8-bad")]
    assert rollout["ok"], "\n".join(lines)
    unexplained = [c for c in pool["checks"] if "no fault explains" in c["check"]]
    assert unexplained and unexplained[0]["ok"], "\n".join(lines)  # no black hole, no other incident on the workers


def _figures(**update) -> PoolFigures:
    base = dict(tasks=4, done=4, failed=0, wait_p95_s=1.0, gpu_s=10, fixed_gpu_s=20, idle_gpu_s=1, cost=0.1, peak_gpus_billed=2,
                rented=["simw0001", "simw0002"], never_came_up=[], never_came_up_ended=0, died=[], died_ended=0,
                ended_busy=[], orphaned=0, requeued={})
    return PoolFigures(**base | update)


def test_an_orphaned_task_is_explained_by_a_worker_ended_busy_but_a_scale_in_that_ended_one_mid_task_fails():
    incident = SimpleNamespace(kind="orphaned_tasks", node_id="simw0002")
    unexplained = "1 incident(s) on the pool that no fault explains: orphaned_tasks on simw0002"
    checks = dict((what, ok) for ok, what in judge(_figures(), PLAN, [incident], []))
    assert checks[unexplained] is False and checks["0 worker(s) ended mid-task by a scale-in"] is True
    raced = _figures(ended_busy=["simw0002"], orphaned=1, requeued={"task0003": 1})
    checks = dict((what, ok) for ok, what in judge(raced, PLAN, [incident], []))
    assert unexplained not in checks and checks["0 incident(s) on the pool that no fault explains"] is True
    assert checks["1 task(s) orphaned, 1 requeued, 0 more than once"] is True
    assert checks["1 worker(s) ended mid-task by a scale-in: simw0002"] is False


BAD = PoolPlan.model_validate({
    **PLAN.model_dump(mode="json", by_alias=True), "machines": 3, "burn_in": True,
    "bad_machines": [{"machine": 1, "gpu": 0, "fault": "gpu_lost", "after": "20s"}, {"machine": 2, "gpu": 1, "fault": "pcie_narrow"}],
})


def _machine_lines(figures, incidents) -> dict[str, bool]:
    return {what: ok for ok, what in judge(figures, BAD, incidents, [], burn_in_within_s=60, interval_s=5)[-2:]}


def test_a_bad_machine_passes_when_found_by_its_second_rental_and_returned_after_and_fails_otherwise():
    start = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    rented = ["simw0001", "simw0002", "simw0004", "simw0005", "simw0006", "simw0007"]
    machines = {"simw0001": "sim-host-001", "simw0002": "sim-host-002", "simw0004": "sim-host-001", "simw0005": "sim-host-002",
                "simw0006": "sim-host-001", "simw0007": "sim-host-001"}
    figures = _figures(
        rented=rented, machines=machines, started_at=start, took={"simw0001": 3, "simw0004": 2, "simw0006": 1},
        rented_at={"simw0001": 0, "simw0002": 0, "simw0004": 25, "simw0005": 25, "simw0006": 26, "simw0007": 70},
        came_up={"simw0001": 1, "simw0002": 2, "simw0004": 30, "simw0005": 31, "simw0006": 31},
        ended_at={"simw0001": 60, "simw0002": 20, "simw0004": 60, "simw0005": 50, "simw0006": 61, "simw0007": 72},
    )

    def seen(kind, node, s):
        return SimpleNamespace(kind=kind, node_id=node, at=start + timedelta(seconds=s))

    incidents = [seen("repeat_offender", "simw0004", 50), seen("repeat_offender", "simw0006", 50), seen("repeat_offender", "simw0007", 70),
                 seen("burn_in_failed", "simw0002", 10), seen("burn_in_failed", "simw0005", 40)]
    lines = _machine_lines(figures, incidents)
    assert lines == {
        "machine sim-host-001 (GPU 0 falls off the bus 20s into each rental): rented 4 time(s); a repeat offender by its rental 2 "
        "(simw0004), 50s in; 1 rental(s) after that returned, 0 task(s) taken by them": True,
        "machine sim-host-002 (GPU 1's PCIe link at half width): 2 of its 2 rental(s) came up, 2 failed burn-in, 0 returned as a repeat "
        "offender's, 0 task(s) taken, ended 19s after coming up at the most (grace 75s)": True,
    }
    # Found only on a later rental, a rental after that which took a task, or a late ending: each fails its line.
    late = _machine_lines(figures, incidents[2:])
    assert list(late.values()) == [False, True] and "not a repeat offender by its second rental (of 4)" in next(iter(late))
    worked = _machine_lines(_figures(**{**figures.__dict__, "took": {"simw0007": 1}}), incidents)
    assert list(worked.values()) == [False, True]
    slow = _machine_lines(_figures(**{**figures.__dict__, "ended_at": {**figures.ended_at, "simw0005": 120}}), incidents)
    assert list(slow.values()) == [True, False]


def test_a_black_hole_passes_once_ended_with_every_task_that_failed_on_it_given_another_go():
    """The black hole's line: found, ended, and what failed there requeued (the remediator's
    failed_tasks_query and guarded failed_statement); a failed task left failed fails the line."""
    holes = BLACK_HOLE.model_copy(update={"bad_machines": (BLACK_HOLE.bad_machines[0],)})
    figures = _figures(rented=["simw0001", "simw0002"], machines={"simw0001": "sim-host-001", "simw0002": "sim-host-002"},
                       took={"simw0001": 20, "simw0002": 8}, ended_at={"simw0002": 40.0},
                       failed_first_on={"simw0001": 1, "simw0002": 8}, retried_from={"simw0002": 8})
    incident = SimpleNamespace(kind="black_hole", node_id="simw0002")

    def line(figures) -> tuple[bool, str]:
        (ok, what), = [(ok, what) for ok, what in judge(figures, holes, [incident], []) if what.startswith("machine ")]
        return ok, what

    assert line(figures) == (True, "machine sim-host-002 (every task fails, its GPUs fine): rented 1 time(s), 8 task(s) taken; a black "
                                   "hole on simw0002, 1 of them ended, 8 of the 8 task(s) that failed there given another go")
    assert line(_figures(**{**figures.__dict__, "retried_from": {"simw0002": 5}}))[0] is False


def test_a_rollout_to_the_whole_pool_passes_with_one_failure_jump_naming_the_image():
    def line(*incidents) -> tuple[bool, str]:
        (ok, what), = [(ok, what) for ok, what in judge(_figures(), ROLLED_OUT, list(incidents), []) if what.startswith("image ")]
        return ok, what

    named = SimpleNamespace(kind="failure_jump", node_id="workers", summary="... what changed: image acme/selfplay:8-bad on 4 of 4 workers")
    assert line(named) == (True, "image acme/selfplay:8-bad rolled out to the whole pool at 45s (tasks fail 60%): 1 failure_jump "
                                 "incident(s) on the pool, 1 naming the image")
    assert line()[0] is False and line(named, named)[0] is False
    assert line(SimpleNamespace(kind="failure_jump", node_id="workers", summary="nothing the provider lists changed"))[0] is False
    unexplained = "1 incident(s) on the pool that no fault explains: failure_jump on workers"
    assert (False, unexplained) in judge(_figures(), PLAN, [named], [])  # without a rollout it explains nothing


def test_a_bad_machine_must_be_one_of_the_providers_on_a_gpu_a_worker_has():
    with pytest.raises(ValueError, match="machine 4 is beyond the provider's 3 machine"):
        PoolPlan.model_validate({**BAD.model_dump(mode="json", by_alias=True), "bad_machines": [{"machine": 4, "fault": "gpu_lost"}]})
    with pytest.raises(ValueError, match="GPU 2 is beyond a worker's 2 GPU"):
        PoolPlan.model_validate({**BAD.model_dump(mode="json", by_alias=True), "bad_machines": [{"machine": 1, "gpu": 2, "fault": "gpu_lost"}]})


def test_the_cost_of_a_worker_billed_for_nothing_is_checked_against_its_rental_end_and_price():
    start = datetime(2026, 11, 26, 12, 0, tzinfo=UTC)
    figures = _figures(started_at=start, rented_at={"simw0003": 10.0, "simw0005": 50.0},
                       ended_at={"simw0005": 100.0})  # its bill stopped 10 s before the incident closed

    def costed(node, kind, closed_s, gpu_hours, usd):
        return SimpleNamespace(kind=kind, node_id=node, closed_at=start + timedelta(seconds=closed_s), gpu_hours=gpu_hours, usd=usd)

    right = [costed("simw0003", "burn_in_failed", 46, 0.02, 0.05), costed("simw0005", "stuck_spawning", 110, 0.0278, 0.07),
             costed("simw0005", "vanished_worker", 120, None, None)]  # no GPU time counted: not judged
    billed = [SimpleNamespace(kind="burn_in_failed", node_id="simw0003"), SimpleNamespace(kind="stuck_spawning", node_id="simw0005")]
    (ok, line), = [c for c in judge(figures, PLAN, billed, [], costs=right) if "billed for nothing" in c[1]]
    assert ok and line == "2 cost(s) of workers billed for nothing match their rental, end and the provider's $2.49/GPU-h"
    (ok, line), = [c for c in judge(figures, PLAN, billed, [], costs=[]) if "billed for nothing" in c[1]]
    assert not ok, "two workers billed for nothing and no cost for them: " + line
    (ok, line), = [c for c in judge(figures, PLAN, [], [], costs=[]) if "billed for nothing" in c[1]]
    assert ok and line.startswith("no worker was billed for nothing"), line
    wrong = [costed("simw0003", "burn_in_failed", 46, 0.01, 0.02),  # the hours before it opened left out
             costed("simw0005", "stuck_spawning", 110, 0.0333, 0.08)]  # billed on after the provider ended it
    (ok, line), = [c for c in judge(figures, PLAN, billed, [], costs=wrong) if "billed for nothing" in c[1]]
    assert not ok and "burn_in_failed on simw0003: 0.01 GPU-h $0.02, the arithmetic 0.0200 GPU-h $0.05" in line
    assert "stuck_spawning on simw0005: 0.0333 GPU-h $0.08, the arithmetic 0.0278 GPU-h $0.07" in line
    assert not [c for c in judge(figures, PLAN, [], []) if "billed for nothing" in c[1]], "not judged without the costs"
