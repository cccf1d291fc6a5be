"""leader-health reads the fleet's inventory for the names a member may have: its node ids and
hosts, read again when the file changes, and nothing judged while it cannot be read."""

from __future__ import annotations

import os

from leader_health.handlers import Inventory


def test_node_ids_and_hosts_are_read_again_when_the_file_changes(tmp_path, caplog):
    path = tmp_path / "inventory.yaml"
    path.write_text("nodes:\n  gpu-node-01: {host: 10.0.0.7}\n")
    inventory = Inventory(path)
    assert inventory.names() == {"gpu-node-01", "10.0.0.7"}
    path.write_text("nodes:\n  gpu-node-01: {host: 10.0.0.7}\n  gpu-node-02: {host: gpu-node-02.lan}\n")
    os.utime(path, ns=(1, 10**18))
    assert inventory.names() == {"gpu-node-01", "10.0.0.7", "gpu-node-02", "gpu-node-02.lan"}
    path.write_text("nodes: [not, a, mapping]\n")
    os.utime(path, ns=(1, 2 * 10**18))
    assert inventory.names() is None and inventory.names() is None
    assert len([r for r in caplog.records if "no peer is judged a stranger" in r.message]) == 1  # said once
    assert Inventory(None).names() is None
