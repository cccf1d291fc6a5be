"""The forged-state kill: an intruder with a detector's login writes an incident state and asks the
remediator to kill a process on a busy GPU. The server refuses another detector's state key; what a
detector may write still cannot loosen the gate, which takes the kill's safe parameters from the
policy; and a refused request counts nothing towards the breaker (so forged requests cannot stop
remediation fleet-wide). Real sshd, real SQLite ledger, the real incident-state bucket."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from gpumedic_events import ActionOutcome
from remediator import repository
from tests.remediator.conftest import incident_waiting_for, kill_request

pytestmark = pytest.mark.sshd


async def _nodes_in_breaker_window(h, request) -> frozenset[str]:
    async with h.sessions() as session:
        view = await repository.ledger_view(session=session, request=request, now=datetime.now(UTC), window_s=600, node_window_s=3600)
    return view.nodes_in_window


def _loosened(request, **changes):
    """The same request with its kill's parameters changed, as a sender may."""
    return request.model_copy(update={"operation": request.operation.model_copy(update=changes)})


@pytest.mark.parametrize(
    ("changes", "rule"),
    [
        ({"max_gpu_utilization_pct": 100}, "not below the policy's kinds.zombie_job.idle_below_pct (5%)"),
        ({"signal": "KILL", "grace_s": 0.0}, "the policy's actions.kill_gpu_processes is SIGTERM with 10s grace"),
    ],
)
async def test_a_request_that_loosens_the_policy_is_refused_by_rule_and_counts_nothing(harness, sshd, sleeper, changes, rule):
    h = harness(mode="enforce")
    others = kill_request(sleeper.target(), node="gpu-node-01")
    before = await _nodes_in_breaker_window(h, others)
    # The state agrees with the request, as the detector's own login could write it.
    forged = _loosened(kill_request(sleeper.target()), **changes)
    await h.incidents.save(incident_waiting_for(forged))
    completed = await h.handle(forged)
    assert completed.outcome is ActionOutcome.BLOCKED and rule in completed.detail, completed.detail
    assert sleeper.alive()
    assert not any(c.startswith("kill ") for c in sshd.commands_about(sleeper.pid))
    assert await _nodes_in_breaker_window(h, others) == before
    assert await h.trips() == []


async def test_a_state_claiming_another_detector_for_a_zombie_is_refused(harness, sshd, sleeper):
    """What leader-health's login did in the attack (now refused by the server too, see
    test_bus_rights): a zombie_job state naming leader-health, and a request from leader-health."""
    h = harness(mode="enforce")
    request = kill_request(sleeper.target()).model_copy(update={"source": "leader-health"})
    await h.incidents.save(incident_waiting_for(request, detector="leader-health"))
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.BLOCKED
    assert "names leader-health as its detector, but zombie_job incidents are opened by zombie-detector" in completed.detail
    assert sleeper.alive() and await h.trips() == []


async def test_a_state_that_does_not_parse_is_refused_saying_so(harness, sshd, sleeper):
    h = harness(mode="enforce")
    request = kill_request(sleeper.target())
    await h.incidents._kv.put(request.fingerprint.replace("/", "."), b'{"incident_id": "not a uuid"}')
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.BLOCKED
    assert f"the state stored under {request.fingerprint} is not an incident state" in completed.detail
    assert sleeper.alive()


async def test_the_real_request_still_runs(harness, sshd, sleeper):
    h = harness(mode="enforce")
    request = kill_request(sleeper.target())
    await h.incidents.save(incident_waiting_for(request))
    completed = await h.handle(request)
    assert completed.outcome is ActionOutcome.SUCCEEDED, completed.detail
    assert sleeper.killed()


async def test_a_kill_of_a_process_that_does_not_hold_the_gpu_named_is_refused_on_the_node(harness, sshd, sleeper):
    """What zombie-detector's own login could still ask: a state in its own keys for an idle GPU, its
    kill naming a process that works on another GPU. The node says who holds GPU 0; it is not him."""
    from tests.remediator.conftest import Sleeper

    busy_elsewhere = Sleeper()
    sshd.hold(1, busy_elsewhere.pid)
    try:
        h = harness(mode="enforce")
        request = kill_request(busy_elsewhere.target())  # GPU 0, idle: the policy's checks pass
        await h.incidents.save(incident_waiting_for(request))
        completed = await h.handle(request)
        assert completed.outcome is ActionOutcome.FAILED
        assert f"refused {busy_elsewhere.pid}: it does not hold GPU 0" in completed.detail
        assert busy_elsewhere.alive()
        assert not any(c.startswith("kill ") for c in sshd.commands_about(busy_elsewhere.pid))
    finally:
        sshd.release(1, busy_elsewhere.pid)
        busy_elsewhere.stop()


async def test_a_forgery_sent_first_under_the_real_action_id_does_not_take_its_place(harness, sshd, sleeper):
    """Action ids can be predicted (incident and attempt). A forgery sent under the real request's id
    before it is refused, and then steps aside: the real request still runs, and the forgery's
    answer names another request than the one the detector waits for."""
    h = harness(mode="enforce")
    real = kill_request(sleeper.target())
    await h.incidents.save(incident_waiting_for(real))
    forged = _loosened(real, max_gpu_utilization_pct=100)
    assert forged.action_id == real.action_id and forged.request_sha256 != real.request_sha256

    refused = await h.handle(forged)
    assert refused.outcome is ActionOutcome.BLOCKED and sleeper.alive()
    assert refused.action_id == real.action_id and refused.request_sha256 == forged.request_sha256

    done = await h.handle(real)
    assert done.outcome is ActionOutcome.SUCCEEDED, done.detail
    assert done.action_id == real.action_id and done.event_id != refused.event_id
    assert sleeper.killed()
    assert (await h.record(real.action_id)).status == "succeeded"
    assert (await h.record(repository.aside_id(real.action_id, forged.request_sha256))).status == "blocked"

    # Each asked again (a redelivery) is answered from its own row: nothing runs twice.
    assert (await h.handle(real, deliveries=2)).event_id == done.event_id
    assert (await h.handle(forged, deliveries=2)).outcome is ActionOutcome.BLOCKED
    assert [c for c in sshd.commands_about(sleeper.pid) if c.startswith("kill ")] == [f"kill -s TERM {sleeper.pid}"]


async def test_a_forgery_sent_after_the_real_request_is_kept_aside_and_answered_under_another_id(harness, sshd, sleeper):
    h = harness(mode="enforce")
    real = kill_request(sleeper.target())
    await h.incidents.save(incident_waiting_for(real))
    done = await h.handle(real)
    assert done.outcome is ActionOutcome.SUCCEEDED, done.detail

    forged = _loosened(real, max_gpu_utilization_pct=100)
    refused = await h.handle(forged)
    assert refused.outcome is ActionOutcome.BLOCKED
    assert refused.action_id == repository.aside_id(real.action_id, forged.request_sha256) != real.action_id
    assert "refused: the operation differs from the one zombie-detector decided" in refused.detail
    assert (await h.record(real.action_id)).status == "succeeded"
