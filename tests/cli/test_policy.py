"""`gpumedic policy`: check a policy file before a service refuses to start on it; show the one in force."""

from __future__ import annotations

import yaml

from gpumedic.cli import main
from gpumedic_incidents import load_policy
from gpumedic_incidents.policy import DEFAULT_POLICY


def test_check_accepts_the_shipped_policy_and_names_file_line_and_field_of_a_bad_one(tmp_path, capsys):
    assert main(["policy", "check", str(DEFAULT_POLICY)]) == 0
    out = capsys.readouterr().out
    assert "valid; 17 kinds act on their own; 8 more once you set no_leader: actions.http_admin.endpoints.force_election, phantom_jobs: actions.http_admin.endpoints.reset_job_count, " in out
    assert "capacity_short: actions.spawn_worker.gpu_types, orphaned_tasks: actions.requeue_tasks.statement" in out
    assert "peer_blocked: kinds.peer_blocked.daemon_unit, peer_down: kinds.peer_down.daemon_unit" in out
    bad = tmp_path / "policy.yaml"
    bad.write_text("version: 1\nkinds:\n  zombie_job:\n    idle_for_s: -3\n")
    assert main(["policy", "check", str(bad)]) == 2
    assert f"{bad}:4: kinds.zombie_job.idle_for_s: Input should be greater than 0" in capsys.readouterr().err
    assert main(["policy", "check", str(tmp_path / "missing.yaml")]) == 2
    assert "cannot be read" in capsys.readouterr().err
    assert main(["policy", "check"]) == 2


def test_show_prints_the_policy_in_force_as_a_file_that_loads_back(tmp_path, monkeypatch, capsys):
    mine = tmp_path / "mine.yaml"
    mine.write_text(DEFAULT_POLICY.read_text().replace("idle_for_s: 600", "idle_for_s: 900"))
    monkeypatch.setenv("GPUMEDIC_POLICY_FILE", str(mine))
    assert main(["policy", "show"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"# in force: {mine}")
    shown = tmp_path / "shown.yaml"
    shown.write_text(out)
    assert load_policy(shown) == load_policy(mine) and yaml.safe_load(out)["kinds"]["zombie_job"]["idle_for_s"] == 900
