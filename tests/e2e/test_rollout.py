"""`gpumedic rollout` end to end, as an operator runs it: the CLI asks over the real bus as the
`operator` user, the remediator service restarts the unit over real SSH on the simulated nodes,
batch by batch, and every action is in the audit log under the rollout's id."""

from __future__ import annotations

import json

from remediator.main import create_app as remediator_app
from gpumedic_incidents.policy import SAMPLER_UNIT
from tests.e2e.test_operator import _cli
from tests.e2e.test_thin_path import remediator_settings


async def test_a_rolling_restart_over_the_bus_with_a_dry_run_first(nats_settings, store_url, fleet, apps, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    everyone = ("--nodes", "label:provider=simulated")

    code, out, _ = await _cli(capsys, "rollout", "restart-unit", "--unit", SAMPLER_UNIT, *everyone, "--dry-run")
    assert code == 1 and "on 2 node(s) in 2 batch(es) (dry run: nothing ran)" in out
    assert f"batch 2  sim-node-02  planned: systemctl restart {SAMPLER_UNIT}" in out
    assert "stopped: the real run would stop before batch 2 of 2: it would take the breaker to 2 distinct nodes" in out
    assert not any(n.unit_restarts for n in fleet.nodes.values())

    # The shipped breaker lets 25 % of the fleet act within 10 minutes: of two nodes, one. The rollout
    # stops before the batch that would take it past that, rather than trip it.
    code, out, _ = await _cli(capsys, "rollout", "restart-unit", "--unit", SAMPLER_UNIT, *everyone, "--by", "ops-alice", "--json")
    report = json.loads(out)
    assert code == 1, out
    assert [(s["batch"], s["node_id"], s["status"]) for s in report["steps"]] == [(1, "sim-node-01", "succeeded")]
    assert report["stopped"].startswith("before batch 2 of 2: it would take the breaker to 2 distinct nodes acted on within 600s")
    assert report["stopped"].endswith("1 node(s) not acted on: sim-node-02")
    assert [n.unit_restarts for n in fleet.nodes.values()] == [{SAMPLER_UNIT: 1}, {}]
    code, out, _ = await _cli(capsys, "actions", report["steps"][0]["action_id"], "--store", store_url)
    assert "asked by remediator: rollout restart_unit by ops-alice, batch 1" in out
    code, out, _ = await _cli(capsys, "breaker", "--store", store_url)
    assert "closed" in out.lower(), out

    # A unit off the allow-list runs nothing, and says so; a selector that is no selector is refused before the bus.
    code, _, err = await _cli(capsys, "rollout", "restart-unit", "--unit", "sshd.service", *everyone)
    assert code == 2 and "nothing ran" in err and "sshd.service" in err
    code, _, err = await _cli(capsys, "rollout", "drain-node", "--nodes", "sim-node-01; reboot")
    assert code == 2 and "is not a node selector" in err
