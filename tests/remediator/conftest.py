"""Fixtures for the remediator: a real process to kill, a migrated store, settings for the real sshd."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import select

from gpumedic_bus import Delivery
from gpumedic_bus.streams import INCIDENT_STATE
from gpumedic_bus.topology import owner_of
from gpumedic_events import ActionCompleted, ActionRequested, IncidentKind, KillGpuProcesses, ProcessTarget, operation_gpu
from gpumedic_incidents import IncidentState, IncidentStates, PendingAction, operation_digest
from gpumedic_incidents.policy import Kinds
from gpumedic_incidents.state import fingerprint
from gpumedic_nodes.ssh import SshExecutor
from gpumedic_store import ActionRecord, BreakerTrip, StoreSettings, create_engine, session_factory, upgrade
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator import repository
from remediator.catalogue.kill import parse_stat
from remediator.handlers import ActionHandler
from remediator.main import gate_of
from remediator.settings import Settings


class Sleeper:
    """A real `sleep 300` child of the test process: something the remediator may kill."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(["sleep", "300"])
        self.pid = self.proc.pid
        self.start_ticks = parse_stat(Path(f"/proc/{self.pid}/stat").read_text()).start_ticks
        self.command = "sleep 300"

    def target(self, **changes) -> ProcessTarget:
        return ProcessTarget(**{"pid": self.pid, "start_ticks": self.start_ticks, "command": self.command, **changes})

    def killed(self, timeout_s: float = 5.0) -> bool:
        """Whether it died of the remediator's SIGTERM or SIGKILL (reaping it); False if it is still running."""
        try:
            return self.proc.wait(timeout=timeout_s) in (-signal.SIGTERM, -signal.SIGKILL)
        except subprocess.TimeoutExpired:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def sleeper(sshd) -> Iterator[Sleeper]:
    """A `sleep 300` that holds GPU 0 of the test sshd's node (its /dev/nvidia0, as fuser says)."""
    process = Sleeper()
    sshd.hold(0, process.pid)
    yield process
    sshd.release(0, process.pid)
    process.stop()


@pytest.fixture
def store_url(tmp_path) -> str:
    """A SQLite store file migrated to head."""
    url = f"sqlite+aiosqlite:///{tmp_path}/store/gpumedic.db"
    upgrade(url)
    return url


@pytest.fixture
def make_settings(sshd, store_url) -> Callable[..., Settings]:
    """Settings for the real sshd and the migrated store; enforce mode unless told otherwise."""

    def _make(**changes) -> Settings:
        values = {
            "store": StoreSettings(url=store_url),
            "inventory": sshd.inventory,
            "known_hosts": sshd.known_hosts,
            "client_key": sshd.client_key,
            "mode": "enforce",
            "connect_timeout_s": 5.0,
            "command_timeout_s": 5.0,
            "verify_timeout_s": 5.0,
            # The inventory names one node while the tests send requests for many: the count limit only.
            "breaker_max_share": 1.0,
            **changes,
        }
        return Settings(**values)

    return _make


def kill_request(
    *targets: ProcessTarget, node: str = "gpu-node-01", attempt: int = 1, incident_id=None, gpu: int = 0, **changes
) -> ActionRequested:
    """A request as the zombie-detector makes it (see `open_incident` for the incident it needs)."""
    return ActionRequested(
        source="zombie-detector",
        action_id=uuid.uuid4(),
        incident_id=incident_id or uuid.uuid4(),
        node_id=node,
        attempt=attempt,
        operation=KillGpuProcesses(gpu_index=gpu, targets=targets, signal="TERM", grace_s=10, max_gpu_utilization_pct=4),
        reason=f"zombie job on GPU {gpu}",
        fingerprint=fingerprint(node, IncidentKind.ZOMBIE_JOB, gpu),
        **changes,
    )


def incident_waiting_for(request: ActionRequested, **changes) -> IncidentState:
    """The open incident state under which a detector would have made `request`: the kind its
    fingerprint names (a zombie job without one), that kind's detector, and the ladder step of the
    default policy that asks for its operation (an undrain: a drained incident, validated)."""
    parts = (request.fingerprint or "").split("/")
    kind = IncidentKind(parts[1]) if len(parts) > 1 else IncidentKind.ZOMBIE_JOB
    gpu = operation_gpu(request.operation)
    if len(parts) > 2:
        gpu = None if parts[2] == "node" else int(parts[2])
    name = request.operation.operation
    ladder = [step.action for step in Kinds().of(kind).ladder]
    where = {"drained": True, "resolution": "fixed", "step": len(ladder) - 1} if name == "undrain_node" else {
        "step": ladder.index(name) if name in ladder else 0
    }
    values = {
        "incident_id": request.incident_id,
        "kind": kind,
        "detector": owner_of(kind, parts[3] if len(parts) > 3 else None) or request.source,
        "node_id": request.node_id,
        "gpu_index": gpu,
        "key": parts[3] if len(parts) > 3 else None,
        **where,
        "opened_at": datetime.now(UTC),
        "last_seen_at": datetime.now(UTC),
        "attempt": request.attempt,
        "phase": "acting",
        "deadline": None,
        "pending_action": PendingAction(
            action_id=request.action_id,
            attempt=request.attempt,
            operation_sha256=operation_digest(request.operation),
            requested_at=datetime.now(UTC),
        ),
        **changes,
    }
    return IncidentState(**values)


@pytest.fixture
async def incidents(js) -> IncidentStates:
    """The real incident-state bucket on the test's nats-server, emptied."""
    await js.purge_stream(f"KV_{INCIDENT_STATE.bucket}")
    return await IncidentStates.open(js)


@pytest.fixture
def open_incident(incidents) -> Callable:
    """`await open_incident(request)`: store the incident `request` belongs to, waiting for it."""

    async def _open(request: ActionRequested, **changes) -> IncidentState:
        state = incident_waiting_for(request, **changes)
        await incidents.save(state)
        return state

    return _open


def inventory_naming(sshd, directory: Path, nodes: Iterable[str]) -> Path:
    """The test sshd's inventory plus `nodes` on a closed port of loopback: named, so the gate lets
    actions on them through, and each fails when it connects (connection refused)."""
    path = directory / "inventory-wide.yaml"
    extra = "".join(f"  {node}: {{host: 127.0.0.1, port: 9, user: root}}\n" for node in nodes)
    path.write_text(sshd.inventory.read_text() + extra)
    return path


@dataclass
class _Published:
    data: bytes
    subject: str
    headers: dict

    @property
    def event(self) -> ActionCompleted:
        return ActionCompleted.from_json(self.data, subject=self.subject)


@dataclass
class _RecordingBroker:
    published: list[_Published] = field(default_factory=list)

    async def publish(self, data, subject, *, headers=None, stream=None, timeout=None):
        self.published.append(_Published(data, subject, dict(headers or {})))


class Harness:
    """The action handler on a recorder broker: what it answers, and what its ledger keeps."""

    def __init__(self, settings: Settings, incidents: IncidentStates, executor=None) -> None:
        self.settings = settings
        self.incidents = incidents
        self.engine = create_engine(settings.store.url)
        self.sessions = session_factory(self.engine)
        self.broker = _RecordingBroker()
        self.handler = ActionHandler(
            settings=settings, gate=gate_of(settings, settings.policy.load()),
            runtime=SimpleNamespace(broker=self.broker, metrics=ServiceMetrics("remediator")),
            sessions=self.sessions,
            executor=executor
            or SshExecutor(
                inventory=settings.inventory,
                known_hosts=settings.known_hosts,
                client_key=settings.client_key,
                connect_timeout_s=settings.connect_timeout_s,
                command_timeout_s=settings.command_timeout_s,
            ),
            tracer=TracerProvider().get_tracer("test"),
            incidents=incidents,
        )

    async def open(self, request: ActionRequested, **changes) -> ActionRequested:
        """Store the open incident a detector would have made `request` for."""
        await self.incidents.save(incident_waiting_for(request, **changes))
        return request

    async def handle(self, request: ActionRequested, deliveries: int = 1) -> ActionCompleted:
        before = len(self.broker.published)
        await self.handler.handle(request, Delivery(request.subject, {}, deliveries))
        assert len(self.broker.published) == before + 1
        published = self.broker.published[-1]
        assert published.headers["Nats-Msg-Id"] == str(published.event.event_id)
        assert published.event.request_sha256 == request.request_sha256
        return published.event

    async def record(self, action_id) -> ActionRecord:
        async with self.sessions() as session:
            return await repository.get_action(session=session, action_id=action_id)

    async def trips(self) -> list[BreakerTrip]:
        async with self.sessions() as session:
            return list((await session.scalars(select(BreakerTrip).order_by(BreakerTrip.id))).all())


@pytest.fixture
async def harness(make_settings, incidents):
    made: list[Harness] = []

    def _make(**changes) -> Harness:
        made.append(Harness(make_settings(**changes), incidents))
        return made[-1]

    yield _make
    for item in made:
        await item.engine.dispose()
