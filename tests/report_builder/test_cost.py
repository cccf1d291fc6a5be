"""What an incident cost, checked against the arithmetic of its timeline and its price: a zombie's
GPU idle from before it opened until it was fixed, a leftover holder, a drained node, a rented
worker stuck spawning at its provider's price, a worker with a stale heartbeat, a lost GPU, a
container death (no GPU time counted), and no price known. Then report-builder itself: its
handler keeps the cost on the incident as the events arrive (SQLite), prices with the inventory,
says IncidentCosted once the incident closes (the same message again on a redelivery, counted
once), and counts it on /metrics."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

import pytest
from prometheus_client import CollectorRegistry
from sqlalchemy import select

from gpumedic_bus import Delivery
from gpumedic_events import ActionCompleted, IncidentCosted, IncidentOpened, IncidentResolved
from gpumedic_events.base import json_examples
from gpumedic_store import ActionRecord, Incident, create_engine, session_factory, upgrade
from gpumedic_store.cost import Cost, Price, cost_of
from report_builder.handlers import ReportHandlers
from report_builder.pricing import Pricing

T0 = datetime(2026, 11, 26, 10, 0, tzinfo=UTC)
LATER = T0 + timedelta(days=1)
"""A time after every incident here closed."""


def test_a_zombie_costs_its_idle_gpu_from_before_it_opened_until_fixed():
    cost = cost_of(kind="zombie_job", gpu_index=3, evidence={"idle_seconds": 1800.0}, opened_at=T0, closed_at=T0 + timedelta(minutes=6),
                   price=Price(gpus=8, per_gpu_hour=2.49, provider="lambda"))
    assert cost.gpu_hours(LATER) == pytest.approx(36 / 60)  # 30 min before + 6 min after, one GPU
    assert cost.dollars(LATER) == pytest.approx(0.6 * 2.49)
    assert cost.provider == "lambda" and "GPU 3 idle from 1800 s" in cost.what


def test_an_open_incident_costs_up_to_now_and_the_kept_form_reads_back_the_same():
    cost = cost_of(kind="orphan_gpu_holder", gpu_index=0, evidence={"held_s": 600}, opened_at=T0, closed_at=None, price=Price(per_gpu_hour=4.0))
    later = T0 + timedelta(minutes=50)
    assert cost.gpu_hours(later) == pytest.approx(1.0)
    kept = cost.as_json(later)
    assert kept["gpu_hours"] == 1.0 and kept["usd"] == 4.0 and kept["until"] is None
    assert Cost.from_json(kept).gpu_hours(later + timedelta(hours=1)) == pytest.approx(2.0)  # still losing


def test_a_drained_node_costs_all_its_gpus_from_the_drain_on():
    drained = T0 + timedelta(minutes=10)
    cost = cost_of(kind="zombie_job", gpu_index=1, evidence={"idle_seconds": 0}, opened_at=T0, closed_at=T0 + timedelta(minutes=70),
                   drained_at=drained, price=Price(gpus=8, per_gpu_hour=2.0))
    assert cost.gpu_hours(LATER) == pytest.approx(10 / 60 + 8 * 1.0)  # one GPU for 10 min, then 8 GPUs for an hour
    assert cost.dollars(LATER) == pytest.approx((10 / 60 + 8) * 2.0)
    unknown = cost_of(kind="gpu_xid", gpu_index=1, evidence={}, opened_at=T0, closed_at=T0 + timedelta(hours=1), drained_at=drained)
    assert unknown.gpu_hours(LATER) == 0 and "GPU count is not known" in unknown.what


def test_a_rented_worker_is_priced_by_its_provider():
    stuck = cost_of(kind="stuck_spawning", gpu_index=None, opened_at=T0, closed_at=T0 + timedelta(minutes=5),
                    evidence={"gpus": 2, "price_per_h": 5.0, "billed_s": 900, "provider": "runpod"}, price=Price(per_gpu_hour=99.0))
    assert stuck.gpu_hours(LATER) == pytest.approx(2 * 20 / 60)  # billed 15 min before it opened, 5 after, 2 GPUs
    assert stuck.dollars(LATER) == pytest.approx(5.0 * 20 / 60)  # the provider's $5/h, not the inventory's
    assert stuck.provider == "runpod" and "$5.00/h" in stuck.price_from
    stale = cost_of(kind="stale_heartbeat", gpu_index=None, opened_at=T0, closed_at=T0 + timedelta(minutes=8),
                    evidence={"gpus": 1, "price_per_h": 1.2, "heartbeat_age_s": 120})
    assert stale.gpu_hours(LATER) == pytest.approx(10 / 60)


def test_kinds_that_lose_no_gpu_time_and_missing_prices_say_so():
    died = cost_of(kind="container_died", gpu_index=0, evidence={"exit_code": 137}, opened_at=T0, closed_at=T0 + timedelta(hours=1),
                   price=Price(gpus=8, per_gpu_hour=2.0))
    assert died.gpu_hours(LATER) == 0 and died.dollars(LATER) == 0 and "no GPU time counted" in died.what
    lost = cost_of(kind="gpu_lost", gpu_index=5, evidence={}, opened_at=T0, closed_at=T0 + timedelta(hours=2))
    assert lost.gpu_hours(LATER) == pytest.approx(2.0) and lost.dollars(LATER) is None and "no price" in lost.what
    odd = cost_of(kind="zombie_job", gpu_index=0, evidence={"idle_seconds": "lots"}, opened_at=T0, closed_at=T0 + timedelta(hours=1))
    assert odd.gpu_hours(LATER) == pytest.approx(1.0)  # a garbled idle time counts as none, not as an error


@pytest.fixture
async def store(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    yield session_factory(engine)
    await engine.dispose()


def _event(cls, **fields):
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **fields})


async def test_report_builder_keeps_the_cost_and_says_it_once_the_incident_closes(store, tmp_path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {price_per_gpu_hour: 2.5, gpus: 8}\n"
                         "groups: {lambda: {labels: {provider: lambda}, price_per_gpu_hour: 3.0}}\n"
                         "nodes:\n  gpu-node-07: {host: 10.0.0.7, group: lambda}\n")
    published, registry = [], CollectorRegistry()

    async def publish(event):
        published.append(event)

    handlers = ReportHandlers(store, _tracer(), pricing=Pricing(inventory), publish=publish, registry=registry)
    incident = str(uuid.uuid4())
    opened = _event(IncidentOpened, incident_id=incident, node_id="gpu-node-07", kind="zombie_job", gpu_index=0,
                    occurred_at=T0.isoformat(), evidence={"idle_seconds": 1200.0})
    drained_at = T0 + timedelta(minutes=10)
    async with store() as session:
        session.add(ActionRecord(
            action_id=str(uuid.uuid4()), incident_id=incident, node_id="gpu-node-07", attempt=1, operation={"operation": "drain_node"},
            requested_by="zombie-detector", reason="", status="succeeded", detail="", steps=[], audit=[],
            requested_at=drained_at, started_at=drained_at, finished_at=drained_at,
        ))
        await session.commit()
    drain = _event(ActionCompleted, incident_id=incident, node_id="gpu-node-07", occurred_at=drained_at.isoformat())
    resolved = _event(IncidentResolved, incident_id=incident, node_id="gpu-node-07", kind="zombie_job", gpu_index=0,
                      occurred_at=(T0 + timedelta(minutes=40)).isoformat())
    for event in (opened, drain, resolved, resolved):  # the end delivered twice
        await handlers.on_incident_or_action(event, Delivery(event.subject, {}, 1))

    async with store() as session:
        row = (await session.scalars(select(Incident))).one()
    expected_hours = (20 + 10) / 60 + 8 * 30 / 60  # GPU 0 idle 20 min before it opened and 10 after; then 8 GPUs drained for 30 min
    assert row.gpu_hours == pytest.approx(expected_hours, abs=1e-4)
    assert row.cost_usd == pytest.approx(round(expected_hours * 3.0, 2))  # the group's price, not the default's
    assert row.cost["provider"] == "lambda" and row.cost["until"] == (T0 + timedelta(minutes=40)).isoformat()

    assert len(published) == 2 and published[0].event_id == published[1].event_id  # one message on the bus
    costed = published[0]
    assert isinstance(costed, IncidentCosted) and costed.gpu_hours == row.gpu_hours and costed.usd == row.cost_usd
    assert costed.closed_at == T0 + timedelta(minutes=40) and costed.opened_at == T0
    assert registry.get_sample_value("gpumedic_incident_gpu_hours_lost_total", {"kind": "zombie_job", "provider": "lambda"}) == pytest.approx(row.gpu_hours)
    assert registry.get_sample_value("gpumedic_incident_cost_dollars_total", {"kind": "zombie_job", "provider": "lambda"}) == pytest.approx(row.cost_usd)


def _tracer():
    from opentelemetry.sdk.trace import TracerProvider

    return TracerProvider().get_tracer("test")


def test_costs_sum_by_kind_provider_node_and_day_within_the_window():
    from types import SimpleNamespace

    from gpumedic_store.cost import summed

    def incident(kind, node, opened, hours, price, provider=None):
        cost = cost_of(kind=kind, gpu_index=0, evidence={}, opened_at=opened, closed_at=opened + timedelta(hours=hours),
                       price=Price(per_gpu_hour=price, provider=provider))
        return SimpleNamespace(kind=kind, node_id=node), cost

    day = datetime(2026, 11, 20, tzinfo=UTC)
    costs = [
        incident("gpu_lost", "n1", day + timedelta(hours=20), 6, 2.0, "lambda"),  # 4 h on the 20th, 2 h on the 21st
        incident("gpu_lost", "n2", day + timedelta(days=1, hours=1), 1, None),  # no price
        incident("gpu_lost", "n3", day - timedelta(days=3), 1, 9.0),  # before the window
    ]
    now = day + timedelta(days=2)
    by_day = summed(costs, by="day", since=day, now=now)
    assert [(line.group, line.gpu_hours, line.usd) for line in by_day] == [("2026-11-20", 4.0, 8.0), ("2026-11-21", 3.0, 4.0)]
    assert by_day[1].unpriced_gpu_hours == 1.0
    by_provider = {line.group: line for line in summed(costs, by="provider", since=day, now=now)}
    assert by_provider["lambda"].usd == 12.0 and by_provider["(none named)"].gpu_hours == 1.0
    assert [line.group for line in summed(costs, by="node", since=day + timedelta(days=1), now=now)] == ["n1", "n2"]
    with pytest.raises(ValueError, match="by must be one of"):
        summed(costs, by="colour", since=day, now=now)


async def test_gpumedic_cost_sums_what_the_store_keeps(tmp_path, capsys):
    """`gpumedic cost` over a store that report-builder's handler filled: the table and the JSON
    agree with the incidents' own figures; a bad --since is exit 2 with what a good one is."""
    import json

    from gpumedic.cli import main

    url, _ = await _seed(tmp_path)

    import asyncio

    async def gpumedic(*argv: str) -> int:  # the CLI runs its own event loop
        return await asyncio.to_thread(main, list(argv))

    assert await gpumedic("cost", "--store", url, "--by", "node", "--json") == 0
    report = json.loads(capsys.readouterr().out)
    by_node = {line["group"]: line for line in report["lines"]}
    assert by_node["n1"]["gpu_hours"] == pytest.approx((60 + 30 + 10 + 10) / 60) and by_node["n1"]["incidents"] == 2
    assert by_node["n2"]["usd"] == pytest.approx(1.5 * 2.0)
    assert report["total"]["usd"] == pytest.approx((110 / 60 + 1.5) * 2.0)
    assert await gpumedic("cost", "--store", url, "--by", "provider") == 0
    text = capsys.readouterr().out
    assert "acme" in text and "by provider" in text and f"{(110 / 60 + 1.5) * 2.0:,.2f}" in text
    assert await gpumedic("cost", "--store", url, "--since", "yesterday") == 2
    assert "use minutes, hours or days such as 30m, 6h, 7d" in capsys.readouterr().err


async def _seed(tmp_path) -> tuple[str, list[str]]:
    """A store filled by report-builder's handler: three zombie incidents on two nodes of an
    inventory at $2 a GPU-hour; the store's URL and the incidents' ids."""
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {price_per_gpu_hour: 2.0, labels: {provider: acme}}\nnodes:\n  n1: {host: 10.0.0.1}\n  n2: {host: 10.0.0.2}\n")
    handlers = ReportHandlers(sessions, _tracer(), pricing=Pricing(inventory))
    now = datetime.now(UTC)
    ids: list[str] = []
    for node, idle_s, lasted in (("n1", 3600.0, 30), ("n2", 0.0, 90), ("n1", 600.0, 10)):
        incident, opened = str(uuid.uuid4()), now - timedelta(hours=3)
        ids.append(incident)
        for event in (
            _event(IncidentOpened, incident_id=incident, node_id=node, kind="zombie_job", gpu_index=0, occurred_at=opened.isoformat(),
                   evidence={"idle_seconds": idle_s}),
            _event(IncidentResolved, incident_id=incident, node_id=node, kind="zombie_job", gpu_index=0,
                   occurred_at=(opened + timedelta(minutes=lasted)).isoformat()),
        ):
            await handlers.on_incident_or_action(event, Delivery(event.subject, {}, 1))
    await engine.dispose()
    return url, ids


async def test_the_console_shows_what_incidents_cost(tmp_path):
    import asyncio

    import httpx

    from report_builder.console import Console, ConsoleConfig

    url, ids = await _seed(tmp_path)
    engine = create_engine(url)
    console = Console(session_factory(engine), ConsoleConfig(port=0), publish=lambda e: asyncio.sleep(0))
    await console.start()
    try:
        async with httpx.AsyncClient(base_url=console.url.rstrip("/")) as client:
            page = (await client.get("/cost?since=1d&by=node")).text
            assert '<a href="/nodes/n1">n1</a></td>\n<td>2</td><td>1.83</td><td>3.67</td>' in page
            assert "3.3 GPU-hours</strong> lost to incidents, <strong>$6.67</strong>" in page
            assert "GPU 0 idle from 3600 s before it opened" in page  # the costliest incidents, and what was counted
            incident = (await client.get(f"/incidents/{ids[0]}")).text
            assert "<dt>cost</dt><dd>1.50 GPU-hours, $3.00 at $2.00 a GPU-hour (the inventory&#39;s price_per_gpu_hour)" in incident
            bad = await client.get("/cost?by=colour")
            assert bad.status_code == 400 and "by must be one of kind, node, provider, day" in bad.text
    finally:
        await console.stop()
        await engine.dispose()


def test_pricing_follows_the_inventory_file_and_says_once_when_it_cannot_read_it(tmp_path, caplog):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("defaults: {price_per_gpu_hour: 2.0}\nnodes:\n  n1: {host: 10.0.0.1, gpus: 4}\n")
    pricing = Pricing(inventory)
    assert pricing.price("n1") == Price(gpus=4, per_gpu_hour=2.0, provider=None)
    inventory.write_text("nodes: [not, a, mapping]\n")
    for _ in range(50):
        assert pricing.price("n1") == Price(gpus=4, per_gpu_hour=2.0, provider=None)  # what was read before
    assert sum("pricing:" in r.message for r in caplog.records) == 1
    inventory.write_text("defaults: {price_per_gpu_hour: 3.0}\nnodes:\n  n1: {host: 10.0.0.1, gpus: 4}\n")
    assert pricing.price("n1").per_gpu_hour == 3.0


def test_a_failed_burn_in_costs_the_worker_from_its_rental_until_it_was_ended_at_its_providers_price():
    ended = T0 + timedelta(minutes=2)
    cost = cost_of(kind="burn_in_failed", gpu_index=None, opened_at=T0, closed_at=ended,
                   evidence={"gpus": 2, "price_per_h": 4.98, "billed_s": 300, "provider": "runpod", "host_id": "m-3"})
    assert cost.gpu_hours(LATER) == pytest.approx(2 * 7 / 60)  # 5 min on trial before it failed, 2 min to end it
    assert cost.dollars(LATER) == pytest.approx(7 / 60 * 4.98) and cost.provider == "runpod"


def test_a_repeat_offender_on_a_rented_worker_costs_its_gpus_from_the_drain_at_its_providers_price():
    drained, ended = T0 + timedelta(seconds=20), T0 + timedelta(minutes=3)
    cost = cost_of(kind="repeat_offender", gpu_index=None, opened_at=T0, closed_at=ended, drained_at=drained,
                   evidence={"gpus": 8, "price_per_h": 19.92, "provider": "runpod", "host_id": "m-2", "counted_kind": "gpu_lost"},
                   price=Price(per_gpu_hour=99.0))  # an inventory price for a node of that name does not apply to a rented worker
    assert cost.gpu_hours(LATER) == pytest.approx(8 * 160 / 3600)
    assert cost.dollars(LATER) == pytest.approx(160 / 3600 * 19.92) and "drained from" in cost.what


def test_a_repeat_offender_still_open_costs_nothing_after_its_worker_was_terminated():
    """The incident stays open while its machine offends (days); the provider billed up to the termination."""
    drained, terminated = T0 + timedelta(seconds=20), T0 + timedelta(seconds=50)
    cost = cost_of(kind="repeat_offender", gpu_index=None, opened_at=T0, closed_at=None, drained_at=drained, terminated_at=terminated,
                   evidence={"gpus": 8, "price_per_h": 19.92, "provider": "runpod", "host_id": "m-2", "counted_kind": "gpu_lost"})
    assert cost.gpu_hours(T0 + timedelta(days=6)) == pytest.approx(8 * 30 / 3600) == cost.gpu_hours(terminated)
    assert Cost.from_json(cost.as_json(LATER)).until == terminated and "terminated at 10:00:50Z" in cost.what
    stuck = cost_of(kind="stuck_spawning", gpu_index=None, opened_at=T0, closed_at=T0 + timedelta(seconds=40), terminated_at=terminated,
                    evidence={"gpus": 2, "price_per_h": 4.98, "billed_s": 600})
    assert stuck.gpu_hours(LATER) == pytest.approx(2 * 640 / 3600)  # closed before the termination was recorded: the close ends it


async def test_report_builder_ends_the_cost_at_the_terminate_workers_success(store):
    handlers = ReportHandlers(store, _tracer())
    incident = str(uuid.uuid4())
    opened = _event(IncidentOpened, incident_id=incident, node_id="pod7xq2a9k", kind="repeat_offender", gpu_index=None, occurred_at=T0.isoformat(),
                    evidence={"gpus": 8, "price_per_h": 19.92, "provider": "runpod", "host_id": "m-2"})
    async with store() as session:
        for operation, at in (("drain_node", T0 + timedelta(seconds=20)), ("terminate_worker", T0 + timedelta(seconds=50))):
            session.add(ActionRecord(
                action_id=str(uuid.uuid4()), incident_id=incident, node_id="pod7xq2a9k", attempt=1, operation={"operation": operation},
                requested_by="autoscaler", reason="", status="succeeded", detail="", steps=[], audit=[],
                requested_at=at, started_at=at, finished_at=at,
            ))
        await session.commit()
    terminated = _event(ActionCompleted, incident_id=incident, node_id="pod7xq2a9k", occurred_at=(T0 + timedelta(seconds=50)).isoformat())
    for event in (opened, terminated):
        await handlers.on_incident_or_action(event, Delivery(event.subject, {}, 1))
    async with store() as session:
        row = (await session.scalars(select(Incident))).one()
    assert row.closed_at is None and row.gpu_hours == pytest.approx(8 * 30 / 3600, abs=1e-4)
    assert row.cost_usd == pytest.approx(round(30 / 3600 * 19.92, 2)) and row.cost["until"].startswith("2026-11-26T10:00:50")
