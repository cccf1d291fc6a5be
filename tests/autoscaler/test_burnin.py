"""Burn-in: a newly rented worker is capacity only once its samples and the on-node acceptance
checks pass; one that fails is ended and replaced, and never counted in service."""

from __future__ import annotations

from datetime import timedelta

from autoscaler.pool import FleetView
from gpumedic_events import (
    AcceptWorker,
    ActionOutcome,
    DiskUsage,
    GpuHealth,
    GpuSample,
    HostSample,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    NodeSampled,
    NvLinkSample,
    SpawnWorker,
    TerminateWorker,
)
from gpumedic_incidents import Policy
from gpumedic_providers.base import Worker
from tests.autoscaler.test_pool import H100, SCALING, T0, Pool

POLICY = Policy.model_validate({"actions": {"spawn_worker": {"gpu_types": [H100]}}, "kinds": {"burn_in": {"required": True, "within_s": 600}}})
GIB = 2**30


def _w(worker_id: str, status: str = "running", age_s: float = 120, gpus: int = 1) -> Worker:
    return Worker(worker_id=worker_id, status=status, gpu_type=H100, gpus=gpus, price_per_h=2.49 * gpus,
                  created_at=T0 - timedelta(seconds=age_s), host_id=f"m-{worker_id}")


def _sample(node: str, at, *, gpus: int = 1, width: int = 16, nvlink_down: bool = False, lost: bool = False, free_gib: float = 200,
            available_pct: float = 80) -> NodeSampled:
    health = GpuHealth(pcie_link_width=width, pcie_link_width_max=16, nvlink_count=18,
                       nvlinks=(NvLinkSample(link=3, up=False),) if nvlink_down else ())
    return NodeSampled(
        source="node-sampler", node_id=node, occurred_at=at, interval_s=5,
        gpus=tuple(GpuSample(index=i, uuid=f"GPU-{node}-{i}", name=H100, utilization_gpu_pct=0, lost=lost and i == 0, health=health)
                   for i in range(gpus)),
        host=HostSample(memory_total_mib=1000, memory_available_mib=int(available_pct * 10),
                        disks=(DiskUsage(path="/", total_bytes=500 * GIB, used_bytes=int((500 - free_gib) * GIB),
                                         available_bytes=int(free_gib * GIB), used_pct=100 - free_gib / 5),)),
    )


def _opened(pool: Pool, kind: IncidentKind) -> list[IncidentOpened]:
    return [e for e in pool.of(kind) if isinstance(e, IncidentOpened)]


def _pool() -> Pool:
    pool = Pool(scaling=SCALING, policy=POLICY)
    pool.round(T0 - timedelta(minutes=10), queued=0, in_progress=0, workers=[])  # the first round: nothing running yet
    return pool


def _asked_to_accept():
    """A worker that came up, whose samples passed: the pool and its accept_worker request."""
    pool = _pool()
    pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
    pool.logic.trials.on_sample(_sample("w1", T0 + timedelta(seconds=5)))
    pool.round(T0 + timedelta(seconds=10), queued=3, in_progress=0, workers=[_w("w1")])
    pool.tick(T0 + timedelta(seconds=30))
    (accept,) = [r for r in pool.requests() if isinstance(r.operation, AcceptWorker)]
    return pool, accept


def test_a_new_worker_is_on_trial_until_its_samples_and_the_node_checks_pass_then_in_service():
    pool = _pool()
    evaluated = pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
    assert evaluated.workers_in_service == 0 and evaluated.gpus_total == 1, "on trial: no capacity, but no second rental for it"
    assert not [r for r in pool.requests() if isinstance(r.operation, SpawnWorker)]
    assert not _opened(pool, IncidentKind.BURN_IN), "nothing to ask before its samples pass"
    pool.logic.trials.on_sample(_sample("w1", T0 + timedelta(seconds=5)))
    pool.round(T0 + timedelta(seconds=10), queued=3, in_progress=0, workers=[_w("w1")])
    (opened,) = _opened(pool, IncidentKind.BURN_IN)
    assert opened.severity == "info" and opened.evidence["host_id"] == "m-w1"
    pool.tick(T0 + timedelta(seconds=30))
    (accept,) = [r for r in pool.requests() if isinstance(r.operation, AcceptWorker)]
    pool.complete(accept, T0 + timedelta(seconds=40))
    evaluated = pool.round(T0 + timedelta(seconds=45), queued=3, in_progress=0, workers=[_w("w1")])
    assert evaluated.workers_in_service == 1
    (resolved,) = [e for e in pool.events if isinstance(e, IncidentResolved) and e.kind is IncidentKind.BURN_IN]
    assert resolved.resolution == "fixed"


def test_a_worker_whose_acceptance_fails_is_ended_never_in_service_and_replaced():
    pool, accept = _asked_to_accept()
    pool.complete(accept, T0 + timedelta(seconds=40), ActionOutcome.FAILED)
    evaluated = pool.round(T0 + timedelta(seconds=45), queued=3, in_progress=0, workers=[_w("w1")])
    assert evaluated.workers_in_service == 0 and evaluated.gpus_total == 0
    (failed,) = _opened(pool, IncidentKind.BURN_IN_FAILED)
    assert failed.node_id == "w1" and failed.evidence["host_id"] == "m-w1" and "done" in failed.summary
    pool.tick(T0 + timedelta(seconds=70))
    (terminate,) = [r for r in pool.requests() if isinstance(r.operation, TerminateWorker)]
    assert terminate.operation.worker_ids == ("w1",)
    assert [r for r in pool.requests() if isinstance(r.operation, SpawnWorker)], "a replacement is rented"


def test_samples_that_show_a_fault_fail_the_worker_at_once():
    for sample, why in (
        (dict(width=8), "GPU 0 PCIe link x8 of x16"), (dict(nvlink_down=True), "GPU 0 NVLink 3 down"), (dict(lost=True), "GPU 0 is lost"),
        (dict(free_gib=3), "3.0 GiB free on / (under 10 GiB)"), (dict(available_pct=4), "4% of host memory available (under 10%)"),
        (dict(gpus=0), "0 GPU(s) seen of the 1 rented"),
    ):
        pool = _pool()
        pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
        pool.logic.trials.on_sample(_sample("w1", T0 + timedelta(seconds=5), **sample))
        pool.round(T0 + timedelta(seconds=10), queued=3, in_progress=0, workers=[_w("w1")])
        assert not _opened(pool, IncidentKind.BURN_IN)
        (failed,) = _opened(pool, IncidentKind.BURN_IN_FAILED)
        assert why in failed.summary, (why, failed.summary)


def test_a_worker_not_accepted_within_its_grace_is_ended():
    pool = _pool()
    pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])  # its sampler never reports
    pool.round(T0 + timedelta(seconds=599), queued=3, in_progress=0, workers=[_w("w1")])
    assert not _opened(pool, IncidentKind.BURN_IN_FAILED)
    pool.round(T0 + timedelta(seconds=601), queued=3, in_progress=0, workers=[_w("w1")])
    (failed,) = _opened(pool, IncidentKind.BURN_IN_FAILED)
    assert "not accepted within 600s of coming up (no sample from it)" in failed.summary


def test_workers_running_at_the_first_round_are_taken_as_they_are_unless_their_trial_was_open():
    pool = Pool(scaling=SCALING, policy=POLICY)
    pool.logic.book.adopt([])  # a restart: nothing open
    evaluated = pool.round(T0, queued=3, in_progress=0, workers=[_w("w1"), _w("w2", "spawning", 5)])
    assert evaluated.workers_in_service == 2
    assert pool.logic.trials.accepted == {"w1"}
    pool.round(T0 + timedelta(seconds=20), queued=3, in_progress=0, workers=[_w("w1"), _w("w2")])
    assert "w2" in pool.logic.trials.started, "one that comes up later is on trial"


def test_without_burn_in_required_a_running_worker_is_in_service_at_once():
    pool = Pool()
    pool.round(T0 - timedelta(minutes=10), queued=0, in_progress=0, workers=[])
    evaluated = pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
    assert evaluated.workers_in_service == 1 and not _opened(pool, IncidentKind.BURN_IN)


def test_a_trial_worker_is_never_released_as_idle():
    pool = _pool()
    pool.round(T0, queued=0, in_progress=0, workers=[_w("w1")])
    fleet = FleetView(idle_since={"w1": T0 - timedelta(hours=1)})
    evaluated = pool.round(T0 + timedelta(seconds=700 - 120), queued=0, in_progress=0, workers=[_w("w1")], fleet=fleet)
    assert "w1" not in evaluated.release and not _opened(pool, IncidentKind.CAPACITY_SURPLUS)


def test_the_first_sample_of_a_worker_still_listed_spawning_is_kept_for_its_trial():
    """A worker's first sample carries its health figures, and may come before the round that sees it running."""
    pool = _pool()
    pool.round(T0 - timedelta(seconds=5), queued=3, in_progress=0, workers=[_w("w1", "spawning", 5)])
    pool.logic.trials.on_sample(_sample("w1", T0 - timedelta(seconds=1)))
    pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
    assert len(_opened(pool, IncidentKind.BURN_IN)) == 1
    pool.logic.trials.on_sample(_sample("gpu-node-07", T0))  # any other node's sample is not kept
    assert set(pool.logic.trials._looks) == {"w1"}


def test_a_worker_on_a_machine_given_back_has_no_trial_and_is_ended_once():
    pool = _pool()
    pool.round(T0, queued=3, in_progress=0, workers=[_w("w1")])
    for minutes in (30, 20):
        pool.logic.offenders.on_opened(IncidentOpened(
            source="zombie-detector", occurred_at=T0 - timedelta(minutes=minutes), incident_id=__import__("uuid").uuid4(),
            node_id="old", kind=IncidentKind.GPU_LOST, gpu_index=0, fingerprint="old/gpu_lost", summary="lost", evidence={"host_id": "m-w1"}))
    pool.logic.trials.on_sample(_sample("w1", T0 + timedelta(seconds=5)))
    pool.round(T0 + timedelta(seconds=10), queued=3, in_progress=0, workers=[_w("w1")])
    assert not _opened(pool, IncidentKind.BURN_IN) and not _opened(pool, IncidentKind.BURN_IN_FAILED)
    (offender,) = _opened(pool, IncidentKind.REPEAT_OFFENDER)
    assert offender.node_id == "w1" and "w1" not in pool.logic.trials.started


def test_an_acceptance_the_gate_refused_leaves_the_worker_on_trial_and_its_end_says_why():
    pool, accept = _asked_to_accept()
    pool.complete(accept, T0 + timedelta(seconds=31), ActionOutcome.BLOCKED)
    assert "w1" in pool.logic.trials.started
    pool.round(T0 + timedelta(seconds=601), queued=3, in_progress=0, workers=[_w("w1")])
    (failed,) = _opened(pool, IncidentKind.BURN_IN_FAILED)
    assert "not accepted within 600s of coming up (the remediator: done)" in failed.summary
