"""`gpumedic sim` run as a user runs it: faults from a scenario file and from --fault reach the
services through the real interfaces, and the score says which opened the incident they should,
and that benign behaviour opened none."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from gpumedic.stack import nvml_problem
from tests.e2e.test_demo import _processes_mentioning

GPUMEDIC = Path(sys.executable).parent / "gpumedic"
CLEAN_ENV = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}


@pytest.mark.long
def test_a_scenario_is_injected_seen_and_scored(tmp_path):
    scenario = tmp_path / "two.yaml"
    scenario.write_text(
        "name: two-faults\n"
        "faults:\n"
        "  - {at: 2s, fault: zombie_job, node: 2, gpu: 1}\n"
        "  - {at: 3s, fault: oom_kill, node: 3, gpu: 0}\n"
    )
    var = tmp_path / "var"
    score_file = tmp_path / "score.json"
    result = subprocess.run(
        [
            str(GPUMEDIC), "sim", "--nodes", "4", "--gpus", "2", "--interval", "1", "--duration", "30",
            "--scenario", str(scenario), "--fault", "fault=xid,at=4s,node=4,gpu=1,xid=79",
            "--fault", "fault=job_finished,at=2s,node=1,gpu=0", "--fault", "fault=short_dip,at=3s,node=1,gpu=1,for=2s",
            "--var", str(var), "--json", str(score_file),
        ],
        capture_output=True, text=True, timeout=150, env=CLEAN_ENV,
    )
    out = result.stdout
    assert result.returncode == 0, out + result.stderr
    for line in ("injected zombie_job on sim-node-02 GPU 1", "injected oom_kill on sim-node-03 GPU 0",
                 "injected xid on sim-node-04 GPU 1"):
        assert line in out, line
    score = json.loads(score_file.read_text())
    kinds = {row["kind"]: row for row in score["kinds"]}
    # Each fault opened an incident of the kind that describes it; the benign behaviour none.
    assert kinds["zombie_job"]["detected"] == 1
    assert kinds["oom_kill"]["detected"] == 1 and kinds["oom_kill"]["expect"] == ["container_died"]
    assert kinds["xid"]["detected"] == 1 and kinds["xid"]["expect"] == ["gpu_lost"]
    assert kinds["job_finished"]["false_positives"] == kinds["short_dip"]["false_positives"] == 0
    assert score["totals"]["precision"] == 1.0 and score["totals"]["recall"] == 1.0, score["false_positives"]
    assert isinstance(score["ticks_skipped"], int)  # the fleet's samplers' missed ticks, said beside the score past 1 %
    if nvml_problem():  # this machine has no GPU: it is no node of the simulated fleet, and the run says so
        assert "not this machine's node-sampler: it has no usable NVIDIA driver" in out
    # The zombie killed and its job started again (the sim's policy restarts it), and the node
    # whose GPU fell off the bus drained.
    actions = next((line for line in out.splitlines() if line.startswith("actions: ")), "")
    assert "recall 100%" in out and actions == "actions: 3 requested (3 succeeded)", actions
    # How each incident ended: the zombie fixed and verified; the rest, which no action fixes, escalated
    # (the lost GPU's node drained first) and paged to the simulated on-call webhook.
    outcomes = score["outcomes"]
    assert outcomes["zombie_job"]["fixed"] == 1
    assert outcomes["container_died"]["escalated"] == outcomes["container_died"]["paged"] == 1
    assert outcomes["gpu_lost"]["escalated"] == outcomes["gpu_lost"]["paged"] == 1
    assert score["unpaged"] == 0 and "escalation(s) reached the on-call webhook" in out
    assert "stopped; no process left behind" in out
    assert _processes_mentioning(str(var)) == []
    # the samplers' own log lines went to a file, not over the run's output
    assert "OOM killer ended pid" in (var / "logs" / "fleet.log").read_text()
    assert "OOM killer ended pid" not in out + result.stderr


def test_a_bad_scenario_is_refused_before_anything_starts(tmp_path):
    scenario = tmp_path / "bad.yaml"
    scenario.write_text("faults:\n  - {at: 2s, fault: zombie_job, node: 2, gpu: 9}\n")
    result = subprocess.run(
        [str(GPUMEDIC), "sim", "--nodes", "4", "--gpus", "2", "--scenario", str(scenario), "--var", str(tmp_path / "var")],
        capture_output=True, text=True, timeout=60, env=CLEAN_ENV,
    )
    assert result.returncode == 2
    assert "bad.yaml: faults[0].gpu: 9 is beyond the fleet's 2 GPUs per node (0-1)" in result.stderr
    assert not (tmp_path / "var").exists()
