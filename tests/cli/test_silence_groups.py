"""A silence on an inventory group: detectors know nodes, not groups, so `gpumedic silence add
--match group=NAME` silences the nodes the inventory puts in it now (and says which)."""

from __future__ import annotations

import pytest

from gpumedic.cli import main
from gpumedic.silences import expand_groups
from gpumedic_events import Matcher

GROUPS = {"gpu-01": "lambda", "gpu-02": "lambda", "gpu-03": "spot", "gpu-10": None}


@pytest.mark.parametrize(("matcher", "holds", "not_for"), [
    ("group=lambda", {"gpu-01", "gpu-02"}, {"gpu-03", "gpu-10", "gpu-0"}),
    ("group!=lambda", {"gpu-03", "gpu-10", "anything-else"}, {"gpu-01", "gpu-02"}),
    ('group=~"lam.*|spot"', {"gpu-01", "gpu-02", "gpu-03"}, {"gpu-10"}),
    ("group!~spot", {"gpu-01", "gpu-10"}, {"gpu-03"}),
])
def test_a_group_becomes_its_nodes_now(matcher, holds, not_for):
    (node_matcher,) = expand_groups([matcher, ], GROUPS)
    parsed = Matcher.parse(node_matcher)
    assert parsed.label == "node"
    assert all(parsed.matches({"node": n}) for n in holds) and not any(parsed.matches({"node": n}) for n in not_for)


def test_other_matchers_pass_through_and_an_empty_group_is_refused_with_the_groups_there_are():
    assert expand_groups(["kind!=gpu_xid", "node=~gpu-0[12]"], GROUPS) == ["kind!=gpu_xid", "node=~gpu-0[12]"]
    with pytest.raises(ValueError, match=r"no node of the inventory is in such a group \(groups: lambda, spot\)"):
        expand_groups(["group=lambada"], GROUPS)
    with pytest.raises(ValueError, match="is not a regular expression"):
        expand_groups(["group=~lam(bda"], GROUPS)


def test_the_cli_reads_the_groups_from_the_remediators_inventory(tmp_path, monkeypatch, capsys, nats_url):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("groups:\n  lambda: {user: ubuntu}\nnodes:\n  gpu-01: {host: 10.0.0.1, group: lambda}\n  gpu-02: {host: 10.0.0.2}\n")
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_INVENTORY", str(inventory))
    assert main(["silence", "add", "--reason", "x", "--match", "group=spot", "--var", str(tmp_path / "var")]) == 2
    assert "'group=spot': no node of the inventory is in such a group (groups: lambda)" in capsys.readouterr().err
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_INVENTORY", str(tmp_path / "missing.yaml"))
    assert main(["silence", "add", "--reason", "x", "--match", "group=lambda", "--var", str(tmp_path / "var")]) == 2
    assert "a group matcher needs the remediator's inventory" in capsys.readouterr().err
