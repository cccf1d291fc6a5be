"""A node's answers are data, never control: one node of three answered enrolment's probe with a
5,000-digit uid and escape sequences; `int()` raised a ValueError nothing caught, so no node of
the fleet got a result, and its user and version reached the operator's terminal unescaped.
`gpumedic enroll --all --check` over three nodes on in-process SSH servers (each its own host key,
checked) now gives two successes and one clear failure line with the node's text escaped."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import asyncssh

GPUMEDIC = Path(sys.executable).parent / "gpumedic"

PROBE_ANSWER = "home=/root\nuser=root\nuid=0\nmachine=x86_64\npython=/usr/bin/python3\npyver=3.11\nlibc=glibc-2.36\n" \
    "dir=/root/.gpumedic\ninstalled=0.1.0\nfree_kb=10485760\n"
STATUS_ANSWER = "version=0.1.0\nmanager=supervisor\nstate=RUNNING\nsince=2026-11-27 09:00:00\n"
HOSTILE = PROBE_ANSWER.replace("uid=0", "uid=" + "9" * 5000).replace("user=root", "user=r\x1b]0;owned\x07oot") \
    .replace("installed=0.1.0", "installed=\x1b[2J0.1.0")


class _Node(asyncssh.SSHServer):
    def password_auth_supported(self) -> bool:
        return False


async def _serve(answer: str, client_key: asyncssh.SSHKey) -> tuple[asyncssh.SSHAcceptor, asyncssh.SSHKey]:
    host_key = asyncssh.generate_private_key("ssh-ed25519")

    def handle(process: asyncssh.SSHServerProcess) -> None:
        command = process.command or ""
        process.stdout.write(STATUS_ANSWER if command.endswith(" status") else answer)
        process.exit(0)

    server = await asyncssh.create_server(
        _Node, "127.0.0.1", 0, server_host_keys=[host_key], process_factory=handle, encoding="utf-8",
        authorized_client_keys=asyncssh.import_authorized_keys(client_key.export_public_key().decode()),
    )
    return server, host_key


async def test_one_hostile_node_is_one_failure_line_and_the_others_get_theirs(tmp_path):
    client_key = asyncssh.generate_private_key("ssh-ed25519")
    key_file = tmp_path / "id_ed25519"
    key_file.write_bytes(client_key.export_private_key())
    key_file.chmod(0o600)
    servers, inventory, known = [], ["nodes:"], []
    for node, answer in (("gpu-a", PROBE_ANSWER), ("gpu-b", HOSTILE), ("gpu-c", PROBE_ANSWER)):
        server, host_key = await _serve(answer, client_key)
        servers.append(server)
        port = server.sockets[0].getsockname()[1]
        inventory.append(f"  {node}: {{host: 127.0.0.1, port: {port}, user: root}}")
        known.append(f"[127.0.0.1]:{port} {host_key.export_public_key().decode().strip()}")
    (tmp_path / "inventory.yaml").write_text("\n".join(inventory) + "\n")
    (tmp_path / "known_hosts").write_text("\n".join(known) + "\n")
    try:
        result = await asyncio.to_thread(
            subprocess.run,
            [str(GPUMEDIC), "enroll", "--all", "--check", "--inventory", str(tmp_path / "inventory.yaml"),
             "--known-hosts", str(tmp_path / "known_hosts"), "--key", str(key_file), "--var", str(tmp_path / "var")],
            capture_output=True, text=True, timeout=60,
        )
    finally:
        for server in servers:
            server.close()
    out = result.stdout
    assert result.returncode == 1, out + result.stderr
    lines = out.splitlines()
    assert [line.split()[:2] for line in lines[:3]] == [["gpu-a", "ok"], ["gpu-b", "FAIL"], ["gpu-c", "ok"]], out
    assert "0.1.0 running under supervisor" in lines[0] and "0.1.0 running under supervisor" in lines[2]
    assert "the node answered user='r\\x1b]0;owned\\x07oot' (14 characters), which is not a user name; " in lines[1]
    assert "uid='99999" in lines[1] and "...' (5000 characters), which is not a user id of at most 10 digits" in lines[1]
    assert "installed='\\x1b[2J0.1.0' (9 characters), which is not a version; not enrolled" in lines[1]
    assert lines[-1] == "3 node(s): 2 ok, 1 failed"
    assert "\x1b" not in out + result.stderr and "\x07" not in out + result.stderr
    assert len(lines[1]) < 400
