"""The inventory file: settings for all nodes, a group or one node (the most specific wins),
groups and labels, and a clear error for anything a node's address must never be."""

from __future__ import annotations

from pathlib import Path

import pytest

from gpumedic_nodes.inventory import Hop, InventoryError, load_inventory

SAMPLE = Path(__file__).parents[2] / "deploy" / "inventory.example.yaml"


def _load(tmp_path, text: str):
    path = tmp_path / "inventory.yaml"
    path.write_text(text)
    return load_inventory(path)


def test_the_most_specific_setting_wins_and_labels_merge(tmp_path):
    nodes = _load(
        tmp_path,
        """
defaults: {user: gpumedic, labels: {fleet: rented}}
groups:
  lambda: {user: ubuntu, key: /keys/lambda, jump: {host: bastion.example, user: jump}, labels: {provider: lambda}}
nodes:
  a: {host: 10.0.0.7, group: lambda, labels: {role: p2p}}
  b: {host: 10.0.0.8, group: lambda, user: root, port: 2222, labels: {provider: other}}
  c: {host: 203.0.113.9}
""",
    )
    a, b, c = nodes["a"], nodes["b"], nodes["c"]
    assert (a.user, a.port, a.key, a.jump, a.group) == ("ubuntu", 22, Path("/keys/lambda"), Hop(host="bastion.example", user="jump"), "lambda")
    assert a.labels == {"fleet": "rented", "provider": "lambda", "role": "p2p"}
    assert (b.user, b.port, b.labels["provider"]) == ("root", 2222, "other")
    assert (c.user, c.port, c.key, c.jump, c.group, c.labels) == ("gpumedic", 22, None, None, None, {"fleet": "rented"})
    assert a.describe() == "ubuntu@10.0.0.7:22 via jump@bastion.example:22"


def test_the_simulated_fleets_plain_format_still_reads(tmp_path):
    nodes = _load(tmp_path, "nodes:\n  gpu-node-01: {host: 127.0.0.1, port: 40123, user: root}\n")
    assert nodes["gpu-node-01"].describe() == "root@127.0.0.1:40123"


def test_the_shipped_sample_is_valid():
    nodes = load_inventory(SAMPLE)
    assert nodes and all(address.host for address in nodes.values())


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("nodes:\n  a: {host: '-oProxyCommand=touch /tmp/x'}\n", "nodes.a.host: String should match pattern"),
        ("nodes:\n  a: {host: 'h; rm -rf /'}\n", "nodes.a.host: String should match pattern"),
        ("nodes:\n  a: {host: h, user: 'root$(id)'}\n", "nodes.a.user: String should match pattern"),
        ("nodes:\n  'a;b': {host: h}\n", "nodes.a;b.[key]: String should match pattern"),
        ("nodes:\n  a: {host: h, group: gpu}\n", "node a names group 'gpu', which `groups` does not define"),
        ("nodes:\n  a: {host: h, labels: {role: 'p2p node'}}\n", "label 'role'='p2p node': letters, digits and _.-:/ only"),
        ("nodes:\n  a: {host: h, jump: {host: '../x'}}\n", "nodes.a.jump.host: String should match pattern"),
        ("nodes:\n  a: {host: h, prot: 22}\n", "nodes.a.prot: Extra inputs are not permitted"),
    ],
)
def test_what_a_node_must_never_be_is_refused_naming_the_place(tmp_path, text, problem):
    with pytest.raises(InventoryError) as caught:
        _load(tmp_path, text)
    assert str(caught.value).startswith(f"inventory {tmp_path / 'inventory.yaml'} is not valid: ")
    assert problem in str(caught.value)


def test_a_key_the_inventory_names_is_checked_at_start(tmp_path):
    import asyncssh

    from remediator.settings import Settings, SettingsError

    key = tmp_path / "id_ed25519"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(key))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"groups:\n  lambda: {{key: {tmp_path / 'missing_key'}}}\nnodes:\n  a: {{host: h, group: lambda}}\n")
    settings = Settings(inventory=inventory, known_hosts=known_hosts, client_key=key)
    with pytest.raises(SettingsError, match=f"key file {tmp_path / 'missing_key'} named in inventory {inventory} is not usable"):
        settings.check_files()


def test_protected_nodes_take_selectors_and_refuse_anything_else(monkeypatch):
    from remediator.main import gate_of
    from remediator.settings import Settings

    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_PROTECTED_NODES", "gpu-node-01, group:prod,label:tier=critical")
    settings = Settings()
    assert {s.text for s in gate_of(settings, settings.policy.load()).protected_nodes} == {"gpu-node-01", "group:prod", "label:tier=critical"}
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_PROTECTED_NODES", "group:$(reboot)")
    with pytest.raises(ValueError, match="is not a node selector"):
        Settings()
