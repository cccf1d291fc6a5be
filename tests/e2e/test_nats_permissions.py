"""compose's NATS users (deploy/nats.conf) give each service exactly what it needs: the thin
path runs with every service on its own user, and a service cannot publish or consume what is
not its own (a node-sampler cannot request an action, the remediator cannot read samples)."""

from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
from pathlib import Path

import nats
import pytest

from gpumedic.natsd import NatsServer
from gpumedic.proto import CONSUMERS, PRODUCERS
from gpumedic.sim.fleet import SimFleet
from gpumedic_bus import NatsSettings
from gpumedic_events import ActionRequested, Event
from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import Apps
from tests.e2e.test_thin_path import detector_settings, remediator_settings, wait_for_incident
from zombie_detector.main import create_app as detector_app

CONF = Path(__file__).resolve().parents[2] / "deploy" / "nats.conf"
USERS = ("node-sampler", "zombie-detector", "leader-health", "autoscaler", "remediator", "report-builder")


@pytest.fixture
def secured(tmp_path, monkeypatch):
    passwords = {u: secrets.token_urlsafe(12) for u in USERS}
    for user, password in passwords.items():
        monkeypatch.setenv(user.upper().replace("-", "_") + "_NATS_PASSWORD", password)
    accounts = CONF.read_text()[CONF.read_text().index("accounts {"):]
    server = NatsServer(tmp_path / "nats", extra_config=accounts)
    server.start()
    yield server.url, passwords
    server.stop()


def _matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    s, p = subject.split("."), pattern.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(s) == len(p)


def _allowed(block: str, kind: str) -> list[str]:
    listed = re.search(kind + r": \{allow: \[(.*?)\]", block).group(1)
    return [p.strip().strip('"') for p in listed.split(",")]


def _sample_subject(event, user: str) -> str:
    """A concrete subject `user` would publish or read for `event`."""
    if event.subject_key is None:
        return event.subject_prefix
    return event.subject_for(user if event.subject_key == "service" else "some-node")


def test_the_users_allow_what_the_contract_says_each_service_does_and_no_more():
    text = CONF.read_text()
    for user in USERS:
        block = text[text.index(f"user: {user},"):].split("}}", 1)[0]
        publish, subscribe = _allowed(block, "publish"), _allowed(block, "subscribe")
        for event, producers in PRODUCERS.items():
            allowed = any(_matches(_sample_subject(event, user), p) for p in publish)
            assert allowed == (user in producers), (user, event.__name__, "publish")
        for event in {e for events in CONSUMERS.values() for e in events}:
            allowed = any(_matches(_sample_subject(event, user), p) for p in subscribe)
            assert allowed == (event in CONSUMERS.get(user, ())), (user, event.__name__, "subscribe")


async def test_thin_path_runs_with_every_service_on_its_own_user(secured, tmp_path):
    url, passwords = secured

    def nats_for(user: str) -> NatsSettings:
        return NatsSettings(url=url, user=user, password=passwords[user], ack_wait_s=2.0, max_deliver=3, graceful_timeout_s=2.0)

    store_url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    from gpumedic_store.migrate import upgrade

    upgrade(store_url)
    fleet = SimFleet(1, 1, tmp_path / "fleet")
    await fleet.start()
    apps = Apps()
    sampler_nc = await nats.connect(url, user="node-sampler", password=passwords["node-sampler"])
    sampler_js = sampler_nc.jetstream()

    async def publish(event: Event) -> None:
        await sampler_js.publish(event.subject, event.to_json())

    sampling = None
    try:
        await apps.start(reports_app(ReportSettings(nats=nats_for("report-builder"), store={"url": store_url}, trace_to_bus=True)))
        await apps.start(remediator_app(remediator_settings(nats_for("remediator"), store_url, fleet)))
        await apps.start(detector_app(detector_settings(nats_for("zombie-detector"))))
        sampling = asyncio.create_task(fleet.run_samplers(publish, 0.2))
        hung = fleet.node("sim-node-01").inject_zombie(0)
        incident, timeline, _ = await wait_for_incident(store_url, "resolved")
        assert incident.resolution == "fixed" and len(timeline) == 4
        assert fleet.node("sim-node-01").ssh_commands.count(f"kill -s KILL {hung.pid}") == 1
    finally:
        if sampling is not None:
            sampling.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampling
        await apps.stop_all()
        await sampler_nc.close()
        await fleet.stop()


async def test_a_service_cannot_act_outside_its_permissions(secured):
    url, passwords = secured
    errors: list[str] = []

    async def on_error(exc: Exception) -> None:
        errors.append(str(exc))

    sampler = await nats.connect(url, user="node-sampler", password=passwords["node-sampler"], error_cb=on_error)
    example = ActionRequested.model_validate(ActionRequested.model_config["json_schema_extra"]["examples"][0])
    await sampler.publish(example.subject, example.to_json())
    await sampler.flush()
    remediator = await nats.connect(url, user="remediator", password=passwords["remediator"], error_cb=on_error)
    await remediator.subscribe("gpumedic.v1.node.sampled.*")
    await remediator.flush()
    for _ in range(50):
        if len(errors) >= 2:
            break
        await asyncio.sleep(0.05)
    await sampler.close()
    await remediator.close()
    assert any("publish" in e.lower() and "gpumedic.v1.action.requested" in e for e in errors), errors
    assert any("subscription" in e.lower() and "gpumedic.v1.node.sampled" in e for e in errors), errors
    with pytest.raises(Exception, match="(?i)authorization"):
        await nats.connect(url, user="remediator", password="wrong", max_reconnect_attempts=0, allow_reconnect=False)
