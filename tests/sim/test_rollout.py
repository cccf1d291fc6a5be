"""A rolling restart of the peer daemon over the simulated fleet's real SSH, through the remediator's
gate: batch by batch, each node verified before the next batch, stopped after the first batch in
which a node failed, nothing run by a dry run, and stopped before a batch the breaker would not
allow (runbook 002: "restart P2P on cluster nodes")."""

from __future__ import annotations

import uuid
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gpumedic_events import RolloutReport, RolloutRequest, RolloutStep
from gpumedic_events.base import MAX_EVENT_BYTES
from gpumedic_incidents.policy import SAMPLER_UNIT, Actions, Policy, RestartPolicy, UnitRule
from gpumedic_sim import SimFleet
from gpumedic_sim.machine.parts import PEER_UNIT
from gpumedic_store import StoreSettings, create_engine, session_factory, upgrade, views
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator.handlers import ActionHandler
from remediator.main import executor_of, gate_of
from remediator.rollout import Rollout
from remediator.settings import Settings

POLICY = Policy(actions=Actions(restart_unit=RestartPolicy(units={PEER_UNIT: UnitRule(), SAMPLER_UNIT: UnitRule()})))


@pytest.fixture
async def twelve(tmp_path):
    fleet = SimFleet(12, 1, tmp_path / "fleet")
    async with fleet:
        yield fleet


@pytest.fixture
async def rollout(twelve, tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)

    def _make(**changes) -> Rollout:
        settings = Settings(store=StoreSettings(url=url), inventory=twelve.inventory_path, known_hosts=twelve.known_hosts_path,
                            client_key=twelve.client_key_path, connect_timeout_s=2.0, command_timeout_s=5.0, verify_timeout_s=3.0,
                            breaker_max_share=1.0, **({"mode": "enforce", "breaker_max_nodes": 20} | changes))
        tracer = TracerProvider().get_tracer("test")
        actions = ActionHandler(settings=settings, gate=gate_of(settings, POLICY), sessions=session_factory(engine),
                                runtime=SimpleNamespace(broker=None, metrics=ServiceMetrics("remediator")),
                                executor=executor_of(settings), tracer=tracer)
        return Rollout(policy=POLICY, actions=actions, tracer=tracer)

    _make.engine = engine
    yield _make
    await engine.dispose()


def restarts(fleet: SimFleet) -> dict[str, int]:
    return {node.node_id: node.unit_restarts.get(PEER_UNIT, 0) for node in fleet.nodes.values() if node.unit_restarts.get(PEER_UNIT)}


def request(**changes) -> RolloutRequest:
    return RolloutRequest.model_validate({"operation": "restart_unit", "unit": PEER_UNIT, "nodes": ("label:provider=simulated",),
                                          "batch": 3} | changes)


async def ledger(engine, rollout_id) -> list:
    async with session_factory(engine)() as session:
        return await views.actions_of(session, incident_id=str(rollout_id))


async def test_a_rolling_restart_stops_after_the_batch_in_which_a_node_failed(rollout, twelve):
    await twelve.node("sim-node-05").inject_ssh_refuses()
    report = await rollout().run(request(requested_by="ops-alice"))
    assert [len(b) for b in report.batches] == [3, 3, 3, 3]
    assert [(s.batch, s.node_id, s.status) for s in report.steps] == [
        (1, "sim-node-01", "succeeded"), (1, "sim-node-02", "succeeded"), (1, "sim-node-03", "succeeded"),
        (2, "sim-node-04", "succeeded"), (2, "sim-node-05", "failed"), (2, "sim-node-06", "succeeded"),
    ]
    assert report.stopped.startswith("batch 2 of 4 did not succeed on sim-node-05; 6 node(s) not acted on: sim-node-07, ")
    assert not report.ok and "stopped: batch 2 of 4" in report.summary()
    assert restarts(twelve) == {f"sim-node-0{i}": 1 for i in (1, 2, 3, 4, 6)}  # none after the failed batch
    records = await ledger(rollout.engine, report.rollout_id)
    assert len(records) == 6 and {r.reason for r in records} == {"rollout restart_unit by ops-alice, batch 1",
                                                                 "rollout restart_unit by ops-alice, batch 2"}
    assert RolloutReport.from_json(report.to_json()) == report


async def test_a_dry_run_lists_the_batches_and_commands_and_where_the_gate_would_refuse_and_runs_nothing(rollout, twelve):
    report = await rollout(protected_nodes={"sim-node-02"}).run(request(dry_run=True))
    assert len(report.steps) == 12 and [s.status for s in report.steps].count("planned") == 11
    assert report.steps[0].detail == f"systemctl restart {PEER_UNIT}; systemctl is-active {PEER_UNIT}"
    assert (report.steps[1].status, report.steps[1].detail) == ("blocked", "node sim-node-02 is protected; actions on it need a person")
    observing = await rollout(mode="observe").run(request(dry_run=True))
    assert {s.status for s in observing.steps} == {"observed"}
    assert restarts(twelve) == {} and await ledger(rollout.engine, report.rollout_id) == []


async def test_the_breaker_stops_a_rollout_before_a_batch_that_would_take_it_past_its_limit(rollout, twelve):
    report = await rollout(breaker_max_nodes=5).run(request())
    assert [s.node_id for s in report.steps] == ["sim-node-01", "sim-node-02", "sim-node-03"]
    assert report.stopped.startswith("before batch 2 of 4: it would take the breaker to 6 distinct nodes acted on within 600s "
                                     "(3 already; max 5)")
    assert len(restarts(twelve)) == 3


async def test_a_node_a_person_silenced_whole_is_left_alone_and_said_so(rollout, twelve):
    """A maintenance window (`gpumedic silence --node N`, or matchers on the node alone) holds a
    node out of a fleet operation; a silence of one kind, one that ended, or one of everything does not."""
    from datetime import UTC, datetime, timedelta

    from gpumedic_store.models import Silence

    now = datetime.now(UTC)

    def silence(**fields) -> Silence:
        return Silence(**{"id": str(uuid.uuid4()), "node_id": None, "kind": None, "gpu_index": None, "matchers": None,
                          "starts_at": now - timedelta(hours=1), "ends_at": now + timedelta(hours=1), "every_s": None,
                          "last_ends_at": None, "reason": "driver upgrade", "created_by": "alice", "removed_at": None,
                          "removed_by": None} | fields)

    async with session_factory(rollout.engine)() as session:
        session.add_all([
            silence(node_id="sim-node-05"),
            silence(matchers=["node=~sim-node-1[01]"], reason="rack rewiring", created_by="bob"),
            silence(node_id="sim-node-07", kind="gpu_xid"),  # one kind: the node may be acted on
            silence(node_id="sim-node-08", ends_at=now - timedelta(minutes=1)),  # over
            silence(),  # everything, fleet-wide: alarms muted, a person's own fleet operation still runs
        ])
        await session.commit()
    planned = await rollout().run(request(dry_run=True))
    assert {s.node_id: s.status for s in planned.steps if s.status != "planned"} == dict.fromkeys(("sim-node-05", "sim-node-10", "sim-node-11"), "silenced")
    report = await rollout().run(request())
    held = {s.node_id: s.detail for s in report.steps if s.status == "silenced"}
    assert set(held) == {"sim-node-05", "sim-node-10", "sim-node-11"} and "silenced by bob (rack rewiring)" in held["sim-node-10"]
    assert report.ok and not report.stopped
    assert set(restarts(twelve)) == {f"sim-node-{i:02d}" for i in range(1, 13)} - set(held)


async def test_a_unit_off_the_allow_list_or_no_matching_node_runs_nothing(rollout, twelve):
    report = await rollout().run(RolloutRequest(operation="restart_unit", unit="sshd.service", nodes=("sim-node-01",)))
    assert report.error and "sshd.service" in report.error and report.steps == ()
    report = await rollout().run(request(nodes=("group:nowhere",)))
    assert report.error == "no node of the inventory matches group:nowhere"
    assert restarts(twelve) == {}


def test_a_report_of_thousands_of_nodes_fits_one_message_and_keeps_every_node_that_failed():
    steps = tuple(RolloutStep(batch=i // 50 + 1, node_id=f"gpu-node-{i:05d}", status="failed" if i % 997 == 5 else "succeeded",
                              detail="restarted selfplay-p2p.service (systemd); active " + "x" * 300, action_id=uuid.uuid4())
                  for i in range(5000))
    report = RolloutReport(rollout_id=uuid.uuid4(), operation="restart_unit", steps=steps).fitted()
    assert len(report.to_json()) <= MAX_EVENT_BYTES - 8 * 1024
    assert [s.node_id for s in report.steps if s.status == "failed"] == [f"gpu-node-{i:05d}" for i in range(5000) if i % 997 == 5]
    assert report.left_out == 5000 - len(report.steps) > 0 and f"and {report.left_out} more that succeeded" in report.summary()
    assert RolloutReport.from_json(report.to_json()) == report
