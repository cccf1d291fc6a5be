"""Fixtures for the remediator: a real process to kill, a migrated store, settings for the real sshd."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from gpumedic_bus.streams import INCIDENT_STATE
from gpumedic_events import ActionRequested, IncidentKind, KillGpuProcesses, ProcessTarget, operation_gpu
from gpumedic_incidents import IncidentState, IncidentStates, PendingAction, operation_digest
from gpumedic_incidents.state import fingerprint
from gpumedic_store import StoreSettings, upgrade
from remediator.catalogue.kill import parse_stat
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
        """Whether it died of SIGKILL (reaping it); False if it is still running."""
        try:
            return self.proc.wait(timeout=timeout_s) == -signal.SIGKILL
        except subprocess.TimeoutExpired:
            return False

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def sleeper() -> Iterator[Sleeper]:
    process = Sleeper()
    yield process
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
        operation=KillGpuProcesses(gpu_index=gpu, targets=targets, signal="KILL", max_gpu_utilization_pct=5),
        reason=f"zombie job on GPU {gpu}",
        fingerprint=fingerprint(node, IncidentKind.ZOMBIE_JOB, gpu),
        **changes,
    )


def incident_waiting_for(request: ActionRequested, **changes) -> IncidentState:
    """The open incident state under which a detector would have made `request`."""
    values = {
        "incident_id": request.incident_id,
        "kind": IncidentKind.ZOMBIE_JOB,
        "detector": "zombie-detector",
        "node_id": request.node_id,
        "gpu_index": operation_gpu(request.operation),
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
