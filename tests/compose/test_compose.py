"""compose brought up for real (`make compose-test`, which builds the images first): the control
plane from compose.yaml with the demo fleet of deploy/compose.demo.yaml on a Docker engine, every
health check waited for, one zombie job followed from detection to its verified fix, and the
stack brought down leaving no container, network or volume behind. Once on one nats-server with
the `monitoring` profile (Prometheus and Alertmanager scraping and hearing everything), once on
the three-server cluster of deploy/compose.cluster.yaml with one of its servers killed first.

Jaeger is left out (its image can only be pulled, and no registry is reachable here): it is the
profile `traces`, which this run does not enable, so the services export no spans.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
import ssl
import subprocess
import time
import urllib.request
from pathlib import Path

import asyncssh
import nats
import pytest

from gpumedic.deployment import read_env
from gpumedic.stack import free_port
from gpumedic_bus.topology import CONTROL_PLANE_NODE
from gpumedic_events import ActionCompleted, ActionOutcome, IncidentKind, IncidentOpened, IncidentResolved

pytestmark = [pytest.mark.compose, pytest.mark.timeout(900)]

ROOT = Path(__file__).resolve().parents[2]
NODES = [f"sim-node-0{i}" for i in range(1, 5)]
CONTROL_PLANE = ["nats", "postgres", "zombie-detector", "leader-health", "autoscaler", "remediator", "report-builder", "demo-fleet"]
ZOMBIE_AFTER_S = 45  # time for the test to subscribe once NATS is up; the services are up long before


def _compose_command() -> list[str]:
    if subprocess.run(["docker", "compose", "version"], capture_output=True).returncode == 0:
        return ["docker", "compose"]
    if shutil.which("docker-compose"):
        return ["docker-compose"]
    pytest.fail("neither `docker compose` nor `docker-compose` is installed (Debian: apt-get install docker-compose)")


class Compose:
    """One compose project in its own directory: the repository's compose files, this run's secrets."""

    def __init__(self, directory: Path, overlays: list[str], profiles: list[str] = ()) -> None:
        self.dir = directory
        self.project = f"gpumedic-test-{os.getpid()}"
        self.profiles = list(profiles)
        files = [ROOT / "compose.yaml", *(ROOT / "deploy" / f"compose.{name}.yaml" for name in overlays)]
        self.base = [*_compose_command(), "-p", self.project, "--project-directory", str(directory),
                     *(a for f in files for a in ("-f", str(f))), *(a for name in profiles for a in ("--profile", name))]

    def run(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        done = subprocess.run([*self.base, *args], cwd=self.dir, capture_output=True, text=True, timeout=timeout)
        if check and done.returncode != 0:
            raise AssertionError(f"compose {' '.join(args)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        return done

    def containers(self, service: str) -> list[str]:
        ids = self.run("ps", "-q", service).stdout.split()
        assert ids, f"compose has no container for {service}"
        return ids

    def container(self, service: str) -> str:
        return self.containers(service)[0]

    def health(self, service: str) -> str:
        """The worst health of the service's containers (every instance of a scaled one)."""
        found = []
        for state in (c["State"] for c in json.loads(subprocess.run(["docker", "inspect", *self.containers(service)],
                                                                    capture_output=True, text=True, check=True).stdout)):
            found.append((state.get("Health") or {}).get("Status") or state["Status"])
        return next((h for h in found if h != "healthy"), "healthy")

    def wait_healthy(self, services: list[str], within_s: float) -> None:
        deadline = time.monotonic() + within_s
        states: dict[str, str] = {}
        while time.monotonic() < deadline:
            states = {s: self.health(s) for s in services}
            if all(v == "healthy" for v in states.values()):
                return
            if any(v in ("exited", "dead", "unhealthy") for v in states.values()):
                break
            time.sleep(2)
        raise AssertionError(f"not healthy: {states}\n{self.logs()}")

    def logs(self) -> str:
        return self.run("logs", "--no-color", "--tail", "40", check=False).stdout[-8000:]

    def leftovers(self) -> list[str]:
        label = f"label=com.docker.compose.project={self.project}"
        found = []
        for kind in ("container", "network", "volume"):
            out = subprocess.run(["docker", kind, "ls", "-q", *(["-a"] if kind == "container" else []), "--filter", label],
                                 capture_output=True, text=True, check=True).stdout.split()
            found += [f"{kind} {name}" for name in out]
        return found


@pytest.fixture(params=["single", "cluster"])
def deployment(request, tmp_path: Path):
    """A directory set up as a user would: `gpumedic init` for the demo's nodes, the remediator's key."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        pytest.fail("no Docker engine answers: start dockerd (make compose-test builds the images on it)")
    (tmp_path / "deploy" / "remediator").mkdir(parents=True)
    (tmp_path / "deploy" / "policy").mkdir()
    for name in ("env.example", "nats.conf", "nats-cluster.conf", "prometheus.yml", "prometheus-nodes.json", "prometheus-demo-nodes.json",
                 "alertmanager.yml"):
        shutil.copy(ROOT / "deploy" / name, tmp_path / "deploy" / name)
    key = tmp_path / "deploy" / "remediator" / "id_ed25519"
    key.write_bytes(asyncssh.generate_private_key("ssh-ed25519").export_private_key())
    key.chmod(0o600)
    init = subprocess.run([str(Path(os.sys.executable).parent / "gpumedic"), "init", "--dir", str(tmp_path),
                           *(a for n in NODES for a in ("--node", n))], capture_output=True, text=True)
    assert init.returncode == 0, init.stderr
    # free host ports, so a stack already on 4222 or 8470 (or another run) does not collide
    ours = {"GPUMEDIC_NATS_PORT": free_port(), "GPUMEDIC_CONSOLE_PORT": free_port(), "GPUMEDIC_DEMO_ZOMBIE_AFTER_S": ZOMBIE_AFTER_S}
    monitoring = request.param == "single"  # Prometheus and Alertmanager from the `monitoring` profile, once
    if monitoring:
        ours |= {"GPUMEDIC_PROMETHEUS_PORT": free_port(), "GPUMEDIC_ALERTMANAGER_PORT": free_port(),
                 "GPUMEDIC_REPORTS_ALERTMANAGER_URL": "http://alertmanager:9093"}
    env_file = tmp_path / ".env"
    lines = [line for line in env_file.read_text().splitlines() if line.split("=", 1)[0] not in ours]
    env_file.write_text("\n".join([*lines, *(f"{k}={v}" for k, v in ours.items())]) + "\n")
    compose = Compose(tmp_path, ["demo", "cluster"] if request.param == "cluster" else ["demo"], ["monitoring"] if monitoring else [])
    compose.cluster = request.param == "cluster"
    yield compose
    compose.run("down", "--volumes", "--remove-orphans", "--timeout", "20", check=False)
    left = compose.leftovers()
    assert not left, f"compose down left {left}"


async def test_compose_stack_fixes_a_zombie_from_detection_to_verified_fix(deployment: Compose):
    env = {k: v for k, v, _ in read_env(deployment.dir / ".env") if k}
    # two instances of the detector (one active, one standby) and of the remediator (sharing)
    deployment.run("up", "-d", "--no-build", "--scale", "zombie-detector=2", "--scale", "remediator=2", timeout=600)
    deployment.wait_healthy(["nats"], within_s=120)

    # The story, as an operator's own consumer would read it: the observer user, over TLS.
    nc = await nats.connect(
        f"tls://127.0.0.1:{env['GPUMEDIC_NATS_PORT']}", user="observer", password=env["OBSERVER_NATS_PASSWORD"],
        tls=ssl.create_default_context(cafile=str(deployment.dir / "deploy/secrets/tls/ca.pem")),
        tls_hostname="localhost",
    )
    seen: asyncio.Queue = asyncio.Queue()
    for event_type in (IncidentOpened, ActionCompleted, IncidentResolved):
        async def on_event(msg, event_type=event_type) -> None:
            seen.put_nowait(event_type.from_json(msg.data, subject=msg.subject))
        await nc.subscribe(event_type.subject_filter(), cb=on_event)
    try:
        deployment.wait_healthy(CONTROL_PLANE + (["nats-2", "nats-3"] if deployment.cluster else []), within_s=240)
        for one_shot in ("provision", "migrate"):
            state = json.loads(subprocess.run(["docker", "inspect", deployment.container(one_shot)],
                                              capture_output=True, text=True, check=True).stdout)[0]["State"]
            assert (state["Status"], state["ExitCode"]) == ("exited", 0), f"{one_shot}: {state}"
        if deployment.cluster:
            await _check_replicated_then_kill_one(deployment, env)

        opened = completed = resolved = None
        bus_incidents: dict = {}
        ids: set = set()
        deadline = time.monotonic() + ZOMBIE_AFTER_S + 120
        while resolved is None:
            try:
                event = await asyncio.wait_for(seen.get(), max(0.1, deadline - time.monotonic()))
            except TimeoutError:
                raise AssertionError(f"no verified fix: opened={opened} completed={completed}\n{deployment.logs()}") from None
            # An event published again keeps its id (a detector re-sends its outbox after the server it
            # used went away): JetStream de-duplicates it, a plain subscriber sees it twice.
            if event.event_id in ids or _the_killed_server(deployment, event, bus_incidents):
                ids.add(event.event_id)
                continue
            ids.add(event.event_id)
            if isinstance(event, IncidentOpened):
                assert (event.kind, event.node_id, event.gpu_index) == ("zombie_job", "sim-node-02", 0), event
                assert opened is None, f"a second incident for the one zombie: {event}"
                opened = event
            elif isinstance(event, ActionCompleted) and opened and event.incident_id == opened.incident_id:
                completed = event
            elif isinstance(event, IncidentResolved) and opened and event.incident_id == opened.incident_id:
                resolved = event
        # the kill travelled over SSH to the fleet's container, the host key verified, and worked
        assert completed is not None and completed.outcome == ActionOutcome.SUCCEEDED, completed
        assert any(step.startswith("kill -s ") for step in completed.steps), completed.steps
        assert resolved.resolution == "fixed", resolved
        await asyncio.sleep(3)  # a doubled incident or action would have arrived by now
        doubled = [e for e in _drain(seen) if isinstance(e, IncidentOpened | ActionCompleted) and e.event_id not in ids
                   and not _the_killed_server(deployment, e, bus_incidents)]
        assert not doubled, doubled

        # report-builder recorded it in PostgreSQL: the console (published on loopback) shows it.
        url = f"http://127.0.0.1:{env['GPUMEDIC_CONSOLE_PORT']}/incidents/{opened.incident_id}"
        for _ in range(30):
            with urllib.request.urlopen(url, timeout=5) as page:
                text = page.read().decode()
            if "resolved" in text.lower():
                break
            await asyncio.sleep(1)
        assert "sim-node-02" in text and "resolved" in text.lower(), text[:2000]
        if "monitoring" in deployment.profiles:
            await _check_monitoring(deployment, env)
    finally:
        await nc.close()


async def _check_monitoring(deployment: Compose, env: dict[str, str]) -> None:
    """The `monitoring` profile as shipped: Prometheus scrapes every service, each replica, and the (demo) GPU
    nodes with every target up, NVIDIA's dashboard's series come one per GPU under the node ids,
    and Alertmanager received the zombie's incident from report-builder, firing and then resolved."""
    deployment.wait_healthy(["prometheus", "alertmanager"], within_s=120)
    prometheus = f"http://127.0.0.1:{env['GPUMEDIC_PROMETHEUS_PORT']}"

    def get(url: str) -> dict:
        with urllib.request.urlopen(url, timeout=5) as answer:
            return json.loads(answer.read())

    targets: list = []
    for _ in range(60):  # a scrape every 15 s
        targets = get(f"{prometheus}/api/v1/targets")["data"]["activeTargets"]
        replicas = [t for t in targets if t["labels"]["job"] == "gpumedic"]  # found by DNS, one per container
        if targets and all(t["health"] == "up" for t in targets) and len(replicas) == 7:
            break
        await asyncio.sleep(2)
    health = {(t["labels"]["job"], t["labels"]["instance"]): t["health"] for t in targets}
    assert health and set(health.values()) == {"up"}, health
    assert {job for job, _ in health} == {"gpumedic", "gpumedic-nodes"}, health
    assert len([job for job, _ in health if job == "gpumedic"]) == 7, health  # five services, two of them twice
    series = get(f"{prometheus}/api/v1/query?query=DCGM_FI_DEV_GPU_TEMP")["data"]["result"]
    assert sorted((s["metric"]["Hostname"], s["metric"]["gpu"]) for s in series) == [(n, g) for n in NODES for g in ("0", "1")]

    alertmanager = f"http://127.0.0.1:{env['GPUMEDIC_ALERTMANAGER_PORT']}"
    received: dict[str, float] = {}
    for _ in range(30):  # report-builder posts within a second of an incident, and every 30 s
        with urllib.request.urlopen(f"{alertmanager}/metrics", timeout=5) as answer:
            for line in answer.read().decode().splitlines():
                if line.startswith("alertmanager_alerts_received_total{"):
                    status = line.split('status="', 1)[1].split('"', 1)[0]
                    received[status] = received.get(status, 0) + float(line.rsplit(" ", 1)[1])
        if received.get("firing") and received.get("resolved"):
            break
        await asyncio.sleep(2)
    assert received.get("firing") and received.get("resolved"), received


async def _check_replicated_then_kill_one(deployment: Compose, env: dict[str, str]) -> None:
    """Every stream is on three servers; then one server is killed (SIGKILL, and compose does not
    bring back a container the engine was told to kill), before the zombie is injected."""
    admin = await nats.connect(
        f"tls://127.0.0.1:{env['GPUMEDIC_NATS_PORT']}", user="admin", password=env["ADMIN_NATS_PASSWORD"],
        tls=ssl.create_default_context(cafile=str(deployment.dir / "deploy/secrets/tls/ca.pem")), tls_hostname="localhost",
    )
    try:
        js = admin.jetstream()
        streams = await js.streams_info()
        assert streams and {s.config.num_replicas for s in streams} == {3}, [(s.config.name, s.config.num_replicas) for s in streams]
    finally:
        await admin.close()
    subprocess.run(["docker", "kill", deployment.container("nats-2")], check=True, capture_output=True)


def _the_killed_server(deployment: Compose, event, bus_incidents: dict) -> bool:
    """On the cluster, the samples in flight to the killed server go unacknowledged, and the
    detector says so: one `samples_lost` on the control plane (never a node's incident), perhaps
    one `control_plane_behind` while a consumer's stream moves, and the escalations and
    resolutions that follow. Anything else is the test's business."""
    if not deployment.cluster:
        return False
    if isinstance(event, IncidentOpened) and event.node_id == CONTROL_PLANE_NODE and event.incident_id not in bus_incidents:
        assert event.kind in (IncidentKind.SAMPLES_LOST, IncidentKind.CONTROL_PLANE_BEHIND), event
        assert event.kind not in bus_incidents.values(), f"a second {event.kind} for one killed server: {event}"
        bus_incidents[event.incident_id] = event.kind
    return getattr(event, "incident_id", None) in bus_incidents


def _drain(queue: asyncio.Queue) -> list:
    items = []
    while not queue.empty():
        items.append(queue.get_nowait())
    return items
