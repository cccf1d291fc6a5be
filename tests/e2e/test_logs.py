"""`gpumedic logs` end to end, as runbook 001's fetch_worker_logs: the CLI asks over the real bus
as the `operator` user, the remediator reads the log the policy names over real SSH on a simulated
node, and the person needs no key of their own; a log the policy does not name is read nowhere."""

from __future__ import annotations

from gpumedic_incidents.policy import LogFile, LogsPolicy, Policy, dump_policy
from gpumedic_sim.machine.node import WORKER_LOG
from remediator.logs import read_command
from remediator.main import create_app as remediator_app
from tests.e2e.test_operator import _cli
from tests.e2e.test_thin_path import remediator_settings


async def test_a_workers_log_is_read_for_a_person_only_where_the_policy_names_it(nats_settings, store_url, fleet, apps, monkeypatch, capsys, tmp_path):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    policy = Policy(logs=LogsPolicy(files={"worker": LogFile(path=str(WORKER_LOG)), "p2p": LogFile(path="/var/log/p2p.log", nodes=("sim-node-02",))}))
    dump_policy(policy, tmp_path / "policy.yaml")
    base = remediator_settings(nats_settings, store_url, fleet)
    await apps.start(remediator_app(type(base)(**{**base.model_dump(exclude={"policy"}), "policy": {"file": tmp_path / "policy.yaml"}})))
    node = fleet.node("sim-node-01")
    with node.worker_log.open("a") as f:
        f.write("INFO claimed task 17\nERROR Authentication failed for worker gpu-3 token=abcdef1234567890\n\x1b[31mERROR SSH connection failed\x1b[0m\n")

    code, out, err = await _cli(capsys, "logs", "sim-node-01", "worker", "--lines", "3")
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "INFO claimed task 17" and "Authentication failed" in lines[1] and "abcdef1234567890" not in out
    assert lines[2] == " [31mERROR SSH connection failed [0m"  # a terminal's escapes cannot reach the person's terminal
    assert "\x1b" not in out and f"sim-node-01:{WORKER_LOG}, its last 3 line(s)" in err
    assert read_command(str(WORKER_LOG)) in node.ssh_commands

    code, _, err = await _cli(capsys, "logs", "sim-node-01", "secrets")
    assert code == 2 and "no log secrets in the policy's logs.files (it names: p2p, worker)" in err
    code, _, err = await _cli(capsys, "logs", "sim-node-01", "p2p")
    assert code == 2 and "logs.files.p2p is not for sim-node-01" in err
    code, _, err = await _cli(capsys, "logs", "sim-node-09", "worker")
    assert code == 2 and "unknown node 'sim-node-09'" in err
    code, _, err = await _cli(capsys, "logs", "sim-node-01", "../etc/shadow")
    assert code == 2 and "log" in err
    assert not any("shadow" in c or "p2p.log" in c for n in fleet.nodes.values() for c in n.ssh_commands)
