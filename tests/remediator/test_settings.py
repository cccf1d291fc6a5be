"""Settings: safe defaults, environment parsing, and failing fast on unusable files."""

from __future__ import annotations

from pathlib import Path

import asyncssh
import pytest
from pydantic import ValidationError

from remediator.main import gate_of
from remediator.settings import Settings, SettingsError


def test_defaults_are_the_safe_ones(monkeypatch):
    for name in ("MODE", "MODES", "PROTECTED_NODES"):
        monkeypatch.delenv(f"GPUMEDIC_REMEDIATOR_{name}", raising=False)
    settings = Settings()
    assert settings.mode == "observe"
    assert (settings.breaker_max_nodes, settings.breaker_window_s, settings.max_request_age_s) == (5, 600, 120)
    gate = gate_of(settings, settings.policy.load())  # the per-node limit comes from the (shipped) policy file
    assert (gate.max_actions_per_node, gate.node_window_s) == (3, 3600)
    assert (settings.connect_timeout_s, settings.command_timeout_s, settings.verify_timeout_s) == (10, 30, 20)
    assert settings.trace_to_bus is False


def test_reads_the_environment(monkeypatch, tmp_path):
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_MODE", "enforce")
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_PROTECTED_NODES", "gpu-node-01, gpu-node-02")
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_INVENTORY", str(tmp_path / "inv.yaml"))
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_BREAKER_MAX_NODES", "9")
    monkeypatch.setenv("GPUMEDIC_NATS_URL", "nats://10.0.0.1:4222")
    monkeypatch.setenv("GPUMEDIC_STORE_URL", "sqlite+aiosqlite:////tmp/x.db")
    settings = Settings()
    assert settings.mode == "enforce"
    assert settings.protected_nodes == {"gpu-node-01", "gpu-node-02"}
    assert settings.inventory == tmp_path / "inv.yaml"
    assert settings.nats.url == "nats://10.0.0.1:4222"
    assert settings.store.url == "sqlite+aiosqlite:////tmp/x.db"
    gate = gate_of(settings, settings.policy.load())
    # the master switch enforces; each operation's own mode comes from the (shipped) policy file
    assert gate.mode_for("kill_gpu_processes") == "enforce" and gate.mode_for("reboot_node") == "observe"
    assert gate.breaker_max_nodes == 9


def test_protected_nodes_also_take_a_json_list(monkeypatch):
    monkeypatch.setenv("GPUMEDIC_REMEDIATOR_PROTECTED_NODES", '["a", "b"]')
    assert Settings().protected_nodes == {"a", "b"}


def test_modes_refuse_an_unknown_mode():
    with pytest.raises(ValidationError):
        Settings(mode="yolo")


def _files(tmp_path: Path) -> dict[str, Path]:
    key = asyncssh.generate_private_key("ssh-ed25519")
    client_key = tmp_path / "id_ed25519"
    key.write_private_key(str(client_key))
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:2222 {key.export_public_key().decode().strip()}\n")
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n  gpu-node-01: {host: 127.0.0.1, port: 2222, user: root}\n")
    return {"inventory": inventory, "known_hosts": known_hosts, "client_key": client_key}


def test_check_files_accepts_usable_files(tmp_path):
    Settings(**_files(tmp_path)).check_files()


@pytest.mark.parametrize("name", ["inventory", "known_hosts", "client_key"])
def test_check_files_names_a_missing_file_and_its_variable(tmp_path, name):
    files = _files(tmp_path)
    files[name] = tmp_path / "missing"
    with pytest.raises(SettingsError) as caught:
        Settings(**files).check_files()
    assert str(caught.value) == f"{name} file {tmp_path / 'missing'} does not exist (set GPUMEDIC_REMEDIATOR_{name.upper()})"


def test_check_files_refuses_a_bad_inventory(tmp_path):
    files = _files(tmp_path)
    files["inventory"].write_text("nodes:\n  gpu-node-01: {port: 22}\n")
    with pytest.raises(SettingsError, match="inventory .* is not valid: nodes.gpu-node-01.host: Field required"):
        Settings(**files).check_files()


def test_check_files_refuses_a_key_without_quoting_it(tmp_path):
    files = _files(tmp_path)
    files["client_key"].write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nc2VjcmV0LXNlY3JldA==\n-----END OPENSSH PRIVATE KEY-----\n")
    with pytest.raises(SettingsError) as caught:
        Settings(**files).check_files()
    assert "is not a usable private key" in str(caught.value)
    assert "c2VjcmV0" not in str(caught.value)


def test_the_per_node_limit_comes_from_the_policy_file_and_a_bad_one_names_its_line(monkeypatch, tmp_path):
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ngate:\n  max_actions_per_node: 7\n  node_window_s: 60\n")
    monkeypatch.setenv("GPUMEDIC_POLICY_FILE", str(policy))
    settings = Settings()
    gate = gate_of(settings, settings.policy.load())
    assert (gate.max_actions_per_node, gate.node_window_s) == (7, 60)
    policy.write_text("version: 1\ngate:\n  max_actions_per_node: 0\n")
    with pytest.raises(ValueError, match=r"policy.yaml:3: gate.max_actions_per_node: Input should be greater than or equal to 1"):
        Settings().policy.load()
