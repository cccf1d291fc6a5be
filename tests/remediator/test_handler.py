"""The handler's safety order against a real SQLite ledger, the real sshd and the real
incident-state bucket on a nats-server; only publishing is replaced (by a recorder): what
reaches JetStream, and when, is tested in test_service.py."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import uuid
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import pytest

from gpumedic_bus import Delivery
from gpumedic_events import ActionCompleted, ActionOutcome, ActionRequested, IncidentKind, ProcessTarget
from gpumedic_incidents import FLEET_NODE, IncidentState, PolicySettings, fleet_fingerprint, load_policy
from gpumedic_incidents.policy import KillPolicy, dump_policy
from gpumedic_nodes.inventory import NodeAddress
from gpumedic_nodes.ssh import NodeUnreachable
from gpumedic_store import ActionRecord, StoreSettings, StoreUnavailable, breaker
from remediator import repository
from remediator.catalogue import CommandResult
from remediator.handlers import INTERRUPTED_DETAIL, completed_event
from tests.remediator.conftest import Harness as _Harness
from tests.remediator.conftest import incident_waiting_for, inventory_naming, kill_request

GPU_QUERY = "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id=0"
HOLDERS = ("nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=0", "fuser /dev/nvidia0")

pytestmark = pytest.mark.sshd


async def test_kills_records_and_answers_once(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target()))
    completed = await h.handle(request)
    assert sleeper.killed()
    assert completed.outcome is ActionOutcome.SUCCEEDED, completed.detail
    assert completed.source == "remediator"
    assert (completed.action_id, completed.incident_id, completed.node_id, completed.attempt) == (
        request.action_id, request.incident_id, request.node_id, request.attempt,
    )
    pid = sleeper.pid
    assert completed.steps == (GPU_QUERY, *HOLDERS, f"cat /proc/{pid}/stat", f"cat /proc/{pid}/cmdline", f"kill -s TERM {pid}", f"cat /proc/{pid}/stat")
    record = await h.record(request.action_id)
    assert record.status == "succeeded" and record.steps == list(completed.steps)
    assert record.finished_at is not None and record.started_at <= record.finished_at


async def test_a_repeated_request_is_answered_from_the_ledger_not_run_again(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target()))
    first = await h.handle(request)
    assert sleeper.killed()
    sent_before = len(sshd.commands())
    again = await h.handle(request, deliveries=2)
    assert len(sshd.commands()) == sent_before  # nothing reached the node
    assert again == first
    assert h.broker.published[-1].data == h.broker.published[-2].data  # byte for byte


async def test_an_action_left_executing_is_marked_interrupted_never_rerun(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target()))
    async with h.sessions() as session:  # a remediator that let it through and died
        await repository.record(session=session, request=request, status="executing", detail="", now=datetime.now(UTC))
        await session.commit()
    sent_before = len(sshd.commands())
    completed = await h.handle(request, deliveries=2)
    assert completed.outcome is ActionOutcome.INTERRUPTED
    assert completed.detail == INTERRUPTED_DETAIL
    assert len(sshd.commands()) == sent_before
    assert sleeper.alive()
    assert (await h.record(request.action_id)).status == "interrupted"
    # And once interrupted it stays answered the same way.
    assert await h.handle(request, deliveries=3) == completed


async def test_observe_mode_records_what_it_would_run(harness, sshd, sleeper):
    h = harness(mode="observe")
    completed = await h.handle(await h.open(kill_request(sleeper.target())))
    assert completed.outcome is ActionOutcome.OBSERVED
    pid = sleeper.pid
    assert completed.detail == (
        "observe mode for kill_gpu_processes (the remediator runs in observe mode): decided and recorded, not run; would run: "
        f"{GPU_QUERY}; {HOLDERS[0]}; {HOLDERS[1]}; cat /proc/{pid}/stat; cat /proc/{pid}/cmdline; kill -s TERM {pid}; kill -s KILL {pid}"
    )
    assert completed.steps == ()
    assert sleeper.alive()
    assert not sshd.commands_about(pid)


async def test_the_policy_file_holds_one_operation_in_observe_mode(harness, sleeper, tmp_path):
    policy = load_policy()
    actions = policy.actions.model_copy(update={"kill_gpu_processes": KillPolicy(mode="observe")})
    dump_policy(policy.model_copy(update={"actions": actions}), tmp_path / "policy.yaml")
    h = harness(mode="enforce", policy=PolicySettings(file=tmp_path / "policy.yaml"))
    completed = await h.handle(await h.open(kill_request(sleeper.target())))
    assert completed.outcome is ActionOutcome.OBSERVED
    assert "the policy's actions.kill_gpu_processes.mode is observe" in completed.detail
    assert sleeper.alive()


async def test_protected_node_is_blocked(harness, sleeper):
    h = harness(protected_nodes={"gpu-node-01"})
    completed = await h.handle(await h.open(kill_request(sleeper.target())))
    assert completed.outcome is ActionOutcome.BLOCKED
    assert completed.detail == "node gpu-node-01 is protected; actions on it need a person"
    assert sleeper.alive()


async def test_one_action_per_node_at_a_time(harness, sleeper):
    h = harness()
    running = kill_request(sleeper.target())
    async with h.sessions() as session:
        await repository.record(session=session, request=running, status="executing", detail="", now=datetime.now(UTC))
        await session.commit()
    completed = await h.handle(await h.open(kill_request(sleeper.target())))
    assert completed.outcome is ActionOutcome.BLOCKED
    assert completed.detail == f"action {running.action_id} is already executing on node gpu-node-01; one at a time"
    assert sleeper.alive()


async def test_the_per_node_limit_over_a_window_comes_from_the_policy_file(harness, sshd, tmp_path, monkeypatch):
    policy = tmp_path / "policy.yaml"
    policy.write_text("version: 1\ngate: {max_actions_per_node: 2, node_window_s: 600}\n")
    monkeypatch.setenv("GPUMEDIC_POLICY_FILE", str(policy))
    h = harness(inventory=inventory_naming(sshd, tmp_path, ["gpu-node-99", "gpu-node-98"]))
    for gpu in (0, 1):
        # Failures on a node that does not answer still count: each was an action the gate let through.
        done = await h.handle(await h.open(kill_request(_target(), node="gpu-node-99", gpu=gpu)))
        assert done.outcome is ActionOutcome.FAILED
    third = await h.handle(await h.open(kill_request(_target(), node="gpu-node-99", gpu=2)))  # another incident
    assert third.outcome is ActionOutcome.BLOCKED
    assert third.detail == (
        "2 actions already ran on node gpu-node-99 within 600s (max 2); a node that keeps needing fixes needs a person"
    )
    other = await h.handle(await h.open(kill_request(_target(), node="gpu-node-98")))
    assert other.outcome is ActionOutcome.FAILED  # another node is not capped


async def test_breaker_trips_stays_open_until_reset(harness, sshd, tmp_path):
    h = harness(mode="observe", breaker_max_nodes=2, inventory=inventory_naming(sshd, tmp_path, ["n1", "n2", "n3", "n4", "n5"]))
    for node in ("n1", "n2"):
        assert (await h.handle(await h.open(kill_request(_target(), node=node)))).outcome is ActionOutcome.OBSERVED
    tripping = await h.handle(await h.open(kill_request(_target(), node="n3")))
    assert tripping.outcome is ActionOutcome.BLOCKED
    assert "circuit breaker tripped" in tripping.detail and "3 distinct nodes needed action within 600s (max 2)" in tripping.detail
    [trip] = await h.trips()
    assert trip.reset_at is None and trip.reason == "3 distinct nodes needed action within 600s (max 2)"

    # Every later request is blocked, even on a node already counted, and no second trip is written.
    for node in ("n1", "n4"):
        blocked = await h.handle(await h.open(kill_request(_target(), node=node, gpu=2)))
        assert blocked.outcome is ActionOutcome.BLOCKED
        assert blocked.detail.startswith(f"circuit breaker open since {trip.tripped_at.isoformat(timespec='seconds')}")
        assert blocked.detail.endswith("reset with `gpumedic breaker reset`")
    assert len(await h.trips()) == 1

    async with h.sessions() as session:
        reset = await breaker.reset(session=session, by="alice", now=datetime.now(UTC))
        await session.commit()
    assert [t.id for t in reset] == [trip.id]
    # After a reset the window starts afresh: earlier nodes no longer count.
    assert (await h.handle(await h.open(kill_request(_target(), node="n5")))).outcome is ActionOutcome.OBSERVED
    [closed] = await h.trips()
    assert closed.reset_by == "alice" and closed.reset_at is not None


async def test_a_node_the_inventory_does_not_name_is_blocked_not_tried(harness, sshd):
    h = harness()
    completed = await h.handle(await h.open(kill_request(_target(), node="gpu-node-99")))
    assert completed.outcome is ActionOutcome.BLOCKED
    assert completed.detail.startswith("node gpu-node-99 is not in the remediator's inventory") and completed.steps == ()


async def test_dead_host_fails_naming_the_node(harness, tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(f"nodes:\n  gpu-node-07: {{host: 127.0.0.1, port: {port}, user: root}}\n")
    h = harness(inventory=inventory)
    request = await h.open(kill_request(_target(), node="gpu-node-07"))
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.FAILED
    assert completed.detail == f"node 'gpu-node-07' (root@127.0.0.1:{port}): connection refused"
    assert (await h.record(request.action_id)).status == "failed"


async def test_a_store_that_is_down_raises_before_anything_runs(make_settings, incidents, sshd, sleeper, tmp_path):
    unopenable = tmp_path / "a-directory"
    unopenable.mkdir()
    h = _Harness(make_settings(store=StoreSettings(url=f"sqlite+aiosqlite:///{unopenable}")), incidents)
    request = await h.open(kill_request(sleeper.target()))
    sent_before = len(sshd.commands())
    with pytest.raises(StoreUnavailable):
        await h.handler.handle(request, Delivery("s", {}, 1))
    await h.engine.dispose()
    assert len(sshd.commands()) == sent_before
    assert h.broker.published == []
    assert sleeper.alive()


class _NodeLostAtKill:
    """An executor whose node answers the checks, then drops the connection on the kill."""

    @contextlib.asynccontextmanager
    async def session(self, node_id):
        address = NodeAddress(host="10.0.0.7", port=22)

        async def run(command):
            if command.startswith("kill"):
                raise NodeUnreachable(node_id, address, "connection lost: Connection reset by peer")
            if command.startswith("nvidia-smi"):
                return CommandResult(0, "0\n", "")
            if command.endswith("/cmdline"):
                return CommandResult(0, "python\0", "")
            return CommandResult(0, "4242 (python) " + " ".join(["S"] + ["0"] * 18 + ["1"]) + " 0 0\n", "")

        yield SimpleNamespace(run=run, address=address)


async def test_a_node_lost_mid_action_fails_saying_how_far_it_got(make_settings, incidents):
    h = _Harness(make_settings(), incidents, executor=_NodeLostAtKill())
    completed = await h.handle(await h.open(kill_request(ProcessTarget(pid=4242, start_ticks=1, command="python"))))
    await h.engine.dispose()
    assert completed.outcome is ActionOutcome.FAILED
    assert completed.detail == (
        "node 'gpu-node-01' (root@10.0.0.7:22): connection lost: Connection reset by peer "
        "(after 6 command(s), the last `kill -s TERM 4242`)"
    )
    assert completed.steps == (GPU_QUERY, *HOLDERS, "cat /proc/4242/stat", "cat /proc/4242/cmdline", "kill -s TERM 4242")


def test_completed_event_carries_at_most_64_steps():
    now = datetime.now(UTC)
    record = ActionRecord(
        action_id=str(uuid.uuid4()), incident_id=str(uuid.uuid4()), node_id="n1", attempt=1, operation={},
        status="failed", detail="x" * 5000, steps=[f"cat /proc/{i}/stat" for i in range(2, 102)],
        requested_at=now - timedelta(seconds=1), started_at=now, finished_at=now,
    )
    event = completed_event(record)
    assert len(event.steps) == 64
    assert event.steps[-1] == "... and 37 more (see the ledger)"
    assert len(event.detail) == 2000
    assert completed_event(record) == event  # deterministic: a re-publish is the same event


def _target() -> ProcessTarget:
    return ProcessTarget(pid=4242, start_ticks=1, command="python train.py")


# --- what the gate refuses, on the real sshd: nothing reaches the node -------------------------


async def _refused(h: _Harness, sshd, request: ActionRequested) -> ActionCompleted:
    sent_before = len(sshd.commands())
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.BLOCKED, completed.detail
    assert completed.steps == ()
    assert len(sshd.commands()) == sent_before, "a refused request reached the node"
    record = await h.record(request.action_id)
    assert (record.status, record.detail) == ("blocked", completed.detail)  # the audit says why
    return completed


async def test_a_request_for_an_unknown_incident_is_refused(harness, sshd, sleeper):
    h = harness()
    request = kill_request(sleeper.target())  # no detector opened anything
    completed = await _refused(h, sshd, request)
    assert completed.detail == (
        f"refused: incident {request.incident_id} is not open (no open incident has fingerprint gpu-node-01/zombie_job/0)"
    )
    assert sleeper.alive()


async def test_a_request_for_a_closed_incident_is_refused(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target()), phase="escalated", pending_action=None)
    completed = await _refused(h, sshd, request)
    assert completed.detail == f"refused: incident {request.incident_id} is escalated, not waiting for an action"
    assert sleeper.alive()


def _fleet_incident_over(request: ActionRequested) -> IncidentState:
    """The fleet incident a detector keeps over the kind of `request`'s incident (escalated: a person's)."""
    node = incident_waiting_for(request)
    return node.model_copy(update={
        "incident_id": uuid.uuid4(), "kind": IncidentKind.FLEET_ANOMALY, "node_id": FLEET_NODE, "gpu_index": None,
        "key": node.kind.value, "phase": "escalated", "pending_action": None, "step": 0,
        "summary": "zombie_job on 40 of 100 nodes within 300s",
    })


async def test_no_fault_step_runs_while_a_fleet_incident_over_its_kind_is_open(harness, sshd, sleeper):
    """A node incident already acting when much of the fleet showed its kind, or decided by a
    detector that sees part of the fleet, still reaches the gate: the fleet incident's state stops it."""
    h = harness(mode="enforce")
    request = await h.open(kill_request(sleeper.target()))
    fleet = _fleet_incident_over(request)
    await h.incidents.save(fleet)
    assert fleet.fingerprint == fleet_fingerprint(IncidentKind.ZOMBIE_JOB)
    completed = await _refused(h, sshd, request)
    assert completed.detail.startswith(f"refused: fleet incident {fleet.incident_id} is open for zombie_job (zombie_job on 40 of 100 nodes")
    assert sleeper.alive()
    # Once a person closed it, the next attempt runs.
    await h.incidents.delete(fleet)
    retry = await h.open(kill_request(sleeper.target(), attempt=2, incident_id=request.incident_id))
    completed = await h.handle(retry)
    assert completed.outcome is ActionOutcome.SUCCEEDED, completed.detail
    assert sleeper.killed()


async def test_a_fleet_incident_over_another_kind_or_a_state_that_does_not_parse(harness, sshd, sleeper):
    h = harness(mode="enforce")
    request = await h.open(kill_request(sleeper.target()))
    await h.incidents.save(_fleet_incident_over(request).model_copy(update={"key": IncidentKind.STUCK_PROCESS.value}))
    stored_under = fleet_fingerprint(IncidentKind.ZOMBIE_JOB)
    await h.incidents._kv.put(stored_under.replace("/", "."), b'{"incident_id": "not a uuid"}')
    completed = await _refused(h, sshd, request)
    assert completed.detail.startswith(f"refused: the state stored under {stored_under} is not an incident state")
    assert sleeper.alive()
    await h.incidents._kv.delete(stored_under.replace("/", "."))
    retry = await h.open(kill_request(sleeper.target(), attempt=2, incident_id=request.incident_id))
    assert (await h.handle(retry)).outcome is ActionOutcome.SUCCEEDED  # the stuck-process fleet incident is no reason


async def test_a_request_older_than_the_limit_is_refused(harness, sshd, sleeper):
    h = harness(max_request_age_s=60)
    old = datetime.now(UTC) - timedelta(seconds=77)
    request = await h.open(kill_request(sleeper.target(), occurred_at=old))
    completed = await _refused(h, sshd, request)
    assert completed.detail.startswith("refused: the request is 77s old (limit 60s)")
    assert sleeper.alive()


async def test_a_target_without_start_time_is_refused(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target(start_ticks=None)))
    completed = await _refused(h, sshd, request)
    assert f"pid {sleeper.pid} comes without its start time" in completed.detail
    assert sleeper.alive()


async def test_a_pid_whose_process_changed_is_not_killed(harness, sshd, sleeper):
    h = harness()
    # The detector saw another process under this pid (it started at another time).
    request = await h.open(kill_request(sleeper.target(start_ticks=sleeper.start_ticks - 1)))
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.FAILED
    assert f"refused {sleeper.pid}: start time {sleeper.start_ticks} != expected {sleeper.start_ticks - 1}" in completed.detail
    assert not any(c.startswith("kill") for c in completed.steps)
    assert sleeper.alive()


async def test_a_gpu_busy_again_is_refused_on_the_node(harness, sshd, sleeper):
    h = harness()
    request = await h.open(kill_request(sleeper.target()))
    sshd.set_gpu_utilization(0, 85)
    try:
        completed = await h.handle(request)
    finally:
        sshd.set_gpu_utilization(0, None)
    assert completed.outcome is ActionOutcome.BLOCKED
    assert completed.detail == (
        "refused: GPU 0 is busy again (85% > 4%), so the job is not the zombie the incident describes; nothing was killed"
    )
    assert completed.steps == (GPU_QUERY,)
    assert sleeper.alive()


async def test_a_burst_cannot_outrun_the_breaker_across_two_instances(harness, sshd, tmp_path):
    """Forty requests for forty nodes arrive at once at two remediators sharing one store: the
    gate lets at most the breaker's limit through, and writes exactly one trip."""
    inventory = inventory_naming(sshd, tmp_path, [f"burst-{i:02d}" for i in range(40)])
    first, second = harness(breaker_max_nodes=3, inventory=inventory), harness(breaker_max_nodes=3, inventory=inventory)
    requests = [await first.open(kill_request(_target(), node=f"burst-{i:02d}")) for i in range(40)]
    await asyncio.gather(
        *((first if i % 2 else second).handler.handle(r, Delivery(r.subject, {}, 1)) for i, r in enumerate(requests))
    )
    results = [p.event for p in first.broker.published + second.broker.published]
    assert sorted(r.action_id for r in results) == sorted(r.action_id for r in requests)  # one answer each
    let_through = [r for r in results if r.outcome is not ActionOutcome.BLOCKED]
    assert len(let_through) == 3  # nodes that do not answer: they fail on connecting, but the gate let them run
    assert all(r.outcome is ActionOutcome.FAILED for r in let_through)
    assert len(await first.trips()) == 1
    tripped = [r for r in results if "circuit breaker tripped" in r.detail]
    assert len(tripped) == 1 and "4 distinct nodes needed action within 600s (max 3)" in tripped[0].detail
    assert sum("circuit breaker open since" in r.detail for r in results) == 36
