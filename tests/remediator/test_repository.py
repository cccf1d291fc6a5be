"""The ledger's queries on both backends: records, what the gate reads, the gate lock, trips and resets."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy.exc import IntegrityError

from gpumedic_events import ProcessTarget
from gpumedic_store import breaker, create_engine, session_factory, upgrade, views
from remediator import repository
from tests.remediator.conftest import kill_request

NOW = datetime(2026, 11, 22, 10, 0, tzinfo=UTC)


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def ledger_url(request, tmp_path) -> str:
    if request.param == "sqlite":
        return f"sqlite+aiosqlite:///{tmp_path}/ledger.db"
    return request.getfixturevalue("postgres_database")


@pytest.fixture
async def sessions(ledger_url):
    url = ledger_url
    upgrade(url)
    engine = create_engine(url)
    yield session_factory(engine)
    await engine.dispose()


def _request(node="n1", incident=None):
    return kill_request(ProcessTarget(pid=4242, start_ticks=1, command="python"), node=node, incident_id=incident)


async def _claim(sessions, request, now=NOW, status="executing"):
    """Decide a request as the gate does: under the lock, recorded in the same transaction."""
    async with sessions() as session:
        await breaker.lock_gate(session=session)
        record = await repository.record(session=session, request=request, status=status, detail="", now=now)
        await session.commit()
        return record


async def test_record_keeps_the_request_and_a_second_record_of_it_is_refused(sessions):
    request = _request()
    record = await _claim(sessions, request)
    assert record.status == "executing" and record.finished_at is None
    assert record.operation["targets"][0]["pid"] == 4242
    refused = await _claim(sessions, _request("n2"), status="blocked")
    assert refused.finished_at == NOW
    with pytest.raises(IntegrityError):
        await _claim(sessions, request, now=NOW + timedelta(minutes=1))
    async with sessions() as session:
        again = await repository.get_action(session=session, action_id=request.action_id)
    assert again.started_at == NOW


async def test_the_store_refuses_a_second_executing_action_on_a_node(sessions):
    await _claim(sessions, _request("n1"))
    with pytest.raises(IntegrityError, match="(?i)unique"):
        await _claim(sessions, _request("n1"))
    await _claim(sessions, _request("n1"), status="blocked")  # a refusal next to it is fine


async def test_the_gate_lock_makes_a_second_decision_wait_for_the_first(sessions):
    order: list[str] = []
    first_holds = asyncio.Event()

    async def first() -> None:
        async with sessions() as session:
            await breaker.lock_gate(session=session)
            order.append("first locked")
            first_holds.set()
            await asyncio.sleep(0.3)
            order.append("first commits")
            await session.commit()

    async def second() -> None:
        await first_holds.wait()
        async with sessions() as session:
            await breaker.lock_gate(session=session)
            order.append("second locked")
            await session.commit()

    await asyncio.gather(first(), second())
    assert order == ["first locked", "first commits", "second locked"]


async def test_finish_keeps_status_detail_and_steps(sessions):
    request = _request()
    await _claim(sessions, request)
    async with sessions() as session:
        record = await repository.get_action(session=session, action_id=request.action_id)
        await repository.finish(
            session=session, record=record, status="succeeded", detail="ok", steps=["a", "b"], now=NOW + timedelta(seconds=3)
        )
        await session.commit()
    async with sessions() as session:
        stored = await repository.get_action(session=session, action_id=request.action_id)
    assert (stored.status, stored.detail, stored.steps) == ("succeeded", "ok", ["a", "b"])
    assert stored.finished_at == NOW + timedelta(seconds=3)


async def test_finish_refuses_a_status_that_is_not_final(sessions):
    request = _request()
    record = await _claim(sessions, request)
    async with sessions() as session:
        with pytest.raises(ValueError, match="not a finished action status"):
            await repository.finish(session=session, record=record, status="executing", detail="", steps=[], now=NOW)


async def test_ledger_view_excludes_the_action_being_decided(sessions):
    incident = uuid.uuid4()
    earlier = _request("n1", incident)
    await _claim(sessions, earlier, now=NOW - timedelta(minutes=20))  # outside the window
    async with sessions() as session:
        record = await repository.get_action(session=session, action_id=earlier.action_id)
        await repository.finish(session=session, record=record, status="failed", detail="", steps=[], now=NOW)
        await session.commit()
    await _claim(sessions, _request("n2"), now=NOW - timedelta(minutes=5))  # still executing
    blocked = _request("n3")
    await _claim(sessions, blocked, now=NOW - timedelta(minutes=1))
    async with sessions() as session:
        record = await repository.get_action(session=session, action_id=blocked.action_id)
        await repository.finish(session=session, record=record, status="blocked", detail="", steps=[], now=NOW)
        await session.commit()
    current = _request("n1", incident)
    await _claim(sessions, current)

    async with sessions() as session:
        view = await repository.ledger_view(session=session, request=current, now=NOW, window_s=600, node_window_s=1800)
    assert view.actions_on_node == 1  # n1's failed action 20 minutes ago; the current one excluded
    assert view.executing_on_node == ()
    assert view.nodes_in_window == frozenset({"n2"})  # n1 too old, n3 blocked, the current one excluded
    assert view.breaker_open_since is None

    async with sessions() as session:
        on_n2 = await repository.ledger_view(session=session, request=_request("n2"), now=NOW, window_s=600, node_window_s=1800)
    assert len(on_n2.executing_on_node) == 1


async def test_trip_is_single_until_reset_and_reset_restarts_the_window(sessions):
    await _claim(sessions, _request("n1"), now=NOW - timedelta(minutes=2))
    async with sessions() as session:
        first = await breaker.trip(session=session, reason="too many", now=NOW)
        second = await breaker.trip(session=session, reason="again", now=NOW + timedelta(seconds=1))
        await session.commit()
    assert second.id == first.id
    async with sessions() as session:
        view = await repository.ledger_view(session=session, request=_request("n9"), now=NOW, window_s=600, node_window_s=1800)
    assert view.breaker_open_since == NOW and view.breaker_reason == "too many"

    async with sessions() as session:
        reset = await breaker.reset(session=session, by="alice", now=NOW + timedelta(minutes=1))
        await session.commit()
    assert [t.reset_by for t in reset] == ["alice"]
    async with sessions() as session:
        assert await breaker.reset(session=session, by="bob", now=NOW + timedelta(minutes=2)) == []
        view = await repository.ledger_view(
            session=session, request=_request("n9"), now=NOW + timedelta(minutes=2), window_s=600, node_window_s=1800
        )
    assert view.breaker_open_since is None
    assert view.nodes_in_window == frozenset()  # n1 acted before the reset


async def test_drains_and_undrains_count_for_neither_the_breaker_nor_the_node_limit(sessions):
    from gpumedic_events import DrainNode, UndrainNode

    for node, operation in (("n1", DrainNode()), ("n1", UndrainNode()), ("n2", UndrainNode())):
        await _claim(sessions, _request(node).model_copy(update={"operation": operation}), status="succeeded")
    async with sessions() as session:
        view = await repository.ledger_view(session=session, request=_request("n3"), now=NOW, window_s=600, node_window_s=1800)
        on_n1 = await repository.ledger_view(session=session, request=_request("n1"), now=NOW, window_s=600, node_window_s=1800)
    assert view.nodes_in_window == frozenset() and on_n1.actions_on_node == 0


async def test_a_node_is_drained_while_any_incident_holds_it(sessions):
    first, second = _request("n1"), _request("n1")
    async with sessions() as session:
        await repository.hold_drained(session=session, request=first, holder=str(first.incident_id), now=NOW)
        await repository.hold_drained(session=session, request=second, holder=str(second.incident_id), now=NOW + timedelta(seconds=1))
        await repository.hold_drained(session=session, request=first, holder=str(first.incident_id), now=NOW + timedelta(seconds=2))  # asked again
        await session.commit()
    async with sessions() as session:
        assert [r.incident_id for r in await views.drains(session=session, node_id="n1")] == [
            str(first.incident_id), str(second.incident_id)
        ]
        await repository.release_drained(session=session, node_id="n1", holder=str(first.incident_id))
        await repository.release_drained(session=session, node_id="n1", holder=str(first.incident_id))  # twice: no error
        await session.commit()
    async with sessions() as session:
        assert [r.incident_id for r in await views.drains(session=session)] == [str(second.incident_id)]


async def test_the_nodes_killed_for_an_incident_are_those_of_its_succeeded_kills_and_job_stops(sessions):
    from gpumedic_events import RankTarget, StopJob

    incident = uuid.uuid4()
    ranks = tuple(RankTarget(node_id=n, gpu_index=0, pid=4242, start_ticks=1, command="python") for n in ("n2", "n3"))
    stop = _request("n3", incident).model_copy(update={"action_id": uuid.uuid4(), "attempt": 2,
                                                      "operation": StopJob(job="slurm:7", ranks=ranks, max_gpu_utilization_pct=4)})
    failed_kill = _request("n4", incident)
    for request, status in ((_request("n1", incident), "succeeded"), (stop, "succeeded"), (failed_kill, "failed"),
                            (_request("n5"), "succeeded")):
        await _claim(sessions, request)
        async with sessions() as session:
            record = await repository.get_action(session=session, action_id=request.action_id)
            await repository.finish(session=session, record=record, status=status, detail="", steps=[], now=NOW)
            await session.commit()
    async with sessions() as session:
        assert await repository.killed(session=session, incident_id=incident) == {"n1", "n2", "n3"}
        assert await repository.killed(session=session, incident_id=uuid.uuid4()) == frozenset()
