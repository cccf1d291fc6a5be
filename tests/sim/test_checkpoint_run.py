"""The checkpoint step through the whole stack: the operator's policy (a scenario's `policy:`)
asks gpu_xid's jobs to checkpoint before the drain; the detector finds the XIDs from the
simulated NVML, the remediator asks each node's jobs over real SSH, and the ledger (what the
incident's timeline shows) says what each job did before its node was drained."""

from __future__ import annotations

import re
import sqlite3

import pytest

from gpumedic_sim.runs.scenario import parse_scenario
from gpumedic_sim.runs.simulate import run_simulation

SCENARIO = {
    "name": "checkpoint",
    "duration_s": 60,
    "policy": {"kinds": {"gpu_xid": {"checkpoint": {"how": "signal", "signal": "USR1", "wait_s": 8, "poll_s": 0.5}}}},
    "faults": [
        {"at": "1s", "fault": "jobs_save_on_request", "node": 1},
        {"at": "1s", "fault": "jobs_ignore_requests", "node": 2},
        {"at": "6s", "fault": "xid", "node": 1, "gpu": 0, "xid": 48},
        {"at": "6s", "fault": "xid", "node": 2, "gpu": 0, "xid": 48},
    ],
    "expect": {"recall": 1.0, "precision": 1.0},
}


@pytest.mark.slow
@pytest.mark.timeout(300)
async def test_a_job_that_saves_is_waited_for_and_one_that_ignores_the_request_only_costs_the_deadline(tmp_path):
    lines: list[str] = []
    code = await run_simulation(
        tmp_path / "var", nodes=6, gpus=2, interval_s=1.0, json_path=tmp_path / "score.json", say=lines.append,
        scenario=lambda ids, gpus: parse_scenario(SCENARIO, source="test", node_ids=ids, gpus_per_node=gpus),
    )
    assert code == 0, "\n".join(lines)
    with sqlite3.connect(tmp_path / "var" / "gpumedic.db") as db:
        drains = dict(db.execute("SELECT node_id, detail FROM actions WHERE json_extract(operation, '$.operation') = 'drain_node'"))
        timeline = [row[0] for row in db.execute("SELECT summary FROM incident_timeline WHERE event_type = 'ActionCompleted'")]
    saved, ignored = drains.get("sim-node-01", ""), drains.get("sim-node-02", "")
    assert re.fullmatch(r"asked pid\(s\) \d+, \d+ to checkpoint \(SIGUSR1\): done after [3-7]s; then drained sim-node-01", saved), drains
    assert re.fullmatch(r"asked pid\(s\) (\d+), (\d+) to checkpoint \(SIGUSR1\): pid\(s\) \1, \2 not done after 8s, so the action "
                        r"went ahead; then drained sim-node-02", ignored), drains
    # report-builder's timeline of each incident carries the same answer
    assert any(saved in summary for summary in timeline) and any(ignored in summary for summary in timeline), timeline
