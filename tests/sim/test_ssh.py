"""A simulated node's SSH server, driven by a real asyncssh client that verifies host keys."""

from __future__ import annotations

import asyncssh
import pytest

from gpumedic_sim import SimFleet, SimNode


async def _connect(fleet: SimFleet, node: SimNode, **overrides) -> asyncssh.SSHClientConnection:
    options = {
        "username": fleet.user,
        "known_hosts": str(fleet.known_hosts_path),
        "client_keys": [str(fleet.client_key_path)],
    }
    options.update(overrides)
    return await asyncssh.connect(node.host, node.ssh_port, **options)


async def test_stat_shows_the_start_ticks(fleet):
    node = fleet.node("sim-node-01")
    zombie = node.inject_zombie(1)
    async with await _connect(fleet, node) as conn:
        stat = await conn.run(f"cat /proc/{zombie.pid}/stat")
        cmdline = await conn.run(f"cat /proc/{zombie.pid}/cmdline")

    assert stat.exit_status == 0
    fields = stat.stdout.rsplit(")", 1)[1].split()
    assert stat.stdout.startswith(f"{zombie.pid} (python) S 1 ")
    assert int(fields[22 - 3]) == zombie.start_ticks
    assert len(stat.stdout.split()) == 52
    assert cmdline.exit_status == 0
    assert cmdline.stdout == "python\0-m\0selfplay\0--gpu\x001\0--games\x00100000\0"
    assert node.ssh_commands == [f"cat /proc/{zombie.pid}/stat", f"cat /proc/{zombie.pid}/cmdline"]


async def test_killing_the_zombie_frees_its_gpu(fleet):
    node = fleet.node("sim-node-02")
    zombie = node.inject_zombie(0)
    sampler = node.sampler(interval_s=1.0)
    before = await sampler.sample()
    assert [p.pid for p in before.gpus[0].processes] == [zombie.pid]
    assert before.gpus[0].utilization_gpu_pct == 0 and before.gpus[0].memory_used_mib == 20480
    assert before.gpus[0].processes[0].start_ticks == zombie.start_ticks
    assert before.jobs.running == 2

    async with await _connect(fleet, node) as conn:
        result = await conn.run(f"kill -s KILL {zombie.pid}")
        gone = await conn.run(f"cat /proc/{zombie.pid}/stat")

    assert (result.exit_status, result.stdout, result.stderr) == (0, "", "")
    assert gone.exit_status == 1
    assert gone.stderr == f"cat: /proc/{zombie.pid}/stat: No such file or directory\n"
    after = await sampler.sample()
    assert after.gpus[0].processes == ()
    assert after.gpus[0].memory_used_mib == 0
    assert after.jobs.running == 1
    # the other GPU's job is untouched
    assert len(after.gpus[1].processes) == 1 and after.gpus[1].utilization_gpu_pct >= 85
    assert after.errors == ()


async def test_term_is_ignored_by_a_stubborn_zombie_then_kill_works(fleet):
    node = fleet.node("sim-node-01")
    zombie = node.inject_zombie(0, ignore_term=True)
    async with await _connect(fleet, node) as conn:
        assert (await conn.run(f"kill -s TERM {zombie.pid}")).exit_status == 0
        assert node.process(zombie.pid) is not None
        assert (await conn.run(f"kill -s KILL {zombie.pid}")).exit_status == 0
    assert node.process(zombie.pid) is None and zombie.killed_by == "KILL"


async def test_killing_a_wrong_pid_changes_nothing(fleet):
    node = fleet.node("sim-node-01")
    before = {p.pid for p in node.live_processes()}
    wrong = max(before) + 1
    async with await _connect(fleet, node) as conn:
        result = await conn.run(f"kill -s KILL {wrong}")
    assert result.exit_status == 1
    assert result.stderr == f"kill: ({wrong}) - No such process\n"
    assert {p.pid for p in node.live_processes()} == before
    assert node.running_jobs == 2


@pytest.mark.parametrize(
    ("command", "word"),
    [
        ("rm -rf /", "rm"),
        ("pkill -9 -f selfplay", "pkill"),
        ("kill -9 {pid}", "kill"),
        ("kill -s HUP {pid}", "kill"),
        ("cat /proc/{pid}/environ", "cat"),
        ("kill -s KILL {pid}; reboot", "kill"),
        ("$(reboot)", "$(reboot)"),
    ],
)
async def test_anything_else_exits_127_and_changes_nothing(fleet, command, word):
    node = fleet.node("sim-node-01")
    pid = node.live_processes()[0].pid
    line = command.format(pid=pid)
    async with await _connect(fleet, node) as conn:
        result = await conn.run(line)
    assert result.exit_status == 127
    assert result.stderr == f"sh: 1: {word}: not found\n"
    assert node.process(pid) is not None and node.running_jobs == 2
    assert node.ssh_commands == [line]


async def test_unknown_host_key_is_refused(fleet, tmp_path):
    node = fleet.node("sim-node-01")
    impostor = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode().split()[:2]
    known_hosts = tmp_path / "other_known_hosts"
    known_hosts.write_text(f"[{node.host}]:{node.ssh_port} {impostor[0]} {impostor[1]}\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _connect(fleet, node, known_hosts=str(known_hosts))
    # another node's key is no good either: each node has its own
    other = fleet.node("sim-node-02")
    known_hosts.write_text(f"[{node.host}]:{node.ssh_port} " + " ".join(other.known_hosts_line().split()[1:]) + "\n")
    with pytest.raises(asyncssh.HostKeyNotVerifiable):
        await _connect(fleet, node, known_hosts=str(known_hosts))
    assert node.ssh_commands == []


async def test_a_key_the_fleet_does_not_know_is_refused(fleet):
    node = fleet.node("sim-node-01")
    stranger = asyncssh.generate_private_key("ssh-ed25519")
    with pytest.raises(asyncssh.PermissionDenied):
        await _connect(fleet, node, client_keys=[stranger], agent_path=None, password=None)


async def test_any_user_with_the_fleet_key(fleet):
    node = fleet.node("sim-node-02")
    async with await _connect(fleet, node, username="root") as conn:
        assert (await conn.run("true")).exit_status == 127
