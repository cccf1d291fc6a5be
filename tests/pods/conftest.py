"""A container in the shape of a rented pod, on a real Docker engine (`make pods-test` starts one).

RunPod's and Vast's pods are containers: Debian or Ubuntu with python3 and sshd, no systemd, no
Docker inside, a `/workspace` volume that outlives a restart (root's), and logins as root and as
a user of the image's. This one is that, built from
Debian's packages with mmdebstrap (no image registry is reachable here) once per engine: sshd on
a free loopback port of the host's network (so the pod reaches the embedded stack's NATS at
127.0.0.1, as a rented pod reaches yours at its address), root and `worker` both authorized.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import asyncssh
import pytest
from gpumedic.stack import free_port

IMAGE = "gpumedic-pod-test:bookworm"
PACKAGES = "python3,openssh-server,procps,ca-certificates"
BOOT = r"""
set -e
useradd -m -s /bin/bash worker
mkdir -p /run/sshd /root/.ssh /home/worker/.ssh /workspace
printf '%s\n' "$AUTHORIZED" > /root/.ssh/authorized_keys
cp /root/.ssh/authorized_keys /home/worker/.ssh/authorized_keys
chown -R worker:worker /home/worker/.ssh
chmod 700 /root/.ssh /home/worker/.ssh
ssh-keygen -A >/dev/null
exec /usr/sbin/sshd -D -e -p "$PORT" -o ListenAddress="${LISTEN:-127.0.0.1}" -o PasswordAuthentication=no
"""


def _docker(*args: str, check: bool = True, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", *args], capture_output=True, text=True, check=check, timeout=timeout)


@pytest.fixture(scope="session")
def pod_image() -> str:
    if shutil.which("docker") is None or _docker("info", check=False).returncode != 0:
        pytest.fail("no Docker engine answers: `make pods-test` starts one (deploy/images/engine.sh ensure)")
    if _docker("image", "inspect", IMAGE, check=False).returncode != 0:
        build = f"mmdebstrap --quiet --variant=minbase --include={PACKAGES} bookworm - | docker import - {IMAGE}"
        subprocess.run(["bash", "-o", "pipefail", "-c", build], check=True, timeout=600)
    return IMAGE


@dataclass
class Pod:
    name: str
    port: int
    host_key_line: str
    """The pod's host key as a known_hosts line."""
    address: str = "127.0.0.1"
    """Where this machine reaches it."""
    gateway: str = ""
    """Where it reaches this machine, on a bridge network."""

    def sh(self, script: str, *, user: str = "root", check: bool = True) -> str:
        return _docker("exec", "-u", user, self.name, "sh", "-c", script, check=check).stdout

    def processes(self) -> list[str]:
        """Every process in the pod but the listing itself: `user command line`."""
        lines = self.sh("ps -eo user=,args=").splitlines()
        return sorted(" ".join(line.split()) for line in lines if "ps -eo" not in line)

    def files(self) -> list[str]:
        """Every file and directory outside /proc, /sys, /dev and /run."""
        found = self.sh("find / -xdev \\( -path /proc -o -path /sys -o -path /dev -o -path /run \\) -prune -o -print")
        return sorted(found.splitlines())


@pytest.fixture
def pod(pod_image: str, tmp_path: Path, request) -> Iterator[Pod]:
    """A fresh pod whose root and worker accept the key of the `pod_client_key` fixture."""
    key: Path = request.getfixturevalue("pod_client_key")
    name = f"gpumedic-pod-{tmp_path.name[-12:].lower().replace('_', '-')}-{free_port()}"
    port = free_port()
    _docker("run", "-d", "--name", name, "--network", "host", "-e", f"PORT={port}",
            "-e", f"AUTHORIZED={key.with_suffix('.pub').read_text().strip()}", pod_image, "sh", "-c", BOOT)
    try:
        for _ in range(100):
            with socket.socket() as sock:
                if sock.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"the pod's sshd did not listen: {_docker('logs', name, check=False).stderr[-500:]}")
        host_key = _docker("exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        yield Pod(name, port, f"[127.0.0.1]:{port} {host_key[0]} {host_key[1]}")
    finally:
        _docker("rm", "-f", name, check=False)


@pytest.fixture
def bridge_pod(pod_image: str, tmp_path: Path, request) -> Iterator[Pod]:
    """A pod on the engine's bridge network, as a rented pod is on its own network: reached at its
    own address (port 22), and reaching this machine only at the bridge's gateway, never at
    127.0.0.1."""
    key: Path = request.getfixturevalue("pod_client_key")
    name = f"gpumedic-bridge-pod-{tmp_path.name[-12:].lower().replace('_', '-')}-{free_port()}"
    _docker("run", "-d", "--name", name, "-e", "PORT=22", "-e", "LISTEN=0.0.0.0",
            "-e", f"AUTHORIZED={key.with_suffix('.pub').read_text().strip()}", pod_image, "sh", "-c", BOOT)
    try:
        network = _docker("inspect", "-f", "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{.Gateway}}{{end}}", name).stdout.split()
        assert len(network) == 2, f"the pod has no bridge address: {network}"
        address, gateway = network
        for _ in range(100):
            with socket.socket() as sock:
                sock.settimeout(0.5)
                if sock.connect_ex((address, 22)) == 0:
                    break
            time.sleep(0.1)
        else:
            pytest.fail(f"the pod's sshd did not listen: {_docker('logs', name, check=False).stderr[-500:]}")
        host_key = _docker("exec", name, "cat", "/etc/ssh/ssh_host_ed25519_key.pub").stdout.split()
        yield Pod(name, 22, f"{address} {host_key[0]} {host_key[1]}", address, gateway)
    finally:
        _docker("rm", "-f", name, check=False)


@pytest.fixture
def pod_client_key(tmp_path: Path) -> Path:
    path = tmp_path / "id_ed25519"
    key = asyncssh.generate_private_key("ssh-ed25519", comment="gpumedic-remediator")
    key.write_private_key(str(path))
    key.write_public_key(str(path.with_suffix(".pub")))
    path.chmod(0o600)
    return path
