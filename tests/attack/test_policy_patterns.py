"""The fourth attack's weak spots in the policy: its patterns (health and admin URLs, the drain
hook, the check command, units, selectors) were matched with `re.match` and `$`, which matches
before a trailing newline, so `http://127.0.0.1/health\\n` passed. Every pattern now means the whole
string."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from gpumedic_incidents.policy import NodeSelector
from gpumedic_incidents.policy.actions import AdminEndpoint, DrainPolicy, JobRestart, LogFile, UndrainPolicy, UnitRule
from gpumedic_nodes.inventory import InventoryError, load_inventory

NL = "\n"


@pytest.mark.parametrize("build", [
    lambda: UnitRule(health_url="http://127.0.0.1:8080/health" + NL),
    lambda: AdminEndpoint(url="http://127.0.0.1:8770/force_election" + NL),
    lambda: DrainPolicy(hook_url="https://scheduler.example/drain" + NL),
    lambda: UndrainPolicy(check_command="/usr/local/bin/gpu-check" + NL),
    lambda: JobRestart(command="/opt/job/restart" + NL),
    lambda: JobRestart(unit="selfplay.service" + NL),
    lambda: AdminEndpoint(url="http://127.0.0.1:8770/x", body={"node" + NL: "{node_id}"}),
    lambda: LogFile(path="/workspace/logs/worker.log" + NL),
    lambda: NodeSelector("group:gpu" + NL),
])
def test_a_trailing_newline_is_no_longer_the_same_value(build):
    with pytest.raises((ValidationError, ValueError)):
        build()


def test_the_same_values_without_it_still_pass():
    assert UnitRule(health_url="http://127.0.0.1:8080/health").health_url.endswith("/health")
    assert DrainPolicy(hook_url="https://scheduler.example/drain").hook_url
    assert UndrainPolicy(check_command="/usr/local/bin/gpu-check").check_command
    assert NodeSelector("group:gpu").text == "group:gpu"


def test_an_inventory_label_with_a_trailing_newline_is_refused(tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text('nodes:\n  gpu-01: {host: 10.0.0.1, user: root, labels: {rack: "a1\\n"}}\n')
    with pytest.raises(InventoryError):
        load_inventory(inventory)
