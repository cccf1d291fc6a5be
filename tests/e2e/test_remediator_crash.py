"""Killing the remediator with SIGKILL mid-action and restarting it neither runs the action a
second time nor loses the incident: the ledger recorded the action before it ran, so the
redelivered request is answered `interrupted`, and the detector verifies from the samples."""

from __future__ import annotations

import asyncio
import signal
import uuid

import pytest

from gpumedic_store import ActionRecord, create_engine, session_factory
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import start_service_process
from tests.e2e.test_thin_path import TEST_POLICY, detector, wait_for_incident


async def _wait_until(predicate, timeout_s: float, what: str) -> None:
    for _ in range(int(timeout_s / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.timeout(240)
async def test_sigkill_mid_action_then_restart_runs_nothing_twice_and_keeps_the_incident(
    nats_settings, store_url, fleet, sampling, apps, tmp_path
):
    env = {
        "GPUMEDIC_NATS_URL": nats_settings.url,
        "GPUMEDIC_NATS_ACK_WAIT_S": "2",
        "GPUMEDIC_STORE_URL": store_url,
        "GPUMEDIC_REMEDIATOR_MODE": "enforce",
        "GPUMEDIC_REMEDIATOR_INVENTORY": str(fleet.inventory_path),
        "GPUMEDIC_REMEDIATOR_KNOWN_HOSTS": str(fleet.known_hosts_path),
        "GPUMEDIC_REMEDIATOR_CLIENT_KEY": str(fleet.client_key_path),
        "GPUMEDIC_REMEDIATOR_TRACE_TO_BUS": "true",
        # Restarted as a supervisor restarts it: the same instance, which takes its own lease back at once.
        "GPUMEDIC_INSTANCE_ID": str(uuid.uuid4()),
    }
    log = tmp_path / "remediator.log"
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, trace_to_bus=True)))
    # Two remediator starts on a loaded machine take most of the test policy's 30 s: this run gives
    # the answer the detector waits for a minute and a half, as the shipped policy gives five.
    policy = TEST_POLICY.model_copy(update={"kinds": TEST_POLICY.kinds.model_copy(update={
        "zombie_job": TEST_POLICY.kinds.zombie_job.model_copy(update={"action_timeout_s": 90.0})})})
    await apps.start(detector(nats_settings, policy))
    first = start_service_process("remediator", env, log)
    second = None
    try:
        await _wait_until(lambda: log.exists() and "remediator ready" in log.read_text(), 60, "the remediator to start")
        node = fleet.node("sim-node-02")
        node.ssh_stalls["kill"] = 3.0  # the kill hangs on the node: the remediator is mid-action
        hung = node.inject_zombie(0)
        kill = f"kill -s TERM {hung.pid}"

        await _wait_until(lambda: kill in node.ssh_commands, 45, "the remediator to send the kill")
        first.send_signal(signal.SIGKILL)
        assert first.wait(10) == -signal.SIGKILL

        second = start_service_process("remediator", env, log)
        incident, timeline, _ = await wait_for_incident(store_url, "resolved", timeout_s=90.0)
    finally:
        for proc in (first, second):
            if proc is not None and proc.poll() is None:
                proc.terminate()
                proc.wait(15)

    assert node.ssh_commands.count(kill) == 1, node.ssh_commands
    assert incident.resolution == "fixed"
    outcomes = [e.summary for e in timeline if e.event_type == "ActionCompleted"]
    assert len(outcomes) == 1 and outcomes[0].startswith("action interrupted"), outcomes

    engine = create_engine(store_url)
    try:
        async with session_factory(engine)() as session:
            (action,) = (await session.execute(ActionRecord.__table__.select())).all()
    finally:
        await engine.dispose()
    assert action.status == "interrupted" and action.attempt == 1
