"""A job's secrets never leave the node in clear. Secrets seeded into a zombie job's command line (a
password, an API key, a URL with credentials) and into a crashed container's command line and last
log lines (a bearer JWT, an AWS secret) go through the real sampler, zombie-detector, remediator
(which still kills the zombie: its identity check masks the node's command line the same way) and
report-builder, and appear in no store table, NATS stream file, console page, saved HTML, CLI text
or JSON, or webhook body."""

from __future__ import annotations

import asyncio
import json
import uuid
from datetime import UTC, datetime
from pathlib import Path

import httpx
import nats

from gpumedic.actions import action_text
from gpumedic.actions import actions_text
from gpumedic.incidents import incident_text, incidents_text
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_bus.streams import INCIDENT_STATE, INCIDENTS, NODE_EVENTS, SAMPLES
from gpumedic_events import ActionRequested, Event, NodeSampled
from gpumedic_events.base import json_examples
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import ContainerPolicy, FleetPolicy, Kinds, Step, ZombiePolicy
from gpumedic_store import create_engine, session_factory, views
from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import samplers_running
from tests.e2e.test_thin_path import detector, remediator_settings

NODE = "sim-node-01"
POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    kinds=Kinds(
        zombie_job=ZombiePolicy(idle_for_s=1.0, action_timeout_s=30.0, ladder=(Step(action="kill_gpu_processes", verify_within_s=5.0),)),
        container_died=ContainerPolicy(settle_s=0.5, clear_after_s=3600),
    ),
)


def _secrets() -> dict[str, str]:
    tag = uuid.uuid4().hex[:12]
    return {
        "password": f"hunter2{tag}",
        "api key": f"sk-live{tag}xyzxyzxyz",
        "url password": f"pw{tag}",
        "jwt": f"eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiJ{tag}.c2lnbmF0dXJl{tag}",
        "aws secret": f"wJalrXUtnFEMI{tag}K7MDENG",
    }


async def test_secrets_in_a_jobs_command_line_and_logs_are_nowhere_in_clear(nats_server, nats_settings, store_url, apps, tmp_path, webhook):
    secret = _secrets()
    fleet = SimFleet(1, 2, tmp_path / "fleet")
    await fleet.start()
    conn = await nats.connect(nats_settings.url)
    js = conn.jetstream()

    async def publish(event: Event) -> None:
        await js.publish(event.subject, event.to_json())

    reports = reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, console_port=0, webhook_url=webhook.url,
                                         notify_wait_s=0.2, trace_to_bus=True))
    try:
        await apps.start(reports)
        await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
        await apps.start(detector(nats_settings, POLICY))
        node = fleet.node(NODE)
        for gpu in (0, 1):  # each GPU's own job done, a job with secrets in its place
            node.finish_job(gpu)
        zombie = node.start_job(0, argv=(
            "python", "-m", "selfplay", "--gpu", "0", f"--password={secret['password']}", "--api-key", secret["api key"],
            f"https://bob:{secret['url password']}@data.example.org/shards",
        ))
        node.start_job(1, argv=("python", "-m", "selfplay", "--gpu", "1", f"AWS_SECRET_ACCESS_KEY={secret['aws secret']}"))
        async with samplers_running(fleet, publish, 0.2):
            await asyncio.sleep(1.0)
            node.inject_zombie(0)
            node.inject_segfault(1, logs=[f"Authorization: Bearer {secret['jwt']}", f"AWS_SECRET_ACCESS_KEY={secret['aws secret']}"])
            incidents = await _incidents(store_url, {"zombie_job": "resolved", "container_died": "escalated"})
            pages = await asyncio.to_thread(webhook.wait_for, 1, 15.0)
        assert not zombie.alive, "the zombie is still killed: the identity check masks both sides alike"

        # Everything a person or a script can read, while the console runs.
        shown: dict[str, str] = {}
        async with httpx.AsyncClient(base_url=reports.console.url) as client:
            for incident in incidents.values():
                for path in (f"/incidents/{incident.id}", f"/incidents/{incident.id}/report.html"):
                    answer = await client.get(path)
                    assert answer.status_code == 200, path
                    shown[f"console {path}"] = answer.text
            for path in ("/", "/incidents", "/ledger"):
                shown[f"console {path}"] = (await client.get(path)).text
    finally:
        await apps.stop_all()
        await conn.close()
        await fleet.stop()

    for incident in incidents.values():
        shown[f"gpumedic incidents {incident.id}"] = (await incident_text(store_url, incident.id))[1]
        shown[f"gpumedic incidents {incident.id} --json"] = (await incident_text(store_url, incident.id, as_json=True))[1]
    shown["gpumedic incidents --json"] = await incidents_text(store_url, as_json=True)
    shown["gpumedic actions --json"] = await actions_text(store_url, as_json=True)
    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        actions = await views.list_actions(session=session)
    await engine.dispose()
    assert actions, "the zombie's kill is in the ledger"
    for action in actions:
        shown[f"gpumedic actions {action.action_id}"] = (await action_text(store_url, action.action_id))[1]
        shown[f"gpumedic actions {action.action_id} --json"] = (await action_text(store_url, action.action_id, as_json=True))[1]
    shown["webhook bodies"] = "\n".join(json.dumps(page.body) for page in pages)
    shown.update(_files("store", Path(store_url.split("///", 1)[1]).parent, "gpumedic.db*"))
    shown.update(_files("NATS stream file", nats_server.data_dir, "**/*"))

    # What was masked is still shown, masked: the kill's target and the crash's last lines.
    assert "--password=*** --api-key *** https://***@data.example.org/shards" in shown["gpumedic actions --json"]
    assert "Authorization: Bearer ***" in shown[f"gpumedic incidents {incidents['container_died'].id}"]
    leaks = [f"{what} in {where}" for where, text in shown.items() for what, value in secret.items() if value in text]
    assert not leaks, leaks


async def _incidents(store_url: str, wanted: dict[str, str], timeout_s: float = 45.0) -> dict:
    engine = create_engine(store_url)
    try:
        for _ in range(int(timeout_s / 0.25)):
            async with session_factory(engine)() as session:
                rows = await views.list_incidents(session, limit=50)
            found = {r.kind: r for r in rows if wanted.get(r.kind) == r.status}
            if len(found) == len(wanted):
                return found
            await asyncio.sleep(0.25)
    finally:
        await engine.dispose()
    raise AssertionError(f"not all of {wanted} within {timeout_s}s: {[(r.kind, r.status, r.summary) for r in rows]}")


def _files(what: str, root: Path, pattern: str) -> dict[str, str]:
    return {
        f"{what} {path.relative_to(root)}": path.read_bytes().decode("latin-1")
        for path in root.glob(pattern) if path.is_file()
    }


async def test_a_hostile_nodes_unmasked_secrets_stay_in_what_it_sent(nats_server, nats_settings, apps):
    """A node whose sampler does not mask (an old one, or a hostile node) sends a zombie job's command
    line with its secrets in clear. zombie-detector opens the zombie and asks for the kill; the
    secrets are in no stream file of the control plane but the samples the node sent itself."""
    secret = _secrets()
    command = (f"python -m selfplay --password={secret['password']} --api-key {secret['api key']} "
               f"https://bob:{secret['url password']}@data.example.org/shards")
    example = NodeSampled.model_validate(json_examples(NodeSampled)[0])
    gpu = example.gpus[0]
    raw = example.model_copy(update={
        "node_id": "hostile-01", "device_holders": (),
        "gpus": (gpu.model_copy(update={"processes": (gpu.processes[0].model_copy(update={"command": command}),)}),),
    })
    conn = await nats.connect(nats_settings.url)
    js = conn.jetstream()
    try:
        await apps.start(detector(nats_settings, POLICY))
        sub = await conn.subscribe(ActionRequested.subject_filter())
        for _ in range(60):
            sample = raw.model_copy(update={"event_id": uuid.uuid4(), "occurred_at": datetime.now(UTC)})
            await js.publish(sample.subject, sample.to_json())
            await asyncio.sleep(0.2)
            if sub.pending_msgs:
                break
        request = ActionRequested.from_json((await sub.next_msg(timeout=5)).data)
        assert request.operation.targets[0].command.startswith("python -m selfplay --password=*** --api-key ***")
        kept = await js.get_last_msg(SAMPLES.name, SAMPLES.stored_subject(NodeSampled, raw.node_id))  # kept as sent (in memory)
        assert secret["password"].encode() in kept.data
    finally:
        await apps.stop_all()
        await conn.close()
    files = _files("NATS stream file", nats_server.data_dir, "**/*")
    assert any(f"/{INCIDENTS.name}/" in p for p in files) and any(f"/KV_{INCIDENT_STATE.bucket}/" in p for p in files)
    leaks = [f"{what} in {where}" for where, text in files.items() if f"/{SAMPLES.name}/" not in where and f"/{NODE_EVENTS.name}/" not in where
             for what, value in secret.items() if value in text]
    assert not leaks, leaks
