"""Fixtures for the remediator: a real process to kill, a migrated store, settings for the real sshd."""

from __future__ import annotations

import signal
import subprocess
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from gpumedic_events import ActionRequested, KillGpuProcesses, ProcessTarget
from gpumedic_store import StoreSettings, upgrade
from remediator.catalogue import parse_stat
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
            **changes,
        }
        return Settings(**values)

    return _make


def kill_request(*targets: ProcessTarget, node: str = "gpu-node-01", attempt: int = 1, incident_id=None) -> ActionRequested:
    return ActionRequested(
        source="zombie-detector",
        action_id=uuid.uuid4(),
        incident_id=incident_id or uuid.uuid4(),
        node_id=node,
        attempt=attempt,
        operation=KillGpuProcesses(gpu_index=0, targets=targets, signal="KILL"),
        reason="zombie job on GPU 0",
    )
