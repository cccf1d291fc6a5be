"""Where `gpumedic enroll` finds the remediator's inventory when none is named: the embedded
stack's under --var (`gpumedic up`), else `up --demo`'s under VAR/demo, else compose's under
/etc/gpumedic; and what it says when there is none."""

from __future__ import annotations

import socket

import pytest

from gpumedic.cli import main, remediator_file


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_demo_stacks_inventory_is_found_under_var(tmp_path, monkeypatch):
    monkeypatch.delenv("GPUMEDIC_REMEDIATOR_INVENTORY", raising=False)
    var = tmp_path / "var"
    assert remediator_file(None, "INVENTORY", "inventory.yaml", var) == remediator_file(None, "INVENTORY", "inventory.yaml", None)
    (var / "demo" / "ssh").mkdir(parents=True)
    (var / "demo" / "ssh" / "inventory.yaml").write_text("nodes: {}\n")
    assert remediator_file(None, "INVENTORY", "inventory.yaml", var) == var / "demo" / "ssh" / "inventory.yaml"
    (var / "ssh").mkdir()
    (var / "ssh" / "inventory.yaml").write_text("nodes: {}\n")  # a plain `up` beside it comes first
    assert remediator_file(None, "INVENTORY", "inventory.yaml", var) == var / "ssh" / "inventory.yaml"
    assert remediator_file(tmp_path / "mine.yaml", "INVENTORY", "inventory.yaml", var) == tmp_path / "mine.yaml"


def test_enroll_check_under_up_demo_checks_the_demos_nodes(tmp_path, monkeypatch, capsys):
    for name in ("INVENTORY", "KNOWN_HOSTS", "CLIENT_KEY"):
        monkeypatch.delenv(f"GPUMEDIC_REMEDIATOR_{name}", raising=False)
    ssh = tmp_path / "var" / "demo" / "ssh"
    ssh.mkdir(parents=True)
    (ssh / "inventory.yaml").write_text(f"nodes:\n  sim-node-01: {{host: 127.0.0.1, port: {_closed_port()}, user: root}}\n")
    (ssh / "known_hosts").write_text("")
    code = main(["enroll", "--all", "--check", "--var", str(tmp_path / "var"), "--timeout", "5"])
    out = capsys.readouterr().out
    assert code == 1 and out.split()[:2] == ["sim-node-01", "FAIL"], out


def test_no_inventory_anywhere_says_where_it_looked(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUMEDIC_REMEDIATOR_INVENTORY", raising=False)
    if remediator_file(None, "INVENTORY", "inventory.yaml", None).exists():
        pytest.skip("this machine has compose's inventory in /etc/gpumedic")
    assert main(["enroll", "--all", "--check", "--var", str(tmp_path / "var")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and f"{tmp_path / 'var'}/demo/ssh" in err and "--inventory" in err
