"""`gpumedic enroll` on a rented pod, from a clean state, as an operator runs it: the embedded stack
(`gpumedic up`, the remediator enforcing), a pod reached through a jump host (Debian's sshd) as a
non-root user, node-sampler put there with one command; its sampler and supervisor SIGKILLed, so
`node_silent` opens and the remediator brings them back through the supervisor; an upgrade with no
gap in the samples longer than one interval; `unenroll` leaving no file and no process behind."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from gpumedic.enroll.artifact import Platform, build_artifact
from gpumedic.stack import Stack, free_port
from gpumedic_bus import connect
from gpumedic_bus.topology import OBSERVER
from gpumedic_events import NodeSampled
from gpumedic_store import views
from tests.fixtures.nats import SECURED_NODE

pytestmark = [pytest.mark.pods, pytest.mark.sshd]

GPUMEDIC = str(Path(sys.executable).with_name("gpumedic"))
NODE = "pod-1"
INTERVAL_S = 5.0  # node-sampler's default


@pytest.fixture
def pod_client_key(sshd) -> Path:
    """One key for the jump host and the pod: the inventory gives a node one key for both logins."""
    return sshd.client_key


def _gpumedic(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}
    return subprocess.run([GPUMEDIC, *args], capture_output=True, text=True, timeout=timeout, env=env)


async def _until(what: str, check, timeout_s: float):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if found := await check():
            return found
        await asyncio.sleep(1)
    raise AssertionError(f"{what}: not within {timeout_s:g}s")


@pytest.mark.timeout(400)
async def test_a_pod_is_enrolled_through_a_jump_host_healed_through_its_supervisor_upgraded_and_left_clean(pod, sshd, tmp_path):
    var = tmp_path / "var"
    (var / "ssh").mkdir(parents=True)
    shutil.copyfile(sshd.client_key, var / "ssh" / "id_ed25519")
    (var / "ssh" / "id_ed25519").chmod(0o600)
    (var / "ssh" / "known_hosts").write_text(sshd.known_hosts.read_text() + pod.host_key_line + "\n")
    inventory = var / "ssh" / "inventory.yaml"
    inventory.write_text(f"# a rented pod behind a bastion\nnodes:\n  {NODE}: {{host: 127.0.0.1, port: {pod.port}, user: worker, "
                         f"jump: {{host: 127.0.0.1, port: {sshd.port}, user: root}}}}\n")
    files_before, processes_before = pod.files(), pod.processes()

    env = {**{k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}, "GPUMEDIC_REMEDIATOR_MODE": "enforce"}
    async with _up(var, env):
        nc = await connect(Stack.running(var, OBSERVER), "pod-test")
        samples: list[float] = []

        async def on_sample(msg) -> None:
            NodeSampled.from_json(msg.data, subject=msg.subject)
            samples.append(time.monotonic())

        await nc.subscribe(NodeSampled.subject_for(NODE), cb=on_sample)
        store = f"sqlite+aiosqlite:///{var / 'gpumedic.db'}"

        # 1. one command puts the sampler there; it publishes within a minute
        enrolled = await asyncio.to_thread(_gpumedic, "enroll", "--node", NODE, "--var", str(var))
        assert enrolled.returncode == 0, enrolled.stdout + enrolled.stderr
        assert "running under supervisor as worker in /home/worker/.gpumedic" in enrolled.stdout  # /workspace is root's
        assert "service_manager: supervisor" in inventory.read_text() and "# a rented pod behind a bastion" in inventory.read_text()
        await _until("a sample from the pod", lambda: asyncio.sleep(0, bool(samples)), 60)
        checked = await asyncio.to_thread(_gpumedic, "enroll", "--check", "--node", NODE, "--var", str(var))
        assert checked.returncode == 0 and "running under supervisor since" in checked.stdout, checked.stdout
        assert "cannot see: OOM-kill events off" in checked.stdout  # a pod has no /dev/kmsg
        home = "/home/worker/.gpumedic"
        assert pod.sh(f"stat -c '%a %U' {home}/node.env {home}/ca.pem").split("\n")[:2] == ["600 worker", "600 worker"]

        # 2. the sampler and its supervisor killed: node_silent, fixed through the supervisor, resolved
        pod.sh(f"kill -KILL $(cat {home}/run/supervisord.pid) $(pgrep -u worker -f '^/usr/bin/python3 -c from node_sampler')")

        async def silent_resolved():
            async with views.store_session(store) as session:
                rows = await views.list_incidents(session, where=views.IncidentFilter(kind="node_silent", node_id=NODE))
                return rows[0] if rows and rows[0].status == "resolved" else None

        incident = await _until("node_silent resolved", silent_resolved, 150)
        async with views.store_session(store) as session:
            actions = await views.list_actions(session, incident_id=str(incident.id))
        assert [(a.status, a.detail) for a in actions] == [
            ("succeeded", "restarted gpumedic-node-sampler.service (supervisor); active")]
        assert "supervisord" in " ".join(pod.processes())

        # 3. an upgrade: the new version beside the old, one restart, no gap longer than one interval
        machine, python, libc = pod.sh("uname -m; python3 -c 'import platform, sys; print(\"%d.%d\" % sys.version_info[:2]); "
                                       "print(\"%s-%s\" % platform.libc_ver())'").split()
        newer, version = await asyncio.to_thread(build_artifact, Platform.of(machine, python, libc), var / "enroll", label="the next release")
        started = time.monotonic()
        upgraded = await asyncio.to_thread(_gpumedic, "enroll", "--upgrade", "--artifact", str(newer), "--node", NODE, "--var", str(var))
        assert upgraded.returncode == 0 and f"-> {version}" in upgraded.stdout, upgraded.stdout + upgraded.stderr
        await asyncio.sleep(3 * INTERVAL_S)
        during = [t for t in samples if t >= started]
        gaps = [b - a for a, b in zip([started, *during], during)]
        print(f"upgrade: {len(during)} samples in {time.monotonic() - started:.0f}s, largest gap {max(gaps, default=0):.1f}s")
        assert len(during) >= 3 and max(gaps) <= 2 * INTERVAL_S + 1, f"samples {len(during)}, largest gap {max(gaps, default=0):.1f}s"
        assert pod.sh(f"cat {home}/current/VERSION").strip() == version
        assert pod.sh(f"ls {home}/versions").split() == [version]

        # 4. unenroll: every file and process of gpumedic's gone
        removed = await asyncio.to_thread(_gpumedic, "unenroll", "--node", NODE, "--var", str(var))
        assert removed.returncode == 0, removed.stdout + removed.stderr
        assert "service_manager" not in inventory.read_text()
        assert pod.processes() == processes_before
        assert pod.files() == files_before
        await nc.close()


@pytest.mark.timeout(300)
async def test_root_on_a_pod_with_gpumedic_init_credentials_and_one_line_per_node_that_fails(pod, sshd, secured, tmp_path):
    """A compose deployment's credentials (`gpumedic init`), root's login straight to the pod, and
    beside it two nodes that cannot be enrolled: each fails in one line saying why, the rest goes on."""
    deploy = Path(secured(OBSERVER).tls_ca_file).parents[1]  # deploy/secrets
    ssh = tmp_path / "ssh"
    ssh.mkdir()
    key = sshd.client_key  # what the pod authorizes
    # the pod is trusted by the name localhost only; by its address another key is expected (an impostor)
    other_key = pod.host_key_line.replace(pod.host_key_line.split()[2], "AAAAC3NzaC1lZDI1NTE5AAAAIHWq4ChsYHUkCDYcsVOmnAZbRvK9iGTmAdsWZKZEcbAt")
    (ssh / "known_hosts").write_text(pod.host_key_line.replace("[127.0.0.1]", "[localhost]") + "\n" + other_key + "\n")
    inventory = ssh / "inventory.yaml"
    inventory.write_text(f"nodes:\n  {SECURED_NODE}: {{host: localhost, port: {pod.port}, user: root}}\n"
                         f"  impostor: {{host: 127.0.0.1, port: {pod.port}, user: root}}\n"
                         f"  stranger: {{host: localhost, port: {pod.port}, user: nobody2}}\n")
    files_before, processes_before = pod.files(), pod.processes()
    common = ("--inventory", str(inventory), "--known-hosts", str(ssh / "known_hosts"), "--key", str(key), "--var", str(tmp_path / "var"))
    observer = await connect(secured(OBSERVER), "pod-test")
    samples = []

    async def on_sample(msg) -> None:
        samples.append(NodeSampled.from_json(msg.data, subject=msg.subject))

    await observer.subscribe(NodeSampled.subject_for(SECURED_NODE), cb=on_sample)

    enrolled = await asyncio.to_thread(_gpumedic, "enroll", "--all", "--secrets", str(deploy), "--nats-url", secured(OBSERVER).url, *common)
    lines = {line.split()[0]: line for line in enrolled.stdout.splitlines() if line.split() and line.split()[0] != str(inventory) + ":"}
    assert enrolled.returncode == 1, enrolled.stdout + enrolled.stderr
    assert "ok    enrolled" in lines[SECURED_NODE] and "running under supervisor as root in /workspace/.gpumedic" in lines[SECURED_NODE]
    assert "gpumedic_dir: /workspace/.gpumedic" in inventory.read_text()  # the volume a pod restart keeps
    assert "FAIL  host key changed or unknown" in lines["impostor"]
    assert "FAIL  permission denied as nobody2" in lines["stranger"]
    assert "3 node(s): 1 ok, 2 failed" in enrolled.stdout
    await _until("a sample from the pod", lambda: asyncio.sleep(0, bool(samples)), 60)
    again = await asyncio.to_thread(_gpumedic, "enroll", "--node", SECURED_NODE, "--secrets", str(deploy), *common)
    assert again.returncode == 0 and "already enrolled at" in again.stdout and "running (supervisor)" in again.stdout, again.stdout
    assert pod.sh("stat -c '%a %U' /workspace/.gpumedic/node.env").strip() == "600 root"

    removed = await asyncio.to_thread(_gpumedic, "unenroll", "--node", SECURED_NODE, *common)
    assert removed.returncode == 0 and "removed" in removed.stdout, removed.stdout + removed.stderr
    assert "gpumedic_dir" not in inventory.read_text() and "service_manager" not in inventory.read_text()
    assert pod.processes() == processes_before
    assert pod.files() == files_before
    await observer.close()


@pytest.mark.timeout(400)
async def test_a_pod_on_its_own_network_enrolls_into_gpumedic_up_listening_for_it(bridge_pod, sshd, tmp_path):
    """A small team's whole control plane on one machine, and a pod that reaches that machine only
    at ADDR (the Docker bridge's gateway here, a VM's public name for a rented pod). While `gpumedic
    up` listens on loopback, enrolling "works" but no sample comes: enroll says so and fails, and
    `enroll --check` names the sampler's own error. With `up --listen 0.0.0.0 --nats-host ADDR` the
    server certificate names ADDR, the node's credentials point there, and its first sample arrives."""
    pod = bridge_pod
    var = tmp_path / "var"
    (var / "ssh").mkdir(parents=True)
    shutil.copyfile(sshd.client_key, var / "ssh" / "id_ed25519")  # the key the pod accepts (pod_client_key above)
    (var / "ssh" / "id_ed25519").chmod(0o600)
    (var / "ssh" / "known_hosts").write_text(pod.host_key_line + "\n")
    (var / "ssh" / "inventory.yaml").write_text(f"nodes:\n  {NODE}: {{host: {pod.address}, port: 22, user: root}}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}
    refused = subprocess.run([GPUMEDIC, "up", "--listen", "0.0.0.0", "--var", str(var)], env=env, capture_output=True, text=True)
    assert refused.returncode == 2 and "--nats-host NAME" in refused.stderr, refused.stderr

    # 1. the bus on loopback: the pod cannot reach it, and nothing pretends it can
    async with _up(var, env) as said:
        enrolled = await asyncio.to_thread(_gpumedic, "enroll", "--node", NODE, "--var", str(var), "--wait", "25")
        assert enrolled.returncode == 1 and "but no sample reached the bus in time" in enrolled.stdout, enrolled.stdout
        checked = await asyncio.to_thread(_gpumedic, "enroll", "--check", "--node", NODE, "--var", str(var))
        assert checked.returncode == 1 and "failing: gpumedic-node-sampler: no NATS server answers at tls://127.0.0.1:" in checked.stdout, \
            checked.stdout
        removed = await asyncio.to_thread(_gpumedic, "unenroll", "--node", NODE, "--var", str(var))
        assert removed.returncode == 0, removed.stdout + removed.stderr

    # 2. listening where the pod reaches this machine
    port = free_port()
    async with _up(var, env, "--listen", "0.0.0.0", "--nats-host", pod.gateway, "--nats-port", str(port)) as said:
        assert f"nodes reach it at tls://{pod.gateway}:{port}" in said, said
        enrolled = await asyncio.to_thread(_gpumedic, "enroll", "--node", NODE, "--var", str(var))
        assert enrolled.returncode == 0 and "first sample on the bus after" in enrolled.stdout, enrolled.stdout + enrolled.stderr
        assert f"GPUMEDIC_NATS_URL=tls://{pod.gateway}:{port}" in pod.sh("cat /workspace/.gpumedic/node.env")
        checked = await asyncio.to_thread(_gpumedic, "enroll", "--check", "--node", NODE, "--var", str(var))
        assert checked.returncode == 0 and "failing" not in checked.stdout, checked.stdout


@contextlib.asynccontextmanager
async def _up(var: Path, env: dict[str, str], *args: str):
    """`gpumedic up` until the block ends; what it said until it ran."""
    up = subprocess.Popen([GPUMEDIC, "up", "--var", str(var), *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        said = []
        for line in up.stdout:
            said.append(line)
            if line.startswith("[3/3] running"):
                break
        else:
            pytest.fail("gpumedic up did not start:\n" + "".join(said[-20:]))
        yield "".join(said)
    finally:
        up.terminate()
        up.wait(timeout=60)


