"""The fourth attack's second hole: `gpumedic rollout drain-node --batch 4` drained every node in
one batch (drains did not count against the breaker), and `rollout undrain-node` then released
nothing ("stays drained for incident(s) <the drain rollout's id>"): each rollout has an id of its
own, and the holds were keyed by it. Now every rollout's drain is the operators' hold, which any
rollout's undrain gives back, and a fleet-wide drain counts against the breaker (its dry run says
where the real run would stop). On a real nats-server, through the real CLI and remediator."""

from __future__ import annotations

import json

import pytest

from gpumedic_sim.fleet.nodes import SimFleet
from remediator.main import create_app as remediator_app
from tests.e2e.test_operator import _cli
from tests.e2e.test_thin_path import remediator_settings

EVERY_NODE = ("--nodes", "label:provider=simulated", "--batch", "4")


@pytest.fixture
async def four_nodes(tmp_path):
    fleet = SimFleet(4, 1, tmp_path / "fleet")
    await fleet.start()
    yield fleet
    await fleet.stop()


async def _drained(capsys, store_url: str) -> list[tuple[str, str]]:
    code, out, err = await _cli(capsys, "drained", "--json", "--store", store_url)
    assert code == 0, err
    return sorted((row["node_id"], row["incident_id"]) for row in json.loads(out))


async def test_a_rollout_drain_of_four_nodes_is_undone_by_rollout_undrain(
    nats_settings, store_url, four_nodes, apps, monkeypatch, capsys
):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    generous = remediator_settings(nats_settings, store_url, four_nodes).model_copy(
        update={"breaker_max_nodes": 10, "breaker_max_share": 1.0}
    )
    await apps.start(remediator_app(generous))

    code, out, _ = await _cli(capsys, "rollout", "drain-node", *EVERY_NODE, "--by", "ops-alice")
    assert code == 0, out
    nodes = [f"sim-node-0{i}" for i in range(1, 5)]
    assert await _drained(capsys, store_url) == [(n, "rollout") for n in nodes]

    # Another operator's rollout gives them back: the hold is the operators', not the first rollout's.
    code, out, _ = await _cli(capsys, "rollout", "undrain-node", *EVERY_NODE, "--by", "ops-bob", "--json")
    report = json.loads(out)
    assert code == 0, out
    assert [(s["node_id"], s["status"], s["detail"].split(" (")[0]) for s in report["steps"]] == [(n, "succeeded", f"undrained {n}") for n in nodes]
    assert await _drained(capsys, store_url) == []
    code, out, _ = await _cli(capsys, "drained", "--store", store_url)
    assert out.strip() == "no node is drained"

    # An undrain with nothing a rollout drained gives back nothing, and says so.
    code, out, _ = await _cli(capsys, "rollout", "undrain-node", "--nodes", "sim-node-01", "--json")
    assert code == 0 and "no rollout drained sim-node-01" in json.loads(out)["steps"][0]["detail"]


async def test_a_fleet_wide_drain_counts_against_the_breaker_and_its_dry_run_says_where_it_stops(
    nats_settings, store_url, four_nodes, apps, monkeypatch, capsys
):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    await apps.start(remediator_app(remediator_settings(nats_settings, store_url, four_nodes)))  # 25 % of 4 nodes: 1

    code, out, _ = await _cli(capsys, "rollout", "drain-node", "--nodes", "label:provider=simulated", "--batch", "1", "--dry-run")
    assert code == 1, out
    assert "batch 4  sim-node-04  planned" in out
    assert "stopped: the real run would stop before batch 2 of 4: it would take the breaker to 2 distinct nodes" in out
    assert "3 node(s) not acted on: sim-node-02, sim-node-03, sim-node-04" in out
    assert await _drained(capsys, store_url) == []

    code, out, _ = await _cli(capsys, "rollout", "drain-node", *EVERY_NODE, "--json")
    report = json.loads(out)
    assert code == 1 and report["steps"] == [], out
    assert report["stopped"].startswith("before batch 1 of 1: it would take the breaker to 4 distinct nodes")
    assert await _drained(capsys, store_url) == []

    # One node at a time: the first drains, the second would pass the breaker's share and is not asked.
    code, out, _ = await _cli(capsys, "rollout", "drain-node", "--nodes", "label:provider=simulated", "--json")
    report = json.loads(out)
    assert [(s["node_id"], s["status"]) for s in report["steps"]] == [("sim-node-01", "succeeded")]
    assert report["stopped"].startswith("before batch 2 of 4")
    assert await _drained(capsys, store_url) == [("sim-node-01", "rollout")]
