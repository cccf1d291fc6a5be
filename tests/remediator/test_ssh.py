"""The SSH executor and the catalogue against Debian's real sshd, killing a real process."""

from __future__ import annotations

import socket

import asyncssh
import pytest

from gpumedic_events import ActionOutcome, KillGpuProcesses
from gpumedic_nodes.inventory import InventoryError
from gpumedic_nodes.ssh import HostKeyMismatch, NodeUnreachable, SshExecutor
from remediator import catalogue
from remediator.catalogue import kill

pytestmark = pytest.mark.sshd

GPU_QUERY = "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id=0"
HOLDERS = ("nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=0", "fuser /dev/nvidia0")


def _executor(sshd, **changes) -> SshExecutor:
    values = {
        "inventory": sshd.inventory,
        "known_hosts": sshd.known_hosts,
        "client_key": sshd.client_key,
        "connect_timeout_s": 5.0,
        "command_timeout_s": 5.0,
        **changes,
    }
    return SshExecutor(**values)


async def _kill(executor: SshExecutor, node: str, *targets, verify_timeout_s: float = 5.0):
    async with executor.session(node) as session:
        return await catalogue.execute(
            KillGpuProcesses(gpu_index=0, targets=targets, max_gpu_utilization_pct=5), session.run, verify_timeout_s=verify_timeout_s
        )


async def test_run_returns_status_and_output(sshd):
    status, stdout, stderr = await _executor(sshd).run(sshd.node_id, "cat /proc/1/stat")
    assert status == 0
    assert kill.parse_stat(stdout).pid == 1
    missing = await _executor(sshd).run(sshd.node_id, "cat /proc/4194304/stat")
    assert missing.exit_status != 0 and "No such file" in missing.stderr


async def test_kills_a_real_process_after_checking_it(sshd, sleeper):
    result = await _kill(_executor(sshd), sshd.node_id, sleeper.target())
    assert sleeper.killed()
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert result.detail == f"sent KILL to {sleeper.pid}; verified gone: {sleeper.pid}"
    pid = sleeper.pid
    # After SIGKILL the sleeper is a zombie (this test process has not reaped it yet): dead.
    assert result.steps == [GPU_QUERY, *HOLDERS, f"cat /proc/{pid}/stat", f"cat /proc/{pid}/cmdline", f"kill -s KILL {pid}", f"cat /proc/{pid}/stat"]
    assert sshd.commands_about(pid) == result.steps[3:]


async def test_wrong_start_time_is_refused_and_the_process_lives(sshd, sleeper):
    result = await _kill(_executor(sshd), sshd.node_id, sleeper.target(start_ticks=sleeper.start_ticks + 1))
    assert result.outcome is ActionOutcome.FAILED
    assert f"refused {sleeper.pid}: start time {sleeper.start_ticks} != expected {sleeper.start_ticks + 1}" in result.detail
    assert result.steps == [GPU_QUERY, *HOLDERS, f"cat /proc/{sleeper.pid}/stat"]
    assert sleeper.alive()


async def test_wrong_command_line_is_refused_and_the_process_lives(sshd, sleeper):
    result = await _kill(_executor(sshd), sshd.node_id, sleeper.target(command="python train.py"))
    assert result.outcome is ActionOutcome.FAILED
    assert "command line 'sleep 300' != expected 'python train.py'" in result.detail
    assert sleeper.alive()


async def test_a_host_key_not_in_known_hosts_is_refused(sshd, sleeper, tmp_path):
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text(f"[127.0.0.1]:{sshd.port} {impostor[0]} {impostor[1]}\n")
    with pytest.raises(HostKeyMismatch) as caught:
        await _kill(_executor(sshd, known_hosts=known_hosts), sshd.node_id, sleeper.target())
    message = str(caught.value)
    assert message.startswith(f"node 'gpu-node-01' (root@127.0.0.1:{sshd.port}): host key not trusted by {known_hosts}")
    assert sleeper.alive()


async def test_an_empty_known_hosts_trusts_nobody(sshd, tmp_path):
    known_hosts = tmp_path / "known_hosts"
    known_hosts.write_text("")
    with pytest.raises(HostKeyMismatch, match="host key not trusted"):
        await _executor(sshd, known_hosts=known_hosts).run(sshd.node_id, "cat /proc/1/stat")


async def test_a_closed_port_is_unreachable_naming_the_node(sshd, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"nodes:\n  gpu-node-09: {{host: 127.0.0.1, port: {port}, user: root}}\n")
    with pytest.raises(NodeUnreachable) as caught:
        await _executor(sshd, inventory=inventory).run("gpu-node-09", "cat /proc/1/stat")
    assert str(caught.value) == f"node 'gpu-node-09' (root@127.0.0.1:{port}): connection refused"


async def test_a_key_the_node_does_not_authorize_is_refused(sshd, tmp_path):
    stranger = tmp_path / "id_stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    with pytest.raises(NodeUnreachable, match="login refused: the client key is not authorized"):
        await _executor(sshd, client_key=stranger).run(sshd.node_id, "cat /proc/1/stat")


async def test_an_unknown_node_names_the_inventory(sshd):
    with pytest.raises(InventoryError) as caught:
        await _executor(sshd).run("gpu-node-99", "cat /proc/1/stat")
    assert str(caught.value) == f"unknown node 'gpu-node-99': not in inventory {sshd.inventory}"


async def test_a_node_that_never_answers_times_out(sshd, tmp_path):
    # A socket that accepts TCP (the kernel's backlog) but never speaks SSH.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        port = silent.getsockname()[1]
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(f"nodes:\n  gpu-node-08: {{host: 127.0.0.1, port: {port}}}\n")
        executor = _executor(sshd, inventory=inventory, connect_timeout_s=0.5)
        with pytest.raises(NodeUnreachable) as caught:
            await executor.run("gpu-node-08", "cat /proc/1/stat")
    assert str(caught.value) == f"node 'gpu-node-08' (root@127.0.0.1:{port}): connect timed out after 0.5s"


def _accepted_logins(sshd) -> int:
    return (sshd.directory / "sshd.log").read_text().count("Accepted publickey")


async def test_a_node_behind_a_jump_host_is_reached_through_it(sshd, tmp_path):
    # The jump host is this sshd too: the node's session is tunnelled through a first login to it.
    key = tmp_path / "group_key"
    key.write_bytes(sshd.client_key.read_bytes())
    key.chmod(0o600)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "groups:\n"
        f"  behind-bastion: {{user: root, key: {key}, jump: {{host: 127.0.0.1, port: {sshd.port}}}}}\n"
        "nodes:\n"
        f"  gpu-node-21: {{host: 127.0.0.1, port: {sshd.port}, group: behind-bastion}}\n"
    )
    before = _accepted_logins(sshd)
    # The executor's own key is a stranger: only the group's key can log in, to the jump host and the node.
    stranger = tmp_path / "id_stranger"
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(stranger))
    result = await _executor(sshd, inventory=inventory, client_key=stranger).run("gpu-node-21", "cat /proc/1/stat")
    assert result.exit_status == 0 and kill.parse_stat(result.stdout).pid == 1
    assert _accepted_logins(sshd) - before == 2  # the jump host's login and the node's


async def test_a_jump_host_that_will_not_forward_names_the_node_and_the_hop(sshd, tmp_path):
    # The sshd forwards to 127.0.0.1 only (PermitOpen), so a node named `localhost` is refused there.
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        f"nodes:\n  gpu-node-22: {{host: localhost, port: {sshd.port}, user: root, jump: {{host: 127.0.0.1, port: {sshd.port}}}}}\n"
    )
    with pytest.raises(NodeUnreachable) as caught:
        await _executor(sshd, inventory=inventory).run("gpu-node-22", "cat /proc/1/stat")
    assert str(caught.value) == (
        f"node 'gpu-node-22' (root@localhost:{sshd.port} via root@127.0.0.1:{sshd.port}): "
        f"the jump host would not open a connection to localhost:{sshd.port} (open failed)"
    )


async def test_an_untrusted_jump_host_is_refused_before_the_node(sshd, tmp_path):
    # An SSH server whose host key known_hosts does not hold stands in front of the trusted node.
    impostor = await asyncssh.listen("127.0.0.1", 0, server_host_keys=[asyncssh.generate_private_key("ssh-ed25519")])
    port = impostor.sockets[0].getsockname()[1]
    try:
        inventory = tmp_path / "inventory.yaml"
        inventory.write_text(
            f"nodes:\n  gpu-node-23: {{host: 127.0.0.1, port: {sshd.port}, user: root, jump: {{host: 127.0.0.1, port: {port}}}}}\n"
        )
        before = len(sshd.commands())
        with pytest.raises(HostKeyMismatch, match=f"jump host: host key not trusted by {sshd.known_hosts}"):
            await _executor(sshd, inventory=inventory).run("gpu-node-23", "cat /proc/1/stat")
        assert len(sshd.commands()) == before
    finally:
        impostor.close()
        await impostor.wait_closed()
