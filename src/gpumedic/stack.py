"""The embedded stack: one machine, one command. A real nats-server with JetStream under var/,
provisioned by its admin user, the SQLite store migrated, and the six services as child
processes, each told where the bus and the store are and logging in as its own NATS user over
TLS. The passwords and the TLS material are generated once under var/secrets/ (readable by
their owner only). Stopping is orderly (services first, the bus last) and leaves no process
behind, also when this process dies: children get SIGTERM from the kernel if it does."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import signal
import random
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import nats
from nats.js.errors import BadRequestError

from gpumedic.credentials import TlsFiles, ensure_tls, load_or_create_passwords, new_password, node_env, render_accounts, write_private
from gpumedic.natsd import NatsServer, die_with_parent
from gpumedic.services import SERVICES
from gpumedic_bus import NatsSettings, connect, provision
from gpumedic_bus.provision import wait_for_jetstream
from gpumedic_bus.streams import INCIDENTS
from gpumedic_bus.tasks import stop_tasks
from gpumedic_bus.topology import ADMIN, CONTROL_USERS, OBSERVER, ONE_ACTIVE, SHARED_LOOPS, SIM_FLEET, node_user
from gpumedic_events import NodeSampled, ServiceHeartbeat


REPLICABLE = tuple(sorted(ONE_ACTIVE | set(SHARED_LOOPS)))
"""The services that may run as several processes here: one acts and the others stand by
(`topology.ONE_ACTIVE`), or they share the work (the remediator: its action requests, and its SSH
round by partition). Not the node-sampler (this machine's) nor report-builder (its console has
one port)."""


def service_command(service: str) -> list[str]:
    return [sys.executable, "-c", f"from {SERVICES[service]}.main import run; run()"]


def server_name(n: int) -> str:
    """The name of the stack's `n`-th nats-server (0-based), as its log file and the supervisor say it."""
    return "nats-server" if n == 0 else f"nats-server-{n + 1}"


def sampler_node_id(env: dict[str, str]) -> str:
    """The node id the node-sampler service will report (its NATS user is named after it)."""
    from gpumedic_events.base import default_node_id

    return env.get("GPUMEDIC_SAMPLER_NODE_ID") or os.environ.get("GPUMEDIC_SAMPLER_NODE_ID") or default_node_id()


def nvml_problem() -> str | None:
    """Why this machine's own sampler would see no GPU (no NVIDIA driver, say), or None when NVML answers."""
    try:
        import pynvml

        pynvml.nvmlInit()
        pynvml.nvmlShutdown()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...: NVML names the reason
        return type(exc).__name__ if not str(exc) else f"{type(exc).__name__}: {exc}"
    return None


def services_here(services: Iterable[str] | None = None) -> tuple[list[str], str | None]:
    """`services` less this machine's node-sampler when NVML does not answer here, and why (None:
    all kept). A machine without a usable NVIDIA driver is no node of the fleet: its sampler would
    only open an escalated `nvml_unavailable` for it and count it among the nodes."""
    services = list(SERVICES if services is None else services)
    problem = nvml_problem() if "node-sampler" in services else None
    return [s for s in services if not (problem and s == "node-sampler")], problem


HEALTHY_AFTER_S = 10.0
"""A restarted process that ran this long is healthy again: its next death restarts it at once.
A crash loop dies while starting (bad settings, no bus, a port taken); one killed now and then
after it has run a while (the OOM killer, an operator's kill -9) is not one."""
MAX_BACKOFF_S = 30.0


@dataclass
class _Restart:
    attempts: int = 0
    since: float = 0.0
    """When it was last (re)started (monotonic)."""
    due: float | None = None
    """When the next restart may happen; None while it runs."""


@dataclass
class Stack:
    var_dir: Path
    env: dict[str, str] = field(default_factory=dict)
    """Extra environment for every service (thresholds, modes, file paths)."""
    say: Callable[[str], None] = print
    servers: list[NatsServer] = field(default_factory=list)
    """The nats-server, or the cluster's servers."""
    processes: dict[str, subprocess.Popen] = field(default_factory=dict)
    """Each service process by its name: the service's, then `<service>-2` and on for its replicas."""
    instances: dict[str, int] = field(default_factory=dict)
    """How many processes of a service run (1 unless named; `REPLICABLE` only): a one-active
    service's standbys, or instances that share its per-node work (`topology.SHARED_LOOPS`)."""
    passwords: dict[str, str] = field(default_factory=dict)
    tls: TlsFiles | None = None
    metrics_ports: dict[str, int] = field(default_factory=dict)
    """Each service's Prometheus endpoint on loopback; also in var/prometheus-targets.json."""
    _more_targets: list[dict] = field(default_factory=list)
    """Other endpoints listed there (`add_targets`)."""
    console_url: str | None = None
    """report-builder's web console, on loopback; its token is in `console_token_file`."""
    restarts: dict[str, _Restart] = field(default_factory=dict)
    """What the supervisor restarted (nats-server and services), and when it may try again."""
    _envs: dict[str, dict[str, str]] = field(default_factory=dict)
    _service_of: dict[str, str] = field(default_factory=dict)
    """A process's service, by the process's name."""
    _supervisor: asyncio.Task | None = None
    _stopping: bool = False
    _provision_due: bool = False
    """A server was restarted: its memory streams (the samples) are to be made again."""

    @property
    def store_url(self) -> str:
        """GPUMEDIC_STORE_URL when set (a PostgreSQL of your own), else a SQLite file under the var dir."""
        return os.environ.get("GPUMEDIC_STORE_URL") or f"sqlite+aiosqlite:///{(self.var_dir / 'gpumedic.db').resolve()}"

    @property
    def logs(self) -> Path:
        return self.var_dir / "logs"

    @property
    def secrets(self) -> Path:
        return self.var_dir / "secrets"

    @property
    def console_token_file(self) -> Path:
        return self.secrets / "console-token"

    def _console_env(self) -> dict[str, str]:
        """report-builder's console on a free loopback port (unless the environment names one),
        with a token made once under var/secrets/."""
        if not self.console_token_file.exists():
            write_private(self.console_token_file, new_password() + "\n")
        port = os.environ.get("GPUMEDIC_REPORTS_CONSOLE_PORT") or str(free_port())
        self.console_url = f"http://127.0.0.1:{port}/"
        env = {**os.environ, **self.env}
        return {
            "GPUMEDIC_REPORTS_CONSOLE_PORT": port, "GPUMEDIC_REPORTS_CONSOLE_ADDR": "127.0.0.1",
            "GPUMEDIC_REPORTS_CONSOLE_TOKEN_FILE": str(self.console_token_file.resolve()),
            "GPUMEDIC_REPORTS_CONSOLE_URL": os.environ.get("GPUMEDIC_REPORTS_CONSOLE_URL") or self.console_url,
            # the remediator's inventory also prices the GPU time incidents cost, unless told otherwise
            "GPUMEDIC_REPORTS_INVENTORY": env.get("GPUMEDIC_REPORTS_INVENTORY") or env.get("GPUMEDIC_REMEDIATOR_INVENTORY", ""),
        }

    def start_bus(
        self, *, sim_fleet: bool = False, cluster: int = 1, nodes: Iterable[str] = (), listen: str = "127.0.0.1",
        port: int | None = None, reached_as: Sequence[str] = (),
    ) -> str:
        """Start nats-server with TLS and one user per service (and `sim-fleet` for a simulated fleet);
        with `cluster` > 1, that many servers in one JetStream cluster on loopback, every stream
        and bucket replicated on up to three of them (`provision`). Each of `nodes` (the inventory's)
        gets its own user and `secrets/nodes/NODE.env`, what `gpumedic enroll` puts on the node.

        Nodes elsewhere (rented pods) reach a server that listens on `listen` (an address of this
        machine, or 0.0.0.0) at `port`, by the names or addresses `reached_as`: the server
        certificate names them, and the nodes' NODE.env gives the first."""
        if not 1 <= cluster <= 5:
            raise ValueError(f"a NATS cluster of {cluster} servers: use 1 to 5 (3 is the usual, surviving one loss)")
        if listen != "127.0.0.1" and cluster > 1:
            raise ValueError("a NATS cluster listens on loopback only: for nodes elsewhere run one server (or compose)")
        if listen != "127.0.0.1" and not reached_as:
            raise ValueError(f"nats-server listens on {listen}: say by which name or address the nodes reach this machine "
                             "(--nats-host); it goes into the server certificate")
        self.logs.mkdir(parents=True, exist_ok=True)
        self.secrets.mkdir(mode=0o700, parents=True, exist_ok=True)
        nodes = sorted(set(nodes) - {sampler_node_id(self.env)})
        users = [*CONTROL_USERS, node_user(sampler_node_id(self.env)), *map(node_user, nodes)]
        if sim_fleet:
            users.append(SIM_FLEET)
        self.passwords = load_or_create_passwords(self.secrets / "nats-passwords.json", users)
        self.tls = ensure_tls(self.secrets / "tls", ["localhost", "127.0.0.1", *reached_as, *([listen] if listen != "0.0.0.0" else [])])
        accounts = render_accounts({u: self.passwords[u] for u in users})
        routes = [free_port() for _ in range(cluster)] if cluster > 1 else []
        for n in range(cluster):
            member = ""
            if routes:  # the servers find each other over routes on loopback
                others = ", ".join(f"nats-route://127.0.0.1:{port}" for port in routes)
                member = f"server_name: gpumedic-{n + 1}\ncluster {{\n  name: gpumedic\n  listen: 127.0.0.1:{routes[n]}\n  routes: [{others}]\n}}\n"
            self.servers.append(NatsServer(
                self.var_dir / ("nats" if n == 0 else f"nats-{n + 1}"),
                port=free_port() if routes else (port or -1), host=listen,
                log_file=self.logs / f"{server_name(n)}.log",
                extra_config=member + accounts,
                tls_config=self.tls.server_config(),
            ))
        for server in self.servers:
            server.start()
        url = ",".join(server.url for server in self.servers)
        nodes_url = f"tls://{reached_as[0]}:{self.servers[0].port}" if reached_as else url
        for node in nodes:
            write_private(self.secrets / "nodes" / f"{node}.env", node_env(
                node, url=nodes_url, user=node_user(node), password=self.passwords[node_user(node)], ca_file=str(self.tls.ca.resolve())))
        shape = f"a cluster of {cluster} nats-servers, streams on {self.replicas}" if cluster > 1 else "nats-server"
        self.say(f"  {shape} with JetStream on {url}: TLS, {len(users)} users (secrets in {self.secrets})"
                 + (f"; nodes reach it at {nodes_url}" if reached_as else ""))
        return url

    @property
    def nats(self) -> NatsServer | None:
        """The first server (the one `Stack.running` finds under var/nats/)."""
        return self.servers[0] if self.servers else None

    @property
    def replicas(self) -> int:
        return min(len(self.servers), 3)

    @staticmethod
    def running(var_dir: Path, user: str) -> NatsSettings | None:
        """How to reach the bus of an embedded stack that runs under `var_dir` as `user`, or None
        when none runs there (its server writes its address to a ports file while it is up)."""
        ports = sorted((var_dir / "nats" / "ports").glob("*.ports"))
        secrets = var_dir / "secrets"
        if not ports or not (secrets / "nats-passwords.json").exists():
            return None
        try:
            urls = json.loads(ports[-1].read_text())["nats"]
            # listening on every address (`up --listen 0.0.0.0`) it lists each; loopback is in its certificate
            url = next((u for u in urls if "://127.0.0.1:" in u), urls[0])
            password = json.loads((secrets / "nats-passwords.json").read_text())[user]
        except (OSError, ValueError, KeyError, IndexError):
            return None
        tls = TlsFiles(secrets / "tls")
        return NatsSettings(url=url.replace("nats://", "tls://", 1), user=user, password=password, tls_ca_file=tls.ca)

    def nats_settings(self, user: str) -> NatsSettings:
        assert self.nats is not None and self.tls is not None, "start the bus first"
        url = ",".join(server.url for server in self.servers)
        return NatsSettings(url=url, user=user, password=self.passwords[user], tls_ca_file=self.tls.ca)

    async def connect(self, user: str, **options) -> nats.NATS:
        """A connection as one of the stack's NATS users (tools: `observer`, `sim-fleet`, `admin`)."""
        return await connect(self.nats_settings(user), f"gpumedic-{user}", **options)

    async def provision(self, timeout_s: float = 30.0) -> None:
        """Create the streams, buckets and consumers, as the admin (what `gpumedic provision` does);
        a cluster first elects its JetStream leader."""
        nc = await self.connect(ADMIN, max_reconnect_attempts=3)
        try:
            js = nc.jetstream()
            await wait_for_jetstream(js, timeout_s)
            await provision(js, NatsSettings(), replicas=self.replicas)
        finally:
            await nc.close()
        # The observers' own stream of the incident events, kept from the stack's start, as the
        # example consumers make it: one started after an incident can still read it (START=all).
        # It has the name of gpumedic's own, which the publishes' expected-stream header names.
        observer = await self.connect(OBSERVER, max_reconnect_attempts=3)
        try:
            with contextlib.suppress(BadRequestError):  # made by an earlier start, or by a consumer
                await observer.jetstream().add_stream(name=INCIDENTS.name, subjects=["gpumedic.v1.incident.>"], max_age=7 * 24 * 3600)
        finally:
            await observer.close()

    def service_env(self, service: str) -> dict[str, str]:
        """How one service reaches the bus: its own user, its password, the CA."""
        user = node_user(sampler_node_id(self.env)) if service == "node-sampler" else service
        settings = self.nats_settings(user)
        return {
            "GPUMEDIC_NATS_URL": settings.url,
            "GPUMEDIC_NATS_USER": user,
            "GPUMEDIC_NATS_PASSWORD": self.passwords[user],
            "GPUMEDIC_NATS_TLS_CA_FILE": str(settings.tls_ca_file.resolve()),
        }

    def migrate(self) -> None:
        from gpumedic_store.migrate import upgrade

        upgrade(self.store_url)
        from gpumedic_store.settings import mask_url

        self.say(f"  store migrated: {mask_url(self.store_url)}")

    def add_targets(self, address: str, labels: dict[str, str]) -> None:
        """Another endpoint for Prometheus beside the services' (the simulated fleet's GPU series)."""
        self._more_targets.append({"targets": [address], "labels": labels})
        self._write_targets()

    def _write_targets(self) -> None:
        # Prometheus' file_sd format: point a scrape job's file_sd_configs at it.
        targets = [{"targets": [f"127.0.0.1:{port}"], "labels": {"service": self._service_of.get(name, name)}}
                   for name, port in self.metrics_ports.items()]
        (self.var_dir / "prometheus-targets.json").write_text(json.dumps(targets + self._more_targets, indent=2) + "\n")

    def start_services(self, services: list[str] | None = None) -> None:
        assert self.servers, "start the bus first"
        for service, count in self.instances.items():
            if count != 1 and service not in REPLICABLE:
                raise ValueError(f"{service} runs one process here, not {count} (replicas: {', '.join(REPLICABLE)})")
        base = {**os.environ, "GPUMEDIC_STORE_URL": self.store_url, "PYTHONUNBUFFERED": "1", **self.env}
        names = {}
        for service in services or list(SERVICES):
            for n in range(1, self.instances.get(service, 1) + 1):
                names[service if n == 1 else f"{service}-{n}"] = service
        self._service_of |= names
        if more := [f"{service} x{self.instances[service]}" for service in dict.fromkeys(names.values()) if self.instances.get(service, 1) > 1]:
            self.say(f"  replicas: {', '.join(more)} (logs and metrics per process: <service>-2 and on)")
        for name in names:
            self.metrics_ports[name] = free_port()
        self._write_targets()
        for name, service in names.items():
            metrics = {"GPUMEDIC_METRICS_PORT": str(self.metrics_ports[name]), "GPUMEDIC_METRICS_ADDR": "127.0.0.1"}
            console = self._console_env() if service == "report-builder" else {}
            # Kept for restarts; the instance id too, so a restarted one-active service takes its
            # own lease back at once instead of waiting out the TTL (gpumedic_bus.lease).
            instance = {"GPUMEDIC_INSTANCE_ID": str(uuid.uuid4())}
            # Replicas of the detector share the nodes as cells (zombie_detector.cell); one reads them all.
            cells = {"GPUMEDIC_DETECTOR_CELLS": "true"} if service == "zombie-detector" and self.instances.get(service, 1) > 1 else {}
            self._envs[name] = {**base, **self.service_env(service), **metrics, **console, **instance, **cells}
            self._spawn(name)

    def _spawn(self, name: str) -> None:
        log = open(self.logs / f"{name}.log", "ab")  # noqa: SIM115 (the child owns it)
        self.processes[name] = subprocess.Popen(
            service_command(self._service_of[name]),
            env=self._envs[name],
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches us only; we stop children in order
            preexec_fn=die_with_parent,
        )
        log.close()

    # --- supervision ---------------------------------------------------------------------------

    def start_supervising(self, every_s: float = 1.0) -> None:
        """From now until `stop`, restart what dies (see `tend`)."""

        async def provision_again() -> None:
            self._provision_due = False
            try:
                await self.provision()
            except Exception as exc:  # the server is still starting: the next round tries again
                self._provision_due = True
                self.say(f"  could not provision the restarted bus yet: {exc}")
            else:
                self.say("  provisioned the restarted bus again (its samples stream is kept in memory)")

        async def supervise() -> None:
            provisioning: asyncio.Task | None = None
            try:
                while True:
                    await asyncio.sleep(every_s)
                    self.tend()
                    # In a task of its own: a bus that takes its time to answer must not hold up the
                    # restart of a service that died meanwhile (it held one 10 s under `make chaos`).
                    if self._provision_due and (provisioning is None or provisioning.done()):
                        provisioning = asyncio.create_task(provision_again(), name="gpumedic-provision-again")
            finally:
                if provisioning is not None:
                    provisioning.cancel()

        self._supervisor = asyncio.create_task(supervise(), name="gpumedic-supervisor")

    def tend(self) -> None:
        """Restart what died: the nats-server on its own port and data (the services reconnect), a
        service with the same environment. The first restart is at once; one that dies again
        within HEALTHY_AFTER_S waits 2, 4, ... up to MAX_BACKOFF_S. One line each."""
        if self._stopping:
            return
        now = time.monotonic()
        for n, server in enumerate(self.servers):
            if (code := server.exited) is not None:
                self._revive(server_name(n), code, now, server.start, where=f" on port {server.port}, same data")
                self._provision_due = self._provision_due or server.exited is None
        for service, proc in list(self.processes.items()):
            if (code := proc.poll()) is not None:
                self._revive(service, code, now, lambda s=service: self._spawn(s))

    def _revive(self, name: str, code: int, now: float, start: Callable[[], object], *, where: str = "") -> None:
        restart = self.restarts.setdefault(name, _Restart())
        if restart.due is None:
            if now - restart.since > HEALTHY_AFTER_S or code == 0:
                # healthy for a while, or a clean stop (a lease handed over): no crash loop to slow
                restart.attempts = 0
            wait = 0.0 if restart.attempts == 0 else min(MAX_BACKOFF_S, 2.0 ** restart.attempts)
            restart.due = now + wait
            if wait:
                self.say(f"  {name} exited with {code} again; restarting it in {wait:.0f}s")
        if now < restart.due:
            return
        restart.attempts += 1
        restart.due, restart.since = None, now
        try:
            start()
        except Exception as exc:  # the next round sees it dead and backs off
            self.say(f"  {name} exited with {code} and did not restart: {exc}")
            return
        self.say(f"  {name} exited with {code}; restarted it{where} (restart {restart.attempts})")

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        """Wait for every started service's first `ready` heartbeat (node-sampler's: its first
        sample, since its node's login speaks only for its node), showing which are up."""
        nc = await self.connect(OBSERVER)
        ready: set[str] = set()
        started = set(self._service_of.values())  # a service's standbys beat once they take over
        arrived = asyncio.Event()

        def _up(service: str) -> None:
            if service in started and service not in ready:
                ready.add(service)
                self.say(f"  ready: {service} ({len(ready)}/{len(started)})")
                arrived.set()

        async def _on_heartbeat(msg) -> None:
            with contextlib.suppress(Exception):
                beat = ServiceHeartbeat.from_json(msg.data, subject=msg.subject)
                if beat.state == "ready":
                    _up(beat.service)

        async def _on_sample(_msg) -> None:
            _up("node-sampler")

        await nc.subscribe(ServiceHeartbeat.subject_filter(), cb=_on_heartbeat)
        if "node-sampler" in started:
            await nc.subscribe(NodeSampled.subject_for(sampler_node_id(self.env)), cb=_on_sample)
        deadline = time.monotonic() + timeout_s
        try:
            while len(ready) < len(started):
                self.check_alive()
                left = deadline - time.monotonic()
                if left <= 0:
                    missing = sorted(started - ready)
                    raise TimeoutError(f"not ready after {timeout_s:.0f}s: {', '.join(missing)} (see {self.logs})")
                arrived.clear()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(arrived.wait(), min(left, 0.5))
        finally:
            await nc.close()

    def check_alive(self) -> None:
        for service, proc in self.processes.items():
            if proc.poll() is not None:
                tail = _tail(self.logs / f"{service}.log")
                raise RuntimeError(f"{service} exited with {proc.returncode}; last lines of its log:\n{tail}")

    def stop(self, timeout_s: float = 15.0) -> None:
        self._stopping = True
        if self._supervisor is not None:
            self._supervisor.cancel()
        for proc in self.processes.values():
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + timeout_s
        for service, proc in self.processes.items():
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.send_signal(signal.SIGUSR1)  # where its tasks wait, to its log, before it is killed
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(1.0)
                self.say(f"  {service} did not stop in {timeout_s:.0f}s; killing it; the end of its log:\n"
                         + _tail(self.logs / f"{service}.log", STUCK_TAIL_LINES))
                proc.kill()
                proc.wait()
        self.processes.clear()
        for server in self.servers:
            server.stop()
        self.servers.clear()


def remediator_files(var_dir: Path, say: Callable[[str], None] = print) -> dict[str, str]:
    """The remediator's SSH files for the embedded stack, unless GPUMEDIC_REMEDIATOR_* name others:
    an inventory and known_hosts to fill in, and a client key made once (its public half is
    what the nodes' authorized_keys need)."""
    import asyncssh

    ssh = var_dir / "ssh"
    ssh.mkdir(parents=True, exist_ok=True)
    files = {"INVENTORY": ssh / "inventory.yaml", "KNOWN_HOSTS": ssh / "known_hosts", "CLIENT_KEY": ssh / "id_ed25519"}
    env = {}
    for name, path in files.items():
        if f"GPUMEDIC_REMEDIATOR_{name}" in os.environ:
            continue
        if not path.exists():
            if name == "INVENTORY":
                path.write_text("# node-id: {host: 10.0.0.7, port: 22, user: gpumedic}\nnodes: {}\n")
            elif name == "KNOWN_HOSTS":
                path.write_text("")
            else:
                key = asyncssh.generate_private_key("ssh-ed25519", comment="gpumedic-remediator")
                key.write_private_key(str(path))
                path.chmod(0o600)
                key.write_public_key(str(path) + ".pub")
                say(f"  made the remediator's SSH key; authorize {path}.pub on your nodes")
        env[f"GPUMEDIC_REMEDIATOR_{name}"] = str(path.resolve())
    return env


STUCK_TAIL_LINES = 80
"""Lines of a service's log said when it would not stop: the stacks of the tasks it waited in."""


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def env_json(value) -> str:
    """List and dict settings travel as JSON in the environment (pydantic-settings reads it)."""
    return json.dumps(value)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now, chosen below the kernel's ephemeral range where it can be read:
    a port from that range may be taken by any outgoing connection between this check and the bind
    it is for ("Address already in use", seen when many stacks start at once)."""
    low = _ephemeral_low()
    if low > FIRST_PORT + 1000:
        chance = random.SystemRandom()
        for _ in range(64):
            port = chance.randrange(FIRST_PORT, low)
            with socket.socket() as s:
                try:
                    s.bind((host, port))
                except OSError:
                    continue
                return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


FIRST_PORT = 10_000
"""The lowest port `free_port` picks (above the well-known and most registered services')."""


def _ephemeral_low() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 0


async def wind_down(stack: Stack, *, tasks: Iterable[asyncio.Task] = (), connections: Iterable[nats.NATS] = (),
                    parts: Iterable[object] = ()) -> None:
    """Stop a run on the embedded stack in order: its own tasks, its NATS connections, the stack,
    then the parts it started beside the stack (each has an async `stop`: the simulated fleet, a
    worker pool). The services go before what they watch, or a detector sees the teardown as a
    fault (leader-health opened `quorum_lost` as the simulated peers stopped). A part that fails to
    stop does not keep the rest running."""
    await stop_tasks(tasks)
    for nc in connections:
        with contextlib.suppress(Exception):
            await nc.close()
    stack.stop()
    for part in parts:
        if part is not None:
            with contextlib.suppress(Exception):
                await part.stop()
