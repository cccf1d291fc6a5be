"""`gpumedic inventory check`: a read-only login to every node of the inventory, against Debian's
sshd, and a clear line for each node that fails."""

from __future__ import annotations

import socket

import pytest

from gpumedic.cli import main
from gpumedic_nodes.check import TOOLS_PROBE, NodeCheck, check_report

pytestmark = pytest.mark.sshd


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_check_logs_in_to_each_node_read_only_and_names_what_fails(sshd, tmp_path, capsys):
    dead = _closed_port()
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "defaults: {user: root}\n"
        "nodes:\n"
        f"  gpu-node-01: {{host: 127.0.0.1, port: {sshd.port}}}\n"
        f"  gpu-node-02: {{host: 127.0.0.1, port: {dead}}}\n"
    )
    before = len(sshd.commands())
    args = ["inventory", "check", "--inventory", str(inventory), "--known-hosts", str(sshd.known_hosts), "--key", str(sshd.client_key)]
    assert main([*args, "--timeout", "5"]) == 1
    out = capsys.readouterr().out.splitlines()
    assert out == [
        f"gpu-node-01  root@127.0.0.1:{sshd.port}  ok",
        f"gpu-node-02  root@127.0.0.1:{dead}  FAIL refused: connection refused",
        "2 node(s): 1 reachable, 1 failing",
    ]
    assert sshd.commands()[before:] == [TOOLS_PROBE]  # the only thing that ran


def test_an_invalid_inventory_exits_2_naming_the_problem(tmp_path, capsys):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n  gpu-node-01: {host: '-oProxyCommand=sh'}\n")
    assert main(["inventory", "check", "--inventory", str(inventory)]) == 2
    assert f"gpumedic inventory: inventory {inventory} is not valid: nodes.gpu-node-01.host" in capsys.readouterr().err


def test_the_report_says_what_a_missing_tool_breaks():
    report = check_report([NodeCheck("gpu-node-07", "root@10.0.0.7:22", "ok", missing=("fuser",))])
    assert report.splitlines() == [
        "gpu-node-07  root@10.0.0.7:22  ok",
        "               no fuser: gpu_reset is refused (no way to see who holds the GPU)",
        "1 node(s): 1 reachable, 0 failing",
    ]
