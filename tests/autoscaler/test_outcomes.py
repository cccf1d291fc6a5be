"""Black holes from how tasks end: the binomial tail, the judgement over a pool, the task database's
rows, and the pool's incident with its ladder."""

from __future__ import annotations

import math
import sqlite3
from collections import Counter
from datetime import datetime, timedelta

import pytest

from autoscaler.demand import Demand, DemandUnavailable, SqlDemand
from autoscaler.outcomes import Outcomes, PoolHistory, PoolRate, black_holes
from autoscaler.pool import FleetView, Reading
from gpumedic_events import DrainNode, IncidentKind, IncidentResolved, TerminateWorker
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import BlackHolePolicy, FailureJumpPolicy
from gpumedic_incidents.rates import tail
from tests.autoscaler.test_demand import _task_db
from tests.autoscaler.test_pool import T0, Pool, _w

POLICY = BlackHolePolicy()


def _exact(n: int, k: int, p: float) -> float:
    return sum(math.comb(n, i) * p**i * (1 - p) ** (n - i) for i in range(k, n + 1))


@pytest.mark.parametrize(("n", "k", "p"), [(10, 8, 0.5), (20, 3, 0.05), (200, 40, 0.1), (50, 0, 0.3), (30, 30, 0.9), (12, 1, 0.001),
                                     (1_000, 40, 0.02)])
def test_the_tail_is_the_binomials(n, k, p):
    assert tail(n, k, p) == pytest.approx(_exact(n, k, p), rel=1e-9)


def test_the_tail_of_a_big_count():
    assert tail(10, 8, 0.5) == pytest.approx(56 / 1024)
    assert tail(2_000_000, 30_000, 0.01) == 0.0  # 70 standard deviations past the mean: below any float
    assert tail(2_000_000, 20_500, 0.01) == pytest.approx(2.03e-4, rel=0.01)  # 3.5 above: the sum stops early, still right


def test_the_tail_at_the_edges():
    assert (tail(5, 0, 0.0), tail(5, 1, 0.0), tail(5, 6, 0.5), tail(5, 5, 1.0)) == (1.0, 0.0, 0.0, 1.0)
    assert tail(10_000, 9_000, 0.01) == 0.0  # underflows to nothing, never an error


def _pool(*rows: tuple[str, int, int]) -> list[Outcomes]:
    return [Outcomes(w, done, failed) for w, done, failed in rows]


CASES = [
    # (what, the pool's outcomes, the black holes)
    ("one worker fails most tasks among workers that rarely fail",
     _pool(*((f"pod-{i}", 19, 1) for i in range(9)), ("pod-bad", 8, 12)), ["pod-bad"]),
    ("failures spread evenly over the pool", _pool(*((f"pod-{i}", 17, 3 if i % 2 else 2) for i in range(10))), []),
    ("a bad image fails most tasks everywhere: no one worker's doing", _pool(*((f"pod-{i}", 8, 12) for i in range(10))), []),
    ("too few tasks to judge", _pool(*((f"pod-{i}", 20, 0) for i in range(9)), ("pod-new", 0, 4)), []),
    ("a pool that never failed, and a worker that failed 3 of 10", _pool(*((f"pod-{i}", 20, 0) for i in range(9)), ("pod-x", 7, 3)), ["pod-x"]),
    ("a little worse than the rest is chance", _pool(*((f"pod-{i}", 90, 10) for i in range(9)), ("pod-y", 84, 16)), []),
    ("a worker alone is judged against nobody", _pool(("pod-only", 0, 50)), []),
]


@pytest.mark.parametrize(("what", "outcomes", "holes"), CASES, ids=[c[0] for c in CASES])
def test_a_black_hole_is_a_worker_failing_far_more_than_the_rest(what, outcomes, holes):
    found = black_holes(outcomes, POLICY, workers={}, present={o.worker_id for o in outcomes}, now=T0)
    assert [f.node_id for f in found] == holes
    assert all(f.kind is IncidentKind.BLACK_HOLE for f in found)


def test_the_finding_says_how_far_and_ends_a_rented_worker():
    outcomes = _pool(*((f"pod-{i}", 19, 1) for i in range(9)), ("pod-bad", 8, 12))
    others = {f"pod-{i}" for i in range(9)}
    (rented,) = black_holes(outcomes, POLICY, workers={"pod-bad": _w("pod-bad")}, present=others, now=T0, provider="runpod")
    assert rented.summary.startswith("12 of 20 tasks failed on pod-bad (60%) against 5.2% on the rest of the pool: that many by chance")
    assert (rented.evidence["tasks_failed"], rented.evidence["workers_tested"], rented.evidence["provider"]) == (12, 10, "runpod")
    assert rented.evidence["chance"] < POLICY.alpha / 10
    assert rented.operations == {"terminate_worker": TerminateWorker(worker_ids=("pod-bad",))}
    (owned,) = black_holes(outcomes, POLICY, workers={}, present=others | {"pod-bad"}, now=T0)
    assert owned.operations == {} and "rent elsewhere" not in owned.recommended_action
    assert black_holes(outcomes, POLICY, workers={}, present=others, now=T0) == []  # gone: its tasks count in the rest's rate only


async def test_the_task_database_says_how_each_workers_tasks_ended(tmp_path):
    config = _task_db(tmp_path, [])
    # The runbook's task table: its statuses, and updated_at, by which its own checks take the last hour.
    with sqlite3.connect(tmp_path / "tasks.db") as conn:
        conn.execute("ALTER TABLE tasks ADD COLUMN worker_id TEXT")
        conn.execute("ALTER TABLE tasks ADD COLUMN updated_at TEXT")
        rows = [("Complete", "pod-1")] * 5 + [("Failed", "pod-1")] + [("Failed", "pod-2")] * 3 + [("In Progress", "pod-2")]
        conn.executemany("INSERT INTO tasks (status, worker_id, updated_at) VALUES (?, ?, datetime('now'))", rows)
        conn.execute("INSERT INTO tasks (status, worker_id, updated_at) VALUES ('Failed', 'pod-1', datetime('now', '-2 hours'))")
    query = ("SELECT worker_id, status, COUNT(*) FROM tasks WHERE status IN ('Complete', 'Failed') "
             "AND updated_at >= datetime('now', '-1 hour') GROUP BY worker_id, status")
    source = SqlDemand(config.model_copy(update={"outcomes_query": query}))
    hostile = SqlDemand(config.model_copy(update={"outcomes_query": "SELECT 'pod 1;', 'Failed', 2"}))
    negative = SqlDemand(config.model_copy(update={"outcomes_query": "SELECT 'pod-1', 'Failed', -2"}))
    try:
        assert await source.outcomes() == [Outcomes("pod-1", 5, 1), Outcomes("pod-2", 0, 3)]
        with pytest.raises(DemandUnavailable, match=r"outcomes row 1 is not \(worker_id, status, count\): \('pod 1;'"):
            await hostile.outcomes()
        with pytest.raises(DemandUnavailable, match="outcomes row 1"):
            await negative.outcomes()
        assert await SqlDemand(config).outcomes() is None  # no query: no black holes judged
    finally:
        for s in (source, hostile, negative):
            await s.close()


def _round(pool: Pool, at: datetime, workers, outcomes):
    reading = Reading(demand=Demand(queued=0, in_progress=0), workers=workers, outcomes=outcomes)
    evaluated, transitions = pool.logic.on_round(reading, FleetView(), at)
    pool._commit(transitions)
    return evaluated


def test_the_pool_drains_a_black_hole_then_ends_it_and_counts_it_out_of_service():
    pool = Pool()
    workers = [_w(f"pod-{i}") for i in range(6)]
    outcomes = [Outcomes(f"pod-{i}", 30, 1) for i in range(5)] + [Outcomes("pod-5", 5, 15)]
    evaluated = _round(pool, T0, workers, outcomes)
    assert evaluated.gpus_total == 5  # the black hole is no capacity from the round it is found
    (opened,) = pool.of(IncidentKind.BLACK_HOLE)
    assert opened.node_id == "pod-5" and opened.evidence["tasks_failed"] == 15
    _round(pool, T0 + timedelta(seconds=5), workers, None)  # a round that could not read outcomes changes nothing
    pool.tick(T0 + timedelta(seconds=20))
    (drain,) = pool.requests()
    assert isinstance(drain.operation, DrainNode) and drain.node_id == "pod-5"
    pool.complete(drain, T0 + timedelta(seconds=21))
    for at in (30, 100):
        _round(pool, T0 + timedelta(seconds=at), workers, outcomes)
        pool.tick(T0 + timedelta(seconds=at + 1))
    assert pool.requests()[-1].operation == TerminateWorker(worker_ids=("pod-5",))
    assert len(pool.of(IncidentKind.BLACK_HOLE)) == 1


def test_how_tasks_ended_is_published_for_the_pool_and_kept_per_worker_and_host():
    pool = Pool()
    workers = [_w("pod-0").model_copy(update={"host_id": "m-1"}), _w("pod-1").model_copy(update={"host_id": "m-2"})]
    evaluated = _round(pool, T0, workers, [Outcomes("pod-0", 30, 2), Outcomes("pod-1", 20, 1), Outcomes("gone-7", 4, 0)])
    assert (evaluated.tasks_done, evaluated.tasks_failed) == (54, 3)  # the pool's, a worker gone since included
    assert pool.logic.task_figures() == [
        (("gone-7", "", "done"), 4), (("gone-7", "", "failed"), 0), (("pod-0", "m-1", "done"), 30), (("pod-0", "m-1", "failed"), 2),
        (("pod-1", "m-2", "done"), 20), (("pod-1", "m-2", "failed"), 1),
    ]
    # pod-1 ended: its host is still known while its tasks are in the window; a round that read nothing keeps the figures
    later = _round(pool, T0 + timedelta(seconds=5), workers[:1], [Outcomes("pod-0", 31, 2), Outcomes("pod-1", 20, 1)])
    assert (later.tasks_done, later.tasks_failed) == (51, 3)
    assert (("pod-1", "m-2", "failed"), 1) in pool.logic.task_figures()
    unread = _round(pool, T0 + timedelta(seconds=10), workers[:1], None)
    assert (unread.tasks_done, unread.tasks_failed) == (None, None) and len(pool.logic.task_figures()) == 4


JUMP = FailureJumpPolicy(baseline_age_s=600)


def _rate(at_s: float, finished: int, failed: int, image: str = "acme/selfplay:7", workers: int = 10) -> PoolRate:
    return PoolRate(T0 + timedelta(seconds=at_s), finished, failed, {"image": Counter({image: workers}), "gpu_type": Counter({"H100": workers})})


@pytest.mark.parametrize(("what", "now", "found"), [
    ("the pool fails as it did", _rate(700, 200, 5), False),
    ("a jump no worker explains", _rate(700, 200, 60), True),
    ("too few tasks to judge", _rate(700, 15, 10), False),
    ("worse, but not by min_ratio", _rate(700, 200, 12), False),
])
def test_a_pool_wide_jump_is_judged_against_the_pool_as_it_was(what, now, found):
    history = PoolHistory(JUMP)
    assert history.round(_rate(0, 200, 4), pool="workers") is None  # nothing to compare with yet
    assert (history.round(now, pool="workers") is not None) is found, what


def test_the_jump_names_what_changed_keeps_its_baseline_while_it_lasts_and_is_found_by_the_pool_once():
    history = PoolHistory(JUMP)
    history.round(_rate(0, 200, 4), pool="workers")
    jump = history.round(_rate(700, 200, 90, image="acme/selfplay:8"), pool="workers")
    assert jump.kind is IncidentKind.FAILURE_JUMP and jump.node_id == "workers"
    assert jump.summary == ("90 of 200 tasks failed across the pool (45%) against 2.2% 700s before: that many by chance has probability "
                            f"{jump.evidence['chance']:.1e}; what changed: image acme/selfplay:8 on 10 of 10 workers (was acme/selfplay:7 on 10 of 10)")
    assert "gpu_type" not in str(jump.evidence) and jump.recommended_action.startswith("roll back what changed")
    # an hour of the jump later: the baseline is still the round before it, not a jumped one
    for at in range(1300, 4000, 600):
        assert history.round(_rate(at, 200, 90, image="acme/selfplay:8"), pool="workers") is not None
    assert history.before.at == T0

    pool = Pool(policy=Policy.model_validate({"actions": {"spawn_worker": {"gpu_types": ["H100"]}},
                                              "kinds": {"failure_jump": {"baseline_age_s": 600}}}))
    old = [_w(f"pod-{i}").model_copy(update={"image": "acme/selfplay:7"}) for i in range(10)]
    new = [w.model_copy(update={"image": "acme/selfplay:8"}) for w in old]
    _round(pool, T0, old, [Outcomes(w.worker_id, 20, 0 if i % 3 else 1) for i, w in enumerate(old)])
    _round(pool, T0 + timedelta(seconds=700), new, [Outcomes(w.worker_id, 10, 10) for w in new])
    assert pool.of(IncidentKind.BLACK_HOLE) == []  # every worker alike: no worker stands out
    (opened,) = pool.of(IncidentKind.FAILURE_JUMP)
    assert opened.node_id == "workers" and opened.evidence["changed_image"].startswith("image acme/selfplay:8 on 10 of 10 workers")


def test_while_the_pool_jumps_a_worker_that_runs_what_the_pool_runs_is_no_black_hole():
    """The outcomes query counts each worker's tasks over its window: a worker rented after a bad
    image went out has only tasks that ran under it, while the rest still count theirs from before.
    It stands out for the pool's own change, and so would the worker rented to replace it."""
    policy = Policy.model_validate({"kinds": {"failure_jump": {"baseline_age_s": 600}}})
    old = [_w(f"pod-{i}").model_copy(update={"image": "acme/selfplay:7"}) for i in range(10)]
    before = [Outcomes(w.worker_id, 60, 0 if i % 3 else 1) for i, w in enumerate(old)]
    # 700 s on: nine of the ten run the new image, 12 of their 20 tasks since failed; pod-9 still runs
    # the old one and fails three in four; pod-new was rented after the change
    pool_now = [w.model_copy(update={"image": "acme/selfplay:8"}) for w in old[:9]] + [old[9]]
    new = _w("pod-new", age_s=300).model_copy(update={"image": "acme/selfplay:8"})
    after = ([Outcomes(o.worker_id, o.done + 8, o.failed + 12) for o in before[:9]] + [Outcomes("pod-9", 10, 30)]
             + [Outcomes("pod-new", 5, 15)])

    pool = Pool(policy=policy)
    _round(pool, T0, old, before)
    _round(pool, T0 + timedelta(seconds=700), [*pool_now, new], after)
    (jump,) = pool.of(IncidentKind.FAILURE_JUMP)
    assert jump.evidence["changed_image"].startswith("image acme/selfplay:8 on 10 of 10 workers")
    # pod-new fails as the pool does now; pod-9, on what the pool ran before, still stands out
    assert [s.node_id for s in pool.of(IncidentKind.BLACK_HOLE)] == ["pod-9"]

    unjudged = Pool(policy=policy)  # the same round with no earlier one to find the jump against
    _round(unjudged, T0 + timedelta(seconds=700), [*pool_now, new], after)
    assert unjudged.of(IncidentKind.FAILURE_JUMP) == []
    assert sorted(s.node_id for s in unjudged.of(IncidentKind.BLACK_HOLE)) == ["pod-9", "pod-new"]


def _terminated_black_hole() -> tuple[Pool, list, list]:
    """A pool whose black hole pod-5 was drained and then ended, as the remediator answered: (pool, workers, outcomes)."""
    pool = Pool()
    workers = [_w(f"pod-{i}") for i in range(6)]
    outcomes = [Outcomes(f"pod-{i}", 30, 1) for i in range(5)] + [Outcomes("pod-5", 5, 15)]
    _round(pool, T0, workers, outcomes)
    pool.tick(T0 + timedelta(seconds=20))
    pool.complete(pool.requests()[-1], T0 + timedelta(seconds=21))  # drained
    for at in (30, 100):
        _round(pool, T0 + timedelta(seconds=at), workers, outcomes)
        pool.tick(T0 + timedelta(seconds=at + 1))
    terminate = pool.requests()[-1]
    assert terminate.operation == TerminateWorker(worker_ids=("pod-5",))
    pool.complete(terminate, T0 + timedelta(seconds=110))
    return pool, workers, outcomes


def test_a_black_hole_the_provider_no_longer_lists_closes_at_once_as_retired():
    """A black hole ended by its terminate_worker validates on samples a machine that no longer exists
    will never send: it stayed open to the end of a busy run. The provider's listing says it is gone."""
    pool, workers, outcomes = _terminated_black_hole()
    ended = [*workers[:5], _w("pod-5", status="terminated")]
    _round(pool, T0 + timedelta(seconds=120), ended, outcomes)  # the fault is gone with it: validation next
    (state,) = [s for s in pool.logic.book.incidents.values() if s.kind is IncidentKind.BLACK_HOLE]
    assert state.phase == "validating"

    _round(pool, T0 + timedelta(seconds=125), ended, outcomes)  # its failures still in the window are no news
    assert not [s for s in pool.logic.book.incidents.values() if s.node_id == "pod-5"]
    assert not [e for e in pool.events if getattr(e, "node_id", None) == "pod-5" and type(e).__name__ == "IncidentEscalated"]
    (resolved,) = [e for e in pool.events if isinstance(e, IncidentResolved) and e.node_id == "pod-5"]
    assert resolved.resolution == "fixed" and resolved.summary == "the node was retired: the provider lists worker pod-5 as terminated"


def test_an_incident_validating_on_a_worker_the_provider_still_lists_live_is_not_retired():
    """The provider has not ended it yet (a termination takes a while): validation goes on as before."""
    pool, workers, outcomes = _terminated_black_hole()
    for at in (120, 125, 130):
        _round(pool, T0 + timedelta(seconds=at), workers, outcomes[:5])  # still listed running, its failures aged out
    assert [(s.node_id, s.phase) for s in pool.logic.book.incidents.values()] == [("pod-5", "validating")]
