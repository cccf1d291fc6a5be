"""Where every command (`enroll`, `inventory`, `report`, a group silence) finds the remediator's
files when none is named: the embedded stack's under --var (`gpumedic up`), else `up --demo`'s
under VAR/demo, else a simulated fleet's under VAR/fleet, else compose's under /etc/gpumedic; and
what enroll says when there is none."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest

from gpumedic.cli import main
from gpumedic.remediator_paths import remediator_file
from gpumedic.report import sources_from


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_the_demo_stacks_inventory_is_found_under_var(tmp_path, monkeypatch):
    for name in ("INVENTORY", "KNOWN_HOSTS", "CLIENT_KEY"):
        monkeypatch.delenv(f"GPUMEDIC_REMEDIATOR_{name}", raising=False)
    var = tmp_path / "var"
    assert remediator_file("INVENTORY", var) == remediator_file("INVENTORY", None) == Path("/etc/gpumedic/inventory.yaml")
    assert remediator_file("INVENTORY", var, fallback=False) is None
    (var / "fleet").mkdir(parents=True)
    (var / "fleet" / "client_key").write_text("")  # a simulated fleet's (`gpumedic sim`)
    assert remediator_file("CLIENT_KEY", var) == var / "fleet" / "client_key"
    (var / "demo" / "ssh").mkdir(parents=True)
    (var / "demo" / "ssh" / "inventory.yaml").write_text("nodes: {}\n")
    assert remediator_file("INVENTORY", var) == var / "demo" / "ssh" / "inventory.yaml"
    (var / "ssh").mkdir()
    (var / "ssh" / "inventory.yaml").write_text("nodes: {}\n")  # a plain `up` beside it comes first
    assert remediator_file("INVENTORY", var) == var / "ssh" / "inventory.yaml"
    assert remediator_file("INVENTORY", var, tmp_path / "mine.yaml") == tmp_path / "mine.yaml"
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_INVENTORY", str(tmp_path / "set.yaml"))
    assert remediator_file("INVENTORY", var) == tmp_path / "set.yaml"
    # `gpumedic report` looks in the same places, and says "none" rather than /etc/gpumedic
    sources = sources_from("sqlite+aiosqlite:///x.db", var)
    assert (sources.inventory, sources.known_hosts, sources.client_key) == (tmp_path / "set.yaml", None, var / "fleet" / "client_key")


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
    if remediator_file("INVENTORY", None).exists():
        pytest.skip("this machine has compose's inventory in /etc/gpumedic")
    assert main(["enroll", "--all", "--check", "--var", str(tmp_path / "var")]) == 2
    err = capsys.readouterr().err
    assert "cannot be read" in err and f"{tmp_path / 'var'}/demo/ssh" in err and "--inventory" in err
