"""Every built-in scenario, run whole through the embedded stack against what its own file expects
(`expect:`): `gpumedic sim` exits 1 when a run falls short. demand's ten-minute day is left to
test_demand_run's shorter curves, which check the same pool."""

from __future__ import annotations

import sqlite3

import pytest

from gpumedic_sim.runs.scenario import builtin_scenarios, load_scenario
from gpumedic_sim.runs.simulate import run_simulation

SCENARIOS = sorted(set(builtin_scenarios()) - {"demand"})
FLEETS = {"rollout": (40, 1), "faults": (27, 8), "jobs": (40, 8)}
"""Nodes and GPUs a scenario's file says it runs on, where not 22 of 8 (its rollout: 15 of 40 nodes;
faults: one fault a node for its node-wide ones; jobs: five jobs across 36 nodes and 4 beside them)."""


def test_every_built_in_scenario_says_what_its_run_must_reach():
    for name, path in builtin_scenarios().items():
        nodes, gpus = FLEETS.get(name, (22, 8))
        scenario = load_scenario(path, node_ids=[f"sim-node-{i:02d}" for i in range(1, nodes + 1)], gpus_per_node=gpus)
        assert scenario.expect is not None, name


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", SCENARIOS)
async def test_a_built_in_scenario_meets_its_own_expectations(name, tmp_path):
    lines: list[str] = []
    path = builtin_scenarios()[name]
    nodes, gpus = FLEETS.get(name, (22, 8))
    code = await run_simulation(
        tmp_path / "var", nodes=nodes, gpus=gpus, interval_s=5.0, say=lines.append,
        scenario=lambda ids, gpus: load_scenario(path, node_ids=ids, gpus_per_node=gpus),
    )
    assert code == 0, "\n".join(lines)
    assert any(line.startswith("expectations: met") for line in lines), "\n".join(lines)
    if name == "jobs":  # each hung job's ladder ran whole over SSH: its node drained, its ranks stopped, the job restarted
        with sqlite3.connect(tmp_path / "var" / "gpumedic.db") as db:
            hung = [row[0] for row in db.execute("SELECT id FROM incidents WHERE kind = 'job_hung'")]
            ladders = {incident: [f"{op}:{status}" for op, status in db.execute(
                "SELECT json_extract(operation, '$.operation'), status FROM actions WHERE incident_id = ? ORDER BY started_at",
                (incident,))] for incident in hung}
        assert len(hung) == 4 and all(
            steps[:3] == ["drain_node:succeeded", "stop_job:succeeded", "restart_job:succeeded"] for steps in ladders.values()
        ), ladders
