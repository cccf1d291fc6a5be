"""The remediator as deployed (`create_app`), its handlers on the in-memory bus
(tests/fixtures/memory.py) over a real SQLite store: a request it must refuse comes in through its
pull consumer and its refusal goes out, recorded; a pre-flight check is asked and answered in
memory. What reaches a node over SSH is the real sshd's tests' (tests/remediator/test_service.py)."""

from __future__ import annotations

import uuid

import asyncssh

from gpumedic_bus import NatsSettings
from gpumedic_events import (
    PREFLIGHT_SUBJECT, ActionCompleted, ActionOutcome, ActionRequested, IncidentKind, KillGpuProcesses, PreflightReport,
    PreflightRequest, ProcessTarget,
)
from gpumedic_incidents.state import fingerprint
from gpumedic_store import StoreSettings, upgrade
from remediator.main import create_app
from remediator.settings import Settings
from tests.fixtures.memory import MemoryBus


def settings(tmp_path) -> Settings:
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    (tmp_path / "inventory.yaml").write_text("nodes:\n  gpu-node-07: {host: 127.0.0.1, port: 1, user: root}\n")
    (tmp_path / "known_hosts").write_text("")
    asyncssh.generate_private_key("ssh-ed25519").write_private_key(str(tmp_path / "client_key"))
    return Settings(nats=NatsSettings(url="nats://127.0.0.1:1"), store=StoreSettings(url=url), mode="enforce",
                    inventory=tmp_path / "inventory.yaml", known_hosts=tmp_path / "known_hosts", client_key=tmp_path / "client_key",
                    ssh_check_interval_s=0)


async def test_a_request_no_open_incident_waits_for_is_refused_and_nothing_runs(tmp_path):
    request = ActionRequested(
        source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id="gpu-node-07", attempt=1,
        operation=KillGpuProcesses(gpu_index=0, targets=(ProcessTarget(pid=4242, start_ticks=777, command="python train.py"),),
                                   signal="TERM", grace_s=10, max_gpu_utilization_pct=4),
        reason="zombie job on GPU 0", fingerprint=fingerprint("gpu-node-07", IncidentKind.ZOMBIE_JOB, 0),
    )
    async with MemoryBus(create_app(settings(tmp_path))) as bus:
        await bus.publish(request)
        (completed,) = bus.of(ActionCompleted)
    assert completed.action_id == request.action_id and completed.outcome is ActionOutcome.BLOCKED
    assert "incident" in completed.detail


async def test_a_preflight_of_a_node_the_inventory_does_not_name_is_answered_with_what_was_wrong(tmp_path):
    async with MemoryBus(create_app(settings(tmp_path))) as bus:
        answer = await bus.request(PREFLIGHT_SUBJECT, PreflightRequest(node_id="gpu-node-99").to_json())
    report = PreflightReport.model_validate_json(answer)
    assert report.node_id == "gpu-node-99" and not report.ready
    assert "gpu-node-99" in report.error and "inventory" in report.error
