"""The peer-cluster runbook done by gpumedic, end to end on a simulated cluster: leader-health
probes the peers over real HTTP; a cluster that keeps its quorum but loses its leader gets an
election forced through a peer's admin endpoint, and a peer whose event loop blocks gets its
daemon restarted, both by the real remediator over real SSH, and both incidents resolve fixed
on the next probes."""

from __future__ import annotations

import asyncio
import contextlib
import json

import nats

from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_sim.machine.parts import PEER_UNIT
from gpumedic_sim.runs.simulate import sim_policy
from gpumedic_incidents.policy import dump_policy
from leader_health.main import create_app as leader_app
from leader_health.settings import Settings as LeaderSettings
from remediator.main import create_app as remediator_app
from tests.e2e.conftest import samplers_running
from tests.e2e.test_thin_path import remediator_settings

INTERVAL_S = 0.3
VERIFY_S = 10.0
"""How long a fix has to show in the probes: longer than two rounds on a loaded machine, each of
which may wait out the 2 s HTTP timeout (the scaled policy's 1.8 s escalated a restart that worked
while the round after it was still waiting on the blocked answer)."""


@contextlib.asynccontextmanager
async def cluster(nats_settings, store_url, apps, tmp_path, *, blocked_after_checks: int | None = None):
    """A 3-peer simulated cluster watched by leader-health, the remediator acting on it, and the
    incident and action events seen on the bus: (fleet, seen)."""
    fleet = SimFleet(3, 1, tmp_path / "fleet", jobs_per_gpu=0)
    await fleet.start()
    policy = sim_policy(INTERVAL_S)
    patient = {name: kind.model_copy(update={"ladder": tuple(step.model_copy(update={"verify_within_s": VERIFY_S}) for step in kind.ladder)})
               for name, kind in policy.kinds if name in ("no_leader", "peer_blocked", "peer_down")}
    policy = policy.model_copy(update={"kinds": policy.kinds.model_copy(update=patient)})
    if blocked_after_checks is not None:
        blocked = policy.kinds.peer_blocked.model_copy(update={"after_checks": blocked_after_checks})
        policy = policy.model_copy(update={"kinds": policy.kinds.model_copy(update={"peer_blocked": blocked})})
    dump_policy(policy, tmp_path / "policy.yaml")
    base = remediator_settings(nats_settings, store_url, fleet)
    remediator = type(base)(**{**base.model_dump(exclude={"policy"}), "policy": {"file": tmp_path / "policy.yaml"}, "breaker_max_share": 1.0})
    seen: list[tuple[str, dict]] = []
    nc = await nats.connect(nats_settings.url)

    async def keep(msg) -> None:
        if ".incident." in msg.subject or ".action." in msg.subject:
            seen.append((msg.subject, json.loads(msg.data)))

    await nc.subscribe("gpumedic.v1.>", cb=keep)
    try:
        await apps.start(remediator_app(remediator))
        await apps.start(leader_app(
            LeaderSettings(nats=nats_settings, cluster="sim", peers=[n.status_url for n in fleet.nodes.values()],
                           interval_s=INTERVAL_S, connect_timeout_s=2.0, http_timeout_s=2.0),  # patient: a loaded machine answers slowly
            policy=policy,
        ))
        await asyncio.sleep(3 * INTERVAL_S)
        yield fleet, seen
        await apps.stop_all()
    finally:
        await nc.close()
        await fleet.stop()


async def test_a_leaderless_cluster_gets_an_election_and_a_blocked_peer_a_restart(nats_settings, store_url, apps, tmp_path):
    async with cluster(nats_settings, store_url, apps, tmp_path) as (fleet, seen):
        fleet.set_leader(None)  # quorum holds, nobody leads
        await _until(lambda: _resolved(seen, "no_leader"), 20)
        blocked = fleet.node("sim-node-03")
        blocked.inject_status_blocked()
        await _until(lambda: _resolved(seen, "peer_blocked"), 30)

    opened = {e["kind"]: e for s, e in seen if ".incident.opened." in s}
    assert set(opened) == {"no_leader", "peer_blocked"}, [e["summary"] for e in opened.values()]
    assert opened["no_leader"]["node_id"] == "sim-node-01" and opened["peer_blocked"]["node_id"] == "sim-node-03"
    assert _resolved(seen, "no_leader")["resolution"] == _resolved(seen, "peer_blocked")["resolution"] == "fixed"
    assert fleet.node("sim-node-01").admin_calls == ["/force_election"]
    assert fleet.cluster.leader == "sim-node-01"  # (the restarted peer meets it again over a few seconds)
    assert f"systemctl restart {PEER_UNIT}" in blocked.ssh_commands and not blocked.status_blocked
    done = [e for s, e in seen if ".action.completed." in s]
    assert [e["outcome"] for e in done] == ["succeeded", "succeeded"], [e["detail"] for e in done]


def _resolved(seen: list, kind: str) -> dict | None:
    opened = {e["incident_id"] for s, e in seen if ".incident.opened." in s and e["kind"] == kind}
    return next((e for s, e in seen if ".incident.resolved." in s and e["incident_id"] in opened), None)


async def _until(done, timeout_s: float) -> None:
    for _ in range(int(timeout_s / 0.1)):
        if done():
            return
        await asyncio.sleep(0.1)
    raise AssertionError(f"not done within {timeout_s}s")


async def test_a_crashed_peer_daemon_is_restarted_and_its_port_answers_again(nats_settings, store_url, apps, tmp_path):
    async with cluster(nats_settings, store_url, apps, tmp_path) as (fleet, seen):
        crashed = fleet.node("sim-node-02")
        await fleet.inject("daemon_down", "sim-node-02")
        await _until(lambda: _resolved(seen, "peer_down"), 30)
    (opened,) = [e for s, e in seen if ".incident.opened." in s]
    assert (opened["kind"], opened["node_id"]) == ("peer_down", "sim-node-02") and "refuses connections" in opened["summary"]
    assert _resolved(seen, "peer_down")["resolution"] == "fixed" and not crashed.listens_on_restart
    assert f"systemctl restart {PEER_UNIT}" in crashed.ssh_commands


async def test_a_peer_whose_loop_accepts_nothing_is_told_by_its_own_node_and_restarted(nats_settings, store_url, apps, tmp_path):
    """Runbook 002's blocked daemon as the kernel shows it: connections pile up unaccepted in the
    port's queue. The node's real sampler reads the queue and says so on the bus; leader-health
    opens peer_blocked with the count at its first blocked round after the count passes
    `backlog_from` (its probes alone would take a thousand rounds here); the restart empties the queue."""
    async with cluster(nats_settings, store_url, apps, tmp_path, blocked_after_checks=1000) as (fleet, seen):
        nc = await nats.connect(nats_settings.url)
        js = nc.jetstream()

        async def publish(event) -> None:
            await js.publish(event.subject, event.to_json())

        try:
            async with samplers_running(fleet, publish):
                stuck = fleet.node("sim-node-02")
                await fleet.inject("status_backlog", "sim-node-02")
                await _until(lambda: _resolved(seen, "peer_blocked"), 40)
        finally:
            await nc.close()
    (opened,) = [e for s, e in seen if ".incident.opened." in s]
    assert (opened["kind"], opened["node_id"]) == ("peer_blocked", "sim-node-02"), opened["summary"]
    assert "connections waiting unaccepted on port" in opened["summary"] and opened["evidence"]["waiting"] >= 8
    assert _resolved(seen, "peer_blocked")["resolution"] == "fixed"
    assert f"systemctl restart {PEER_UNIT}" in stuck.ssh_commands and not stuck.listens_on_restart
