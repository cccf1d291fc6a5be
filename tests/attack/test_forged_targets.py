"""Targets are derived, never taken: a detector's login named an ordinary peer as the cluster's
leader and the remediator sent it `reset_node_jobs` with the admin token; a detector's state that
said `fixed` let a `restart_job` through without a kill. The gate now sends a leader's endpoint
only to the leader leader-health last reported for the node's cluster, and restarts a job only
after a kill its own ledger verified. Real sshd, real curl to a real HTTP service on the node,
the real SQLite ledger and incident-state bucket."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from gpumedic_events import ActionOutcome, ActionRequested, ClusterChecked, HttpAdmin, IncidentKind, PeerJobs, RestartJob
from gpumedic_incidents import fingerprint
from gpumedic_incidents.policy import Actions, AdminEndpoint, AdminPolicy, JobRestart, Kinds, Policy, RestartJobPolicy, dump_policy
from gpumedic_store.models import ActionRecord
from tests.fixtures.webhook import Pager
from tests.remediator.conftest import Harness, incident_waiting_for, inventory_naming, kill_request

pytestmark = pytest.mark.sshd

PHANTOM_NODE = "gpu-node-07"


def _check(leader: str | None) -> ClusterChecked:
    return ClusterChecked(source="leader-health", cluster="selfplay", peers_total=3, peers_answering=3, leader=leader, healthy=True,
                          summary="3/3 peers answer", leader_view=(PeerJobs(node_id=PHANTOM_NODE, jobs=2, gpu_percent=0.0),))


async def _reset(h: Harness, at: str):
    """The phantom-jobs reset as zombie-detector asks for it, with its incident waiting for it."""
    request = ActionRequested(
        source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=PHANTOM_NODE, attempt=1,
        operation=HttpAdmin(endpoint="reset_job_count", at=at), reason="phantom jobs",
        fingerprint=fingerprint(PHANTOM_NODE, IncidentKind.PHANTOM_JOBS, None),
    )
    await h.incidents.save(incident_waiting_for(request))
    return await h.handle(request)


async def test_a_reset_aimed_at_a_peer_that_is_not_the_leader_is_refused_with_the_rule(make_settings, incidents, sshd, tmp_path):
    service = Pager().start()  # the daemon's admin endpoint, on the node the request names
    try:
        url = service.url.replace("/hooks/T000/B000/s3cr3t-path", "/admin/reset_node_jobs")
        reset = AdminEndpoint(url=url, target="leader", body={"node_id": "{node_id}"})
        dump_policy(Policy(actions=Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": reset}))), tmp_path / "policy.yaml")
        (tmp_path / "admin-token").write_text("node-admin-token\n")
        r = Harness(make_settings(policy={"file": tmp_path / "policy.yaml"}, admin_token_file=tmp_path / "admin-token",
                                  inventory=inventory_naming(sshd, tmp_path, [PHANTOM_NODE])), incidents)
        before = len(sshd.commands())
        # no check of leader-health yet: the leader is not known, whatever the request says
        done = await _reset(r, at=sshd.node_id)
        assert done.outcome is ActionOutcome.BLOCKED and "no check of leader-health names node gpu-node-07's cluster" in done.detail
        # leader-health says another peer leads: the request's ordinary peer gets nothing
        r.handler.leaders.observe(_check("vultr-a100-20gb"))
        done = await _reset(r, at=sshd.node_id)
        assert done.outcome is ActionOutcome.BLOCKED
        assert f"the request calls reset_job_count on {sshd.node_id}, but leader-health's check of cluster selfplay" in done.detail
        assert "names vultr-a100-20gb as its leader" in done.detail
        assert len(sshd.commands()) == before and service.received == []
        # the runbook's reset still runs where leader-health says the leader is
        r.handler.leaders.observe(_check(sshd.node_id).model_copy(update={"occurred_at": datetime.now(UTC)}))
        done = await _reset(r, at=sshd.node_id)
        assert done.outcome is ActionOutcome.SUCCEEDED, done.detail
        assert [call.body for call in service.received] == [{"node_id": PHANTOM_NODE}]
        assert service.received[0].headers["Authorization"] == "Bearer node-admin-token"
        await r.engine.dispose()
    finally:
        service.stop()


@pytest.fixture
async def restarting(make_settings, incidents, tmp_path):
    """A remediator whose policy restarts the job `selfplay` after a zombie's kill (observe mode: the
    refusal is what is tested, nothing needs to run)."""
    policy = tmp_path / "policy.yaml"
    kinds = Kinds().model_copy(update={"zombie_job": Kinds().zombie_job.model_copy(update={"restart_job": "selfplay"})})
    dump_policy(Policy(kinds=kinds, actions=Actions(restart_job=RestartJobPolicy(jobs={"selfplay": JobRestart(unit="selfplay.service")}))), policy)
    harness = Harness(make_settings(policy={"file": policy}, mode="observe"), incidents)
    yield harness
    await harness.engine.dispose()


async def test_a_restart_on_a_forged_fixed_state_is_refused_until_the_ledger_holds_the_kill(restarting, sleeper):
    h = restarting
    incident = uuid.uuid4()
    restart = kill_request(sleeper.target(), incident_id=incident).model_copy(update={"operation": RestartJob(job="selfplay"), "attempt": 2})
    await h.incidents.save(incident_waiting_for(restart, resolution="fixed"))  # the state says fixed; no kill ran
    done = await h.handle(restart)
    assert done.outcome is ActionOutcome.BLOCKED
    assert f"the remediator's ledger holds no succeeded kill_gpu_processes for incident {incident}" in done.detail

    # a kill of the same incident that the ledger holds as succeeded (verified gone): the restart passes the gate
    kill = kill_request(sleeper.target(), incident_id=incident)
    async with h.sessions() as session:
        now = datetime.now(UTC)
        session.add(ActionRecord(action_id=str(kill.action_id), incident_id=str(incident), node_id=kill.node_id, attempt=1,
                                 operation=kill.operation.model_dump(mode="json"), status="succeeded", detail="verified gone",
                                 requested_at=now, started_at=now, finished_at=now))
        await session.commit()
    again = restart.model_copy(update={"action_id": uuid.uuid4(), "attempt": 3})
    await h.incidents.save(incident_waiting_for(again, resolution="fixed"))
    done = await h.handle(again)
    assert done.outcome is ActionOutcome.OBSERVED, done.detail
