"""Least privilege on the bus, on a real nats-server with the users and TLS that `gpumedic init`
generates (deploy/nats.conf includes them). Each user may do what the contract says its service
does and nothing else; in particular node-sampler, whose password sits on every GPU node, can
publish its own node's facts and cannot manage streams or consumers, read actions, ack other
services' messages, or touch the incident state. The thin path still runs with every service on
its own user."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import os
import subprocess
from pathlib import Path

import nats
import pytest
from nats.js.api import StreamConfig, SubjectTransform
from pydantic import SecretStr

from gpumedic.deployment import IMAGE_UID, init_deployment
from gpumedic.natsd import nats_server_binary
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_bus import connect
from gpumedic_bus.shares import Shares
from gpumedic_bus.streams import ACTIONS, INCIDENT_STATE, PARTITIONS, SAMPLES, stream_of
from gpumedic_bus.topology import (
    ADMIN,
    CONSUMING_SERVICES,
    LAUNCHER,
    LIVE,
    PACED_READS,
    OBSERVER,
    PRODUCERS,
    REPLAYS,
    REQUESTS,
    SERVICES,
    consumers,
    node_user,
    permissions_for,
)
from gpumedic.preflight import ask
from gpumedic_events import PREFLIGHT_SUBJECT, ROLLOUT_SUBJECT, PreflightRequest, SilenceAdded
from gpumedic_events import ActionRequested, Event, NodeSampled
from gpumedic_events.base import json_examples
from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.conftest import Apps, samplers_running
from tests.fixtures.nats import SECURED_NODE, as_user
from tests.e2e.test_thin_path import detector, remediator_settings, wait_for_incident

ROOT = Path(__file__).resolve().parents[2]
NODE = SECURED_NODE


def test_the_shipped_config_is_valid_with_what_init_generates(tmp_path):
    """deploy/nats.conf as compose mounts it: its include and TLS paths resolve to init's files."""
    root = tmp_path / "cp"
    (root / "deploy").mkdir(parents=True)
    (root / "deploy" / "env.example").write_text((ROOT / "deploy" / "env.example").read_text())
    init_deployment(root, nodes=[NODE])
    conf = (ROOT / "deploy" / "nats.conf").read_text()
    secrets = root / "deploy" / "secrets"
    # compose mounts deploy/secrets at /etc/nats/secrets, beside the config
    checked = root / "deploy" / "nats.conf"
    checked.write_text(conf.replace("/etc/nats/secrets", str(secrets)).replace("store_dir: /data", f"store_dir: {tmp_path / 'js'}"))
    result = subprocess.run([nats_server_binary(), "-t", "-c", str(checked)], capture_output=True, text=True, timeout=20)
    assert result.returncode == 0, result.stdout + result.stderr
    # compose hands report-builder the console's token as a secret; a second init keeps it
    token = secrets / "console-token"
    assert len(token.read_text().strip()) >= 16 and token.stat().st_mode & 0o077 == 0
    before = token.read_text()
    init_deployment(root, nodes=[NODE])
    assert token.read_text() == before


def test_init_hands_the_files_containers_read_to_their_user_never_root(tmp_path):
    """compose runs every container as GPUMEDIC_UID: the owner of the secrets, and not root."""
    root = tmp_path / "cp"
    (root / "deploy" / "remediator").mkdir(parents=True)
    (root / "deploy" / "env.example").write_text((ROOT / "deploy" / "env.example").read_text())
    key = root / "deploy" / "remediator" / "id_ed25519"
    key.write_text("a key the operator put there\n")
    key.chmod(0o600)
    init_deployment(root, nodes=[NODE])
    env = dict(line.split("=", 1) for line in (root / ".env").read_text().splitlines() if "=" in line and not line.startswith("#"))
    uid, gid = int(env["GPUMEDIC_UID"]), int(env["GPUMEDIC_GID"])
    assert uid != 0 and gid != 0
    expected = IMAGE_UID if os.geteuid() == 0 else os.getuid()
    assert uid == expected
    for path in (root / "deploy" / "secrets" / "console-token", root / "deploy" / "secrets" / "nats-accounts.conf", key):
        assert (path.stat().st_uid, path.stat().st_mode & 0o077) == (uid, 0), path
    # a second run keeps the user it chose
    init_deployment(root, nodes=[NODE])
    assert (root / ".env").read_text().count("GPUMEDIC_UID=") == 1


def _matches(subject: str, pattern: str) -> bool:
    """NATS subject matching: `*` is one token, a final `>` one or more."""
    s, p = subject.split("."), pattern.split(".")
    for i, token in enumerate(p):
        if token == ">":
            return len(s) > i
        if i >= len(s) or (token != "*" and token != s[i]):
            return False
    return len(s) == len(p)


def _subject(event: type[Event], user: str) -> str:
    if event.subject_key is None:
        return event.subject_prefix
    return event.subject_for(user if event.subject_key == "service" else "some-node")


def test_each_service_may_publish_and_consume_what_the_contract_says_and_no_more():
    consumed = consumers()
    for user in SERVICES[1:]:
        rules = permissions_for(user)
        for event, producers in PRODUCERS.items():
            allowed = any(_matches(_subject(event, user), p) for p in rules.publish)
            assert allowed == (user in producers), (user, event.__name__, "publish")
        # Consumers read through their durables' API calls; the only event-space subscriptions are the
        # requests a service answers, what it reads live (but for what it reads a batch at a time
        # from the stream, by direct gets), and the wake-ups of what it replays (read from the stream itself).
        answers = {r.subject for r in REQUESTS if r.service == user}
        live = {e.subject_filter() for e in LIVE.get(user, ()) if e not in PACED_READS.get(user, ())}
        replays = {e.subject_filter() for e in REPLAYS.get(user, ())}
        assert {p for p in rules.subscribe if p.startswith("gpumedic.")} == answers | live | replays, user
        assert rules.responds == bool(answers), user
        direct = {p.removeprefix("$JS.API.DIRECT.GET.") for p in rules.publish if p.startswith("$JS.API.DIRECT.GET.")}
        assert direct == {stream_of(e).name for e in PACED_READS.get(user, ())}, user
        # and it asks what it is an asker of (report-builder: a rollout, for the console's fleet operations)
        asked = {r.subject for r in REQUESTS}
        assert {p for p in rules.publish if p in asked} == {r.subject for r in REQUESTS if user in r.askers}, user
        durables = {p.split(".")[-1] for p in rules.publish if p.startswith("$JS.API.CONSUMER.INFO.GPUMEDIC_")}
        assert bool(durables) == (user in consumed) == (user in CONSUMING_SERVICES), user
        assert not any(".STREAM.CREATE" in p or ".STREAM.UPDATE" in p or ".STREAM.DELETE" in p for p in rules.publish), user
    node = permissions_for(node_user(NODE))
    assert all(p.endswith((f".{NODE}", f".{node_user(NODE)}")) for p in node.publish)  # its facts and its spans, on its own subjects
    assert node.subscribe == (f"_INBOX.{node_user(NODE)}.>",)


ACTION = ActionRequested.model_validate(json_examples(ActionRequested)[0])


async def test_node_sampler_publishes_its_own_facts_and_can_do_nothing_else(secured):
    sampler, refusals = await as_user(secured, node_user(NODE))
    admin = await connect(secured(ADMIN), "test-admin")
    try:
        js = sampler.jetstream()
        sample = NodeSampled.model_validate(json_examples(NodeSampled)[0]).model_copy(update={"node_id": NODE})
        assert (await js.publish(sample.subject, sample.to_json())).stream == SAMPLES.name  # its own node: stored

        forbidden_publishes = {
            "another node's sample": NodeSampled.subject_for("gpu-node-02"),
            "an action request": ACTION.subject,
            "an action result": "gpumedic.v1.action.completed.gpu-node-07",
            "an incident": "gpumedic.v1.incident.opened.gpu-node-07",
            "creating a stream": "$JS.API.STREAM.CREATE.STOLEN",
            "updating the actions stream": f"$JS.API.STREAM.UPDATE.{ACTIONS.name}",
            "deleting the actions stream": f"$JS.API.STREAM.DELETE.{ACTIONS.name}",
            "creating a consumer on actions": f"$JS.API.CONSUMER.CREATE.{ACTIONS.name}.spy.{ACTION.subject}",
            "creating a durable on actions": f"$JS.API.CONSUMER.DURABLE.CREATE.{ACTIONS.name}.spy",
            "deleting the remediator's durable": f"$JS.API.CONSUMER.DELETE.{ACTIONS.name}.remediator-actions",
            "reading the remediator's actions": f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS.name}.remediator-actions",
            "acking the remediator's messages": f"$JS.ACK.{ACTIONS.name}.remediator-actions.1.1.1.1700000000000000000.0",
            "writing the incident state": f"$KV.{INCIDENT_STATE.bucket}.gpu-node-07.zombie_job.0",
            "reading the incident state": f"$JS.API.STREAM.MSG.GET.KV_{INCIDENT_STATE.bucket}",
            "reading it from a replica": f"$JS.API.DIRECT.GET.KV_{INCIDENT_STATE.bucket}.$KV.{INCIDENT_STATE.bucket}.x",
            "listing its keys": f"$JS.API.STREAM.INFO.KV_{INCIDENT_STATE.bucket}",
        }
        for what, subject in forbidden_publishes.items():
            await sampler.publish(subject, b"{}", reply=f"_INBOX.{node_user(NODE)}.x")
            await sampler.flush()
            assert await refusals.refused(f'publish to "{subject}"'), what
        for what, subject in {
            "action requests": ActionRequested.subject_filter(),
            "every inbox": "_INBOX.>",
            "the remediator's replies": "_INBOX.remediator.>",
            "the detector's samples delivery": "_GPUMEDIC.deliver.zombie-detector-samples",
        }.items():
            await sampler.subscribe(subject)
            await sampler.flush()
            assert await refusals.refused(f'subscription to "{subject}"'), what

        # And nothing changed: the actions stream has no transform, the remediator's durable is there.
        ajs = admin.jetstream()
        assert (await ajs.stream_info(ACTIONS.name)).config.subject_transform is None
        assert (await ajs.consumer_info(ACTIONS.name, "remediator-actions")).name == "remediator-actions"
        assert "STOLEN" not in [s.config.name for s in await ajs.streams_info()]
    finally:
        await sampler.close()
        await admin.close()


@pytest.mark.parametrize("service", SERVICES[1:])
async def test_no_service_may_manage_streams_or_consumers_or_read_anothers(secured, service):
    nc, refusals = await as_user(secured, service)
    try:
        other = "remediator-actions" if service != "remediator" else "zombie-detector-actions"
        for subject in (
            f"$JS.API.STREAM.CREATE.{service.upper().replace('-', '_')}",
            f"$JS.API.STREAM.UPDATE.{ACTIONS.name}",
            f"$JS.API.STREAM.PURGE.{ACTIONS.name}",
            f"$JS.API.CONSUMER.CREATE.{ACTIONS.name}",
            f"$JS.API.CONSUMER.DELETE.{ACTIONS.name}.{other}",
            f"$JS.API.CONSUMER.MSG.NEXT.{ACTIONS.name}.{other}",
            f"$JS.ACK.{ACTIONS.name}.{other}.1.1.1.1700000000000000000.0",
        ):
            await nc.publish(subject, b"{}")
            await nc.flush()
            assert await refusals.refused(f'publish to "{subject}"'), subject
    finally:
        await nc.close()


async def test_the_remediator_reads_the_incident_state_and_cannot_write_it(secured):
    nc, refusals = await as_user(secured, "remediator")
    try:
        kv = await nc.jetstream().key_value(INCIDENT_STATE.bucket)
        with contextlib.suppress(Exception):
            await kv.get("gpu-node-07.zombie_job.0")  # allowed (absent is fine)
        assert not refusals.errors
        with contextlib.suppress(Exception):
            await kv.put("gpu-node-07.zombie_job.0", b"{}")
        assert await refusals.refused(f'publish to "$kv.{INCIDENT_STATE.bucket.lower()}.gpu-node-07.zombie_job.0"')
    finally:
        await nc.close()


async def test_the_remediator_holds_its_share_of_the_ssh_round_on_its_own_user(secured):
    nc, refusals = await as_user(secured, "remediator")
    shares = Shares("remediator.ssh-health", "instance-1")
    running = asyncio.create_task(shares.run(nc))
    try:
        await asyncio.wait_for(shares.settled.wait(), 10)
        assert len(shares.held) == PARTITIONS and not refusals.errors  # alone, it holds them all
    finally:
        running.cancel()
        await asyncio.gather(running, return_exceptions=True)
        await nc.close()


async def test_the_subject_transform_attack_of_the_issue_is_refused(secured):
    """Logged in as node-sampler, re-route node subjects into action requests on the actions stream."""
    sampler, refusals = await as_user(secured, node_user(NODE))
    try:
        config = StreamConfig(
            name=ACTIONS.name,
            subjects=[*ACTIONS.subjects, "gpumedic.v1.node.evil.*"],
            subject_transform=SubjectTransform(src="gpumedic.v1.node.evil.*", dest="gpumedic.v1.action.requested.{{wildcard(1)}}"),
        )
        with pytest.raises(nats.errors.TimeoutError):  # the server never answers a refused request
            await sampler.jetstream(timeout=1).update_stream(config)
        assert await refusals.refused(f'publish to "$js.api.stream.update.{ACTIONS.name.lower()}"')
    finally:
        await sampler.close()


async def test_a_launcher_may_ask_for_preflight_and_nothing_else(secured):
    launcher, refusals = await as_user(secured, LAUNCHER)
    try:
        silence = SilenceAdded.model_validate(json_examples(SilenceAdded)[0])
        # a fleet operation is a person's (the operator's tools, the console behind its token)
        for subject in (ACTION.subject, silence.subject, f"$JS.API.STREAM.INFO.{ACTIONS.name}", "_INBOX.remediator.x", ROLLOUT_SUBJECT):
            await launcher.publish(subject, b"{}")
            await launcher.flush()
            assert await refusals.refused(f'publish to "{subject}"'), subject
        for subject in ("gpumedic.v1.>", PREFLIGHT_SUBJECT, "_INBOX.operator.>"):
            await launcher.subscribe(subject)
            await launcher.flush()
            assert await refusals.refused(f'subscription to "{subject}"'), subject
        refusals.errors.clear()
        # Asking is allowed: with no remediator up, the server says nobody answers (not "refused").
        with pytest.raises(nats.errors.NoRespondersError):
            await launcher.request(PREFLIGHT_SUBJECT, b"{}", timeout=2)
        assert not refusals.errors
    finally:
        await launcher.close()


async def test_an_outsider_cannot_log_in(secured):
    good = secured("observer")
    with pytest.raises(Exception, match="(?i)authorization"):
        await connect(
            good.model_copy(update={"password": SecretStr("not-the-password")}), "outsider", allow_reconnect=False, max_reconnect_attempts=0
        )
    with pytest.raises(ssl.SSLCertVerificationError):  # TLS is required, and only gpumedic's CA vouches for it
        await nats.connect(good.url.replace("tls://", "nats://"), user="observer", password=good.password.get_secret_value(),
                           allow_reconnect=False, max_reconnect_attempts=0, connect_timeout=2)


async def test_thin_path_runs_with_every_service_on_its_own_user(secured, tmp_path):
    timings = {"ack_wait_s": 2.0, "max_deliver": 3, "graceful_timeout_s": 2.0}
    store_url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    from gpumedic_store.migrate import upgrade

    upgrade(store_url)
    fleet = SimFleet(1, 1, tmp_path / "fleet")
    await fleet.start()
    apps = Apps()
    sampler_nc = await connect(secured(node_user(NODE)), "test-node")
    sampler_js = sampler_nc.jetstream()

    async def publish(event: Event) -> None:
        await sampler_js.publish(event.subject, event.to_json())

    try:
        await apps.start(reports_app(ReportSettings(nats=secured("report-builder", **timings), store={"url": store_url}, trace_to_bus=True)))
        await apps.start(remediator_app(remediator_settings(secured("remediator", **timings), store_url, fleet)))
        await apps.start(detector(secured("zombie-detector", **timings)))
        async with samplers_running(fleet, publish):
            hung = fleet.node(NODE).inject_zombie(0)
            incident, timeline, _ = await wait_for_incident(store_url, "resolved")
        assert incident.resolution == "fixed" and len(timeline) == 4
        assert fleet.node(NODE).ssh_commands.count(f"kill -s TERM {hung.pid}") == 1

        # A job launcher, on its own user, asks for a pre-flight and the remediator answers it.
        report = await ask(secured(LAUNCHER), PreflightRequest(node_id=NODE), timeout_s=20)
        assert report.ready and [g.index for g in report.gpus] == [0], report.summary()
    finally:
        await apps.stop_all()
        await sampler_nc.close()
        await fleet.stop()


async def test_a_service_with_a_wrong_password_stops_at_once_with_one_line_saying_so(secured):
    from gpumedic_bus.service import CannotStart, wait_for_nats

    wrong = secured("zombie-detector").model_copy(update={"password": SecretStr("not-the-password-1234"), "start_wait_s": 30.0})
    started = asyncio.get_running_loop().time()
    with pytest.raises(CannotStart) as refused:
        await wait_for_nats(wrong, "zombie-detector")
    assert asyncio.get_running_loop().time() - started < 10, "a refused login is not retried for start_wait_s"
    text = str(refused.value)
    assert "refused the login of user 'zombie-detector'" in text and "authorization violation" in text.lower()
    assert "not-the-password-1234" not in text
    await wait_for_nats(secured("zombie-detector"), "zombie-detector")  # the right one connects and returns


async def test_the_observer_keeps_its_own_stream_and_durable_of_every_event_and_reaches_nothing_of_the_control_plane(secured):
    """Your own consumer's account: incidents published by the detector flow into a stream it made
    in its own JetStream, a durable of its own reads them; the control plane's streams do not exist
    for it, and it may not publish an event."""
    from gpumedic_bus.streams import INCIDENTS
    from gpumedic_events import IncidentOpened

    observer, refusals = await as_user(secured, OBSERVER)
    detector_nc = await connect(secured("zombie-detector"), "test-detector")
    admin = await connect(secured(ADMIN), "test-admin")
    try:
        js = observer.jetstream()
        # Named as the control plane's stream: gpumedic publishes with Nats-Expected-Stream.
        await js.add_stream(name=INCIDENTS.name, subjects=["gpumedic.v1.incident.>"], max_age=3600)
        sub = await js.pull_subscribe("gpumedic.v1.incident.opened.*", durable="my-pager", stream=INCIDENTS.name)
        opened = IncidentOpened.model_validate(json_examples(IncidentOpened)[0])
        # As gpumedic publishes: the expected stream named, so only a stream of that name stores it.
        ack = await detector_nc.jetstream().publish(opened.subject, opened.to_json(), stream=INCIDENTS.name)
        assert ack.stream == INCIDENTS.name
        [msg] = await sub.fetch(1, timeout=5)
        assert IncidentOpened.from_json(msg.data, subject=msg.subject).incident_id == opened.incident_id
        await msg.ack()
        with pytest.raises(Exception):  # neither in its account nor in its rights: nothing of the control plane to touch
            await observer.jetstream(timeout=1).stream_info(ACTIONS.name)
        assert await refusals.refused(f'publish to "$js.api.stream.info.{ACTIONS.name.lower()}"')
        control = admin.jetstream()
        actions_before = (await control.stream_info(ACTIONS.name)).state.messages
        await observer.publish(ACTION.subject, ACTION.to_json())
        assert await refusals.refused("permissions violation for publish")
        # The control plane is unchanged: no observer consumer on its stream, the forged request never stored.
        assert "my-pager" not in {c.name for c in await control.consumers_info(INCIDENTS.name)}
        assert (await control.stream_info(ACTIONS.name)).state.messages == actions_before
    finally:
        await observer.close()
        await detector_nc.close()
        await admin.close()


async def test_the_observer_keeps_no_stream_but_the_incidents(secured):
    """An outside consumer may keep the incidents (OBSERVER_STREAMS) and nothing else: a stream with
    the control plane's configuration of the samples, the actions or anything else is refused by the
    server, and the account's limits allow no more streams than that."""
    from gpumedic.credentials import OBSERVERS_LIMITS
    from gpumedic_bus.streams import STREAMS
    from gpumedic_bus.topology import OBSERVER_STREAMS

    observer, refusals = await as_user(secured, OBSERVER)
    try:
        js = observer.jetstream(timeout=1)
        for stream in [s for s in STREAMS if s.name not in OBSERVER_STREAMS]:
            with pytest.raises(Exception):
                await js.add_stream(name=stream.name, subjects=list(stream.subjects))
            assert await refusals.refused(f'publish to "$js.api.stream.create.{stream.name.lower()}"'), stream.name
        with pytest.raises(Exception):
            await js.add_stream(name="MY_COPY", subjects=["gpumedic.v1.>"])
        assert await refusals.refused('publish to "$js.api.stream.create.my_copy"')
        assert f"max_streams: {len(OBSERVER_STREAMS)}" in OBSERVERS_LIMITS
    finally:
        await observer.close()
