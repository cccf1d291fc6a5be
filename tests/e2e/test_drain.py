"""Drain, fix, validate, give back: a double-bit ECC error on a simulated node, end to end.

The real zombie-detector opens a `gpu_xid` incident and asks for its ladder; the real remediator
drains the node (the scheduler's hook on loopback hears it with its bearer token, NodeDrained is
published), resets the GPU over real SSH once nothing holds it, and the node comes back only
after the next samples show the GPU free with no row remap pending (NodeUndrained, the hook hears
`drained: false`). On a second node the GPU still runs a job: the reset is refused, a person is
asked, and that node stays drained.
"""

from __future__ import annotations

import asyncio
import json

import nats

from gpumedic.actions import drained_text
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_sim.runs.pager import Pager
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import NodeDrained, NodeUndrained
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import Actions, DrainPolicy, FleetPolicy, Kinds, RowRemapPolicy, Step, ValidationPolicy, XidPolicy, dump_policy
from gpumedic_store import NodeDrain, create_engine, session_factory
from remediator.main import create_app as remediator_app
from sqlalchemy import select
from tests.e2e.test_thin_path import detector, remediator_settings

TOKEN = "hook-token-4f1e"


def policy(hook_url: str) -> Policy:
    return Policy(
        fleet=FleetPolicy(hold_s=0),
        validation=ValidationPolicy(ready_samples=3, within_s=30),
        actions=Actions(drain_node=DrainPolicy(hook_url=hook_url)),
        kinds=Kinds(
            # The XID's ladder alone: the row remap that comes with XID 48 stands aside for an open
            # XID incident, but on a loaded machine its two samples can be judged before the XID
            # event is, and two ladders then ask to drain one node at once (one is refused).
            row_remap=RowRemapPolicy(after_samples=1_000_000),
            gpu_xid=XidPolicy(
                action_timeout_s=30,
                ladder=(Step(action="drain_node"), Step(action="gpu_reset", verify_within_s=10)),
            )
        ),
    )


async def test_an_ecc_error_drains_the_node_resets_the_gpu_and_gives_it_back_only_when_healthy(nats_settings, store_url, apps, tmp_path):
    fleet = SimFleet(2, 2, tmp_path / "fleet", jobs_per_gpu=0)
    await fleet.start()
    hook = Pager().start()
    policy_file = tmp_path / "policy.yaml"
    dump_policy(policy(hook.url), policy_file)
    (tmp_path / "hook-token").write_text(TOKEN + "\n")
    base = remediator_settings(nats_settings, store_url, fleet)
    settings = type(base)(
        **{**base.model_dump(exclude={"policy"}), "policy": {"file": policy_file}, "hook_token_file": tmp_path / "hook-token",
           "breaker_max_share": 1.0}  # two nodes of two act: the breaker is not what this tests
    )
    nc = await nats.connect(nats_settings.url)
    seen: list[tuple[str, dict]] = []

    async def keep(msg) -> None:
        seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("gpumedic.v1.>", cb=keep)
    js = nc.jetstream()

    async def publish(event) -> None:
        await js.publish(event.subject, event.to_json())

    healthy, busy = fleet.node("sim-node-01"), fleet.node("sim-node-02")
    busy.start_job(0)
    try:
        await apps.start(remediator_app(settings))
        await apps.start(detector(nats_settings, policy(hook.url)))
        task = asyncio.create_task(fleet.run_samplers(publish, 0.2))
        await asyncio.sleep(0.6)
        healthy.inject_xid(1, 48)
        busy.inject_xid(0, 48)
        await _until(lambda: _resolved(seen, "sim-node-01") and _escalated(seen, "sim-node-02"), 40)
        await stop_tasks([task])
        await apps.stop_all()
    finally:
        await nc.close()
        hook.stop()
        await fleet.stop()

    # The healthy node: drained, reset, validated, given back; the incident resolved fixed.
    facts = [(s, e) for s, e in seen if s.startswith(("gpumedic.v1.node.drained", "gpumedic.v1.node.undrained"))]
    assert [s for s, _ in facts if s.endswith("sim-node-01")] == [
        NodeDrained.subject_for("sim-node-01"), NodeUndrained.subject_for("sim-node-01")
    ]
    assert _resolved(seen, "sim-node-01")["resolution"] == "fixed"
    assert not healthy.gpus[1].remapped_rows_pending
    resets = [c for c in healthy.ssh_commands if "--gpu-reset" in c]
    assert resets == ["nvidia-smi --gpu-reset -i 1"]
    # The scheduler heard both, with the token; it never saw the token anywhere else.
    to_hook = [(p.body["node_id"], p.body["drained"]) for p in hook.received]
    assert to_hook.count(("sim-node-01", True)) == 1 and to_hook.count(("sim-node-01", False)) == 1
    assert to_hook.index(("sim-node-01", True)) < to_hook.index(("sim-node-01", False))
    assert all(p.headers.get("Authorization") == f"Bearer {TOKEN}" for p in hook.received)
    assert not any(TOKEN in json.dumps(e) for _, e in seen)

    # The busy node: drained, the reset refused while a job holds the GPU, a person asked, still drained.
    assert [s for s, _ in facts if s.endswith("sim-node-02")] == [NodeDrained.subject_for("sim-node-02")]
    assert "runs compute process" in _escalated(seen, "sim-node-02")["reason"]
    assert not [c for c in busy.ssh_commands if "--gpu-reset" in c]
    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        held = (await session.scalars(select(NodeDrain))).all()
    await engine.dispose()
    assert [(row.node_id, row.reason) for row in held] == [("sim-node-02", "gpu_xid on sim-node-02 GPU 0")]
    listed = await drained_text(store_url)  # what `gpumedic drained` prints
    assert "sim-node-02" in listed and "sim-node-01" not in listed and "1 node(s) drained" in listed


def _resolved(seen: list, node: str) -> dict | None:
    return next((e for s, e in seen if s == f"gpumedic.v1.incident.resolved.{node}"), None)


def _escalated(seen: list, node: str) -> dict | None:
    return next((e for s, e in seen if s == f"gpumedic.v1.incident.escalated.{node}"), None)


async def _until(done, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if done():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not done within {timeout_s}s")
