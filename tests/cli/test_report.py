"""`gpumedic report` as an operator runs it: on a simulated fleet after faults it lists every open
problem, most urgent first, and nothing for a healthy node; its checks catch a weak key and nodes
missing from known_hosts; secrets stay masked."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime

import asyncssh
import pytest

from gpumedic.cli import main
from gpumedic.report import Check, Sources, build_report, render
from gpumedic_sim.runs.scenario import parse_scenario
from gpumedic_sim.runs.simulate import run_simulation
from gpumedic_store import create_engine, session_factory, upgrade
from gpumedic_store.models import Incident

FAULTS = {"name": "report-check", "duration_s": 30, "faults": [
    {"at": "2s", "fault": "zombie_job", "node": 2, "gpu": 1},   # fixed by gpumedic: not a problem any more
    {"at": "2s", "fault": "gpu_lost", "node": 3, "gpu": 0},     # critical, for a person
    {"at": "2s", "fault": "disk_full", "node": 4, "path": "/"},  # for a person
]}


@pytest.mark.long
@pytest.mark.timeout(300)
async def test_after_the_faults_every_open_problem_is_listed_by_priority_and_no_healthy_node(tmp_path, capsys):
    var = tmp_path / "var"
    plan = lambda ids, gpus: parse_scenario(FAULTS, source="report-check", node_ids=ids, gpus_per_node=gpus)  # noqa: E731
    lines: list[str] = []
    assert await run_simulation(var, nodes=6, gpus=2, scenario=plan, interval_s=1.0, say=lines.append) == 0, "\n".join(lines)

    code = await _cli(["report", "--var", str(var), "--store", f"sqlite:///{var}/gpumedic.db", "--format", "json"])
    report = json.loads(capsys.readouterr().out)
    assert code == 1, "a critical problem for a person is a P1: the exit status says something needs doing now"
    by_node = {}
    for r in report["recommendations"]:
        by_node.setdefault(r["node"], []).append(r)
    fleet_nodes = {n for n in by_node if n and n.startswith("sim-node-")}
    assert fleet_nodes == {"sim-node-03", "sim-node-04"}, by_node  # the zombie was fixed; 1, 5 and 6 are healthy
    assert [r["priority"] for r in by_node["sim-node-03"]] == [1] and "gpu_lost" in by_node["sim-node-03"][0]["issue"]
    assert [r["priority"] for r in by_node["sim-node-04"]] == [1] and "disk_pressure" in by_node["sim-node-04"][0]["issue"]
    assert all("a person must look" in r["action"] for n in fleet_nodes for r in by_node[n])
    assert [r["priority"] for r in report["recommendations"]] == sorted(r["priority"] for r in report["recommendations"])
    checks = {c["name"]: c["status"] for c in report["checks"]}
    assert {n: checks[n] for n in ("ssh key", "inventory", "known_hosts", "store")} == dict.fromkeys(("ssh key", "inventory", "known_hosts", "store"), "ok")
    assert set(report["fleet"]["nodes_with_problems"]) >= {"sim-node-03", "sim-node-04"}
    assert report["fleet"]["nodes_in_inventory"] == 6


async def _cli(argv: list[str]) -> int:
    import asyncio

    return await asyncio.to_thread(main, argv)  # the command runs its own event loop


def _incident(**fields) -> Incident:
    now = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    base = dict(id=str(uuid.uuid4()), node_id="gpu-node-07", kind="zombie_job", gpu_index=0, fingerprint="x", status="open",
                summary="", opened_at=now, updated_at=now, closed_at=None, evidence={}, detector="zombie-detector",
                severity="warning", recommended_action="", occurrences=1)
    return Incident(**base | fields)


async def test_checks_name_a_weak_key_and_the_nodes_known_hosts_lacks_and_secrets_stay_masked(tmp_path):
    store = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(store)
    engine = create_engine(store)
    async with session_factory(engine)() as session:
        session.add(_incident(summary="hung: python train.py --api-key=sk-live-123 --epochs 9",
                              evidence={"command": "python train.py --password hunter2"}))
        session.add(_incident(node_id="gpu-node-08", kind="fleet_anomaly", status="open", severity="warning", detector="zombie-detector"))
        await session.commit()
    await engine.dispose()
    key = tmp_path / "id_rsa"
    asyncssh.generate_private_key("ssh-rsa", key_size=2048).write_private_key(str(key))
    key.chmod(0o600)
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("nodes:\n  gpu-node-07: {host: 10.0.0.7}\n  gpu-node-08: {host: 10.0.0.8, port: 2222}\n")
    known = tmp_path / "known_hosts"
    host_key = asyncssh.generate_private_key("ssh-ed25519").export_public_key().decode()
    known.write_text(f"10.0.0.7 {host_key}")
    report = await build_report(Sources(store, inventory, known, key))

    checks = {c.name: c for c in report.checks}
    assert checks["ssh key"].status == "fail" and "ssh-rsa of 2048 bits" in checks["ssh key"].detail
    assert checks["known_hosts"].status == "fail" and "no host key for 1 of 2 node(s): gpu-node-08" in checks["known_hosts"].detail
    first, *rest = report.recommendations
    assert (first.priority, first.category, first.node) == (1, "fleet", "gpu-node-08")  # a fleet-wide incident holds every action
    assert [r.priority for r in rest] == [2, 2, 3]  # key and known_hosts stop actions; the zombie is being handled
    for fmt in ("json", "md", "html"):
        text = render(report, fmt)
        assert "sk-live-123" not in text and "hunter2" not in text and "--api-key=***" in text
    assert "<td>P1 now</td>" in render(report, "html")
    shown = await build_report(Sources(store, inventory, known, key), show_secrets=True)
    assert "sk-live-123" in render(shown, "json")
    only = await build_report(Sources(store, inventory, known, key), node="gpu-node-07")
    assert {p["node_id"] for p in only.problems} == {"gpu-node-07"}


async def test_a_service_that_lost_a_consumer_is_a_p1_and_one_behind_its_samples_is_said_read_from_their_heartbeats(nats_settings, js):
    from gpumedic.report import Report, _check_bus, _recommend
    from gpumedic_events import ConsumerLag, ServiceHeartbeat

    checks: list = []
    checking = asyncio.create_task(_check_bus(Sources("sqlite://", nats=nats_settings), checks))
    lost = ServiceHeartbeat(source="report-builder", service="report-builder", instance_id=uuid.uuid4(), state="ready",
                            consumers_missing=("report-builder-SilenceAdded",))
    behind = ServiceHeartbeat(source="zombie-detector", service="zombie-detector", instance_id=uuid.uuid4(), state="ready",
                              lag=(ConsumerLag(durable="zombie-detector-samples", pending=47_467, behind_s=34.2),))
    keeping_up = ServiceHeartbeat(source="autoscaler", service="autoscaler", instance_id=uuid.uuid4(), state="ready",
                                  lag=(ConsumerLag(durable="autoscaler-samples", pending=12, behind_s=0.4),))
    while not checking.done():
        for beat in (lost, behind, keeping_up):
            await js._nc.publish(beat.subject, beat.to_json())
        await asyncio.sleep(0.5)
    by_name = {c.name: c for c in checks}
    check = by_name["consumers"]
    assert check.status == "fail" and "report-builder-SilenceAdded (report-builder)" in check.detail
    assert by_name["samples"].status == "warn"
    assert "zombie-detector 34s behind (47,467 samples waiting on zombie-detector-samples)" in by_name["samples"].detail
    assert "autoscaler" not in by_name["samples"].detail
    report = Report(generated_at=datetime.now(UTC), store="x", checks=[check])
    [first] = _recommend(report, [], None, lambda v: v)
    assert first.priority == 1 and "gpumedic provision" in first.issue


async def test_a_key_whose_public_half_is_another_keys_fails_the_check(tmp_path):
    """Runbook 001: the nodes authorized the key in id_ed25519.pub; if that is not the private key's
    own half, every login fails. A matching .pub, or none, passes."""
    from gpumedic.report import _check_ssh

    key = tmp_path / "id_ed25519"
    private = asyncssh.generate_private_key("ssh-ed25519")
    private.write_private_key(str(key))
    key.chmod(0o600)

    def checked() -> Check:
        checks: list = []
        _check_ssh(Sources("sqlite://", client_key=key), checks)
        return {c.name: c for c in checks}["ssh key"]

    assert checked().status == "ok"
    private.write_public_key(str(key) + ".pub")
    assert checked().status == "ok"
    asyncssh.generate_private_key("ssh-ed25519").write_public_key(str(key) + ".pub")
    mismatch = checked()
    assert mismatch.status == "fail" and "id_ed25519.pub is not id_ed25519's public half" in mismatch.detail
    assert "ssh-keygen -y -f" in mismatch.detail


async def test_kept_reports_say_what_changed_since_the_last_one(tmp_path, capsys):
    var = tmp_path / "var"
    store = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(store)
    engine = create_engine(store)
    first = _incident(node_id="gpu-node-07", summary="first", status="escalated", severity="critical")
    async with session_factory(engine)() as session:
        session.add(first)
        await session.commit()
    argv = ["report", "--var", str(var), "--store", store, "--format", "json", "--keep"]
    assert await _cli(argv) == 1
    out = capsys.readouterr()
    assert "since" not in json.loads(out.out)  # nothing kept before it
    (kept,) = (var / "reports").glob("report-*.json")
    assert oct(kept.stat().st_mode & 0o777) == "0o600" and "report kept as" in out.err
    assert json.loads(kept.read_text())["recommendations"][0]["incident_id"] == first.id

    # a person closed the first; a second problem opened; a damaged file beside the kept one is passed over
    async with session_factory(engine)() as session:
        (await session.get(Incident, first.id)).status = "resolved"
        second = _incident(node_id="gpu-node-09", kind="gpu_lost", summary="second", status="escalated", severity="critical")
        session.add(second)
        await session.commit()
    await engine.dispose()
    (var / "reports" / "report-29991231T000000Z.json").write_text("{not json")
    await asyncio.sleep(1.1)  # a kept report is named by the second it was made
    assert await _cli(argv[:-2] + ["md", "--keep"]) == 1
    text = capsys.readouterr().out
    since = text.split("## Since the last kept report (")[1].split("## Checks")[0]
    new, gone = [line for line in since.splitlines() if line.startswith("- new:")], [line for line in since.splitlines() if line.startswith("- gone:")]
    assert len(new) == 1 and "gpu_lost" in new[0] and len(gone) == 1 and "zombie_job" in gone[0]
    assert len([p for p in (var / "reports").glob("report-*.json") if p.name != "report-29991231T000000Z.json"]) == 2


async def test_the_provider_and_task_queue_checks_are_the_autoscalers_latest_round_as_report_builder_kept_it(tmp_path):
    """Runbook 001 checks the provider's API with its key and the task database: the report reads
    how the autoscaler's latest round (which holds both credentials) fared, as report-builder stored
    it, and says which failed, with secrets masked; a good round is ok; an old one is said to be old."""
    from datetime import timedelta

    from gpumedic_events import CapacityEvaluated
    from report_builder.repository import record_capacity_check

    store = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(store)

    async def keep(ago_s: float, **fields) -> None:
        event = CapacityEvaluated(source="autoscaler", occurred_at=datetime.now(UTC) - timedelta(seconds=ago_s), nodes_seen=4,
                                  gpus_total=32, gpus_busy=20, decision="hold", reason="r", **fields)
        engine = create_engine(store)
        async with session_factory(engine)() as session:
            await record_capacity_check(session, event=event)
            await session.commit()
        await engine.dispose()

    assert not [c for c in (await build_report(Sources(store))).checks if c.name in ("provider", "task queue")], "no round: no check"
    await keep(30, workers=3, workers_in_service=2, cost_per_h=4.5, queued=17, in_progress=5)
    checks = {c.name: c for c in (await build_report(Sources(store))).checks}
    assert checks["provider"].status == "ok" and "listed 3 worker(s), 2 in service, $4.50/h" in checks["provider"].detail
    assert checks["task queue"].status == "ok" and "17 queued, 5 in progress" in checks["task queue"].detail
    assert "autoscaler" not in checks

    await keep(5, provider_error="GET https://rest.runpod.io/v1/pods?api_key=rpa_SECRET123: HTTP 401 Unauthorized",
               demand_error="task database postgresql://tasks:hunter2@db:5432/q: connection refused")
    report = await build_report(Sources(store))
    checks = {c.name: c for c in report.checks}
    assert checks["provider"].status == "fail" and "HTTP 401 Unauthorized" in checks["provider"].detail
    assert checks["task queue"].status == "fail" and "connection refused" in checks["task queue"].detail
    text = render(report, "json")
    assert "rpa_SECRET123" not in text and "hunter2" not in text
    pool = [r for r in report.recommendations if r.issue.startswith(("provider", "task queue"))]
    assert [(r.priority, r.action) for r in pool] == [(2, "fix it: gpumedic cannot scale the worker pool until then")] * 2

    await keep(-1, workers=3)  # the autoscaler stopped long ago: its last round is an hour old
    engine = create_engine(store)
    async with session_factory(engine)() as session:
        from sqlalchemy import update

        from gpumedic_store.models import CapacityCheck
        await session.execute(update(CapacityCheck).values(checked_at=datetime.now(UTC) - timedelta(hours=1)))
        await session.commit()
    await engine.dispose()
    checks = {c.name: c for c in (await build_report(Sources(store))).checks}
    assert checks["autoscaler"].status == "warn" and "60 min ago" in checks["autoscaler"].detail
