"""The forged dead letter: report-builder's login may publish its own dead letters, and wrote two
whose `original_subject` named the incident-state bucket (with a zombie-detector state as payload)
and the action-request subject (with a matching request). `gpumedic dead-letters replay`, run by
an operator as the NATS admin, published both with the admin's rights: the state landed, the
request passed the gate and tripped the breaker. A replay now delivers only the stream's own copy
of a message a consumer of the record's writer refused: neither forgery publishes anything.
On a real nats-server with the users and TLS `gpumedic init` writes."""

from __future__ import annotations

import asyncio
import uuid
from datetime import UTC, datetime

import pytest
from nats.js.errors import KeyNotFoundError

from gpumedic.cli import main
from gpumedic_bus.consume import rejection
from gpumedic_bus.streams import ACTIONS, DEAD_LETTERS, INCIDENT_STATE
from gpumedic_bus.topology import ADMIN
from gpumedic_events import ActionRequested, KillGpuProcesses, MessageRejected, ProcessTarget
from gpumedic_incidents import fingerprint
from gpumedic_store.migrate import upgrade
from tests.fixtures.nats import as_user
from tests.remediator.conftest import incident_waiting_for

NODE = "sim-node-03"


def _request() -> ActionRequested:
    return ActionRequested(
        source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=NODE, attempt=1,
        operation=KillGpuProcesses(gpu_index=1, targets=(ProcessTarget(pid=4242, start_ticks=1, command="python train.py"),),
                                   signal="TERM", grace_s=10, max_gpu_utilization_pct=4),
        reason="zombie job on GPU 1", fingerprint=fingerprint(NODE, "zombie_job", 1),
    )


async def _forge(nc, subject: str, body: bytes, **where) -> int:
    """A dead letter as report-builder's login may publish it, claiming whatever it likes."""
    record = rejection("report-builder", subject, body, "handler failed 5 times", 5, **where)
    ack = await nc.jetstream(timeout=5).publish(MessageRejected.subject_for("report-builder"), record.to_json(), stream=DEAD_LETTERS.name)
    return ack.seq


@pytest.fixture
def as_operator(secured, tmp_path, monkeypatch):
    """The CLI as an operator runs it against a deployment: the admin's login, a migrated store."""
    admin = secured(ADMIN)
    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    for name, value in {"GPUMEDIC_NATS_URL": admin.url, "GPUMEDIC_NATS_USER": ADMIN, "GPUMEDIC_STORE_URL": url,
                        "GPUMEDIC_NATS_PASSWORD": admin.password.get_secret_value(), "GPUMEDIC_NATS_TLS_CA_FILE": str(admin.tls_ca_file)}.items():
        monkeypatch.setenv(name, value)


async def test_forged_dead_letters_replay_nothing(secured, as_operator, capsys):
    request = _request()
    state = incident_waiting_for(request).model_dump_json().encode()
    key_subject = f"$KV.{INCIDENT_STATE.bucket}.{NODE}.zombie_job.1"
    nc, _ = await as_user(secured, "report-builder")
    admin, _ = await as_user(secured, ADMIN)
    try:
        control = admin.jetstream(timeout=5)
        real = await control.publish(_request().subject, _request().to_json(), stream=ACTIONS.name)  # a request that was really sent
        forged = [
            # the attack as it was: the state key and the request, naming no stored original
            await _forge(nc, key_subject, state),
            await _forge(nc, request.subject, request.to_json()),
            # the same, naming a place in a stream as if the original were kept there
            await _forge(nc, key_subject, state, stored=(f"KV_{INCIDENT_STATE.bucket}", 1)),
            await _forge(nc, request.subject, request.to_json(), stored=(ACTIONS.name, real.seq)),
        ]
        actions_before = (await control.stream_info(ACTIONS.name)).state.messages

        assert await asyncio.to_thread(main, ["dead-letters", "replay", *map(str, forged)]) == 1
        out = capsys.readouterr().out.splitlines()
        assert len(out) == 4 and all(": not replayed: " in line for line in out), out
        assert "no consumer of report-builder reads $KV." in out[0] and "no consumer of report-builder reads $KV." in out[2]
        assert "does not say where the stream keeps the original" in out[1]
        assert f"{ACTIONS.name} #{real.seq} is not the message the record describes" in out[3]

        assert (await control.stream_info(ACTIONS.name)).state.messages == actions_before  # no request went out
        with pytest.raises(KeyNotFoundError):  # no state landed
            await (await control.key_value(INCIDENT_STATE.bucket)).get(f"{NODE}.zombie_job.1")
    finally:
        await nc.close()
        await admin.close()


async def test_a_record_in_another_services_name_is_not_replayed(secured, as_operator, capsys):
    """The server lets each service publish its own dead letters only: the subject, not the
    record's `service`, says who wrote it."""
    nc, _ = await as_user(secured, "report-builder")
    admin, _ = await as_user(secured, ADMIN)
    try:
        request = _request()
        stored = await admin.jetstream(timeout=5).publish(request.subject, request.to_json(), stream=ACTIONS.name)
        record = rejection("remediator", request.subject, request.to_json(), "store down", 5, stored=(ACTIONS.name, stored.seq))
        seq = (await nc.jetstream(timeout=5).publish(MessageRejected.subject_for("report-builder"), record.to_json(),
                                                     stream=DEAD_LETTERS.name)).seq
        assert await asyncio.to_thread(main, ["dead-letters", "replay", str(seq)]) == 1
        assert f"dead letter {seq}: not a dead-letter record (payload belongs on {MessageRejected.subject_for('remediator')}" \
            in capsys.readouterr().out
    finally:
        await nc.close()
        await admin.close()


async def test_a_real_dead_letter_still_replays_once(secured, as_operator, capsys):
    """What the replay is for: a request the remediator really refused goes again, once; the gate
    then judges it by its age (tests/remediator: a stale request is refused and counts nothing)."""
    admin, _ = await as_user(secured, ADMIN)
    try:
        js = admin.jetstream(timeout=5)
        request = _request().model_copy(update={"occurred_at": datetime.now(UTC)})
        stored = await js.publish(request.subject, request.to_json(), stream=ACTIONS.name)
        remediator, _ = await as_user(secured, "remediator")
        record = rejection("remediator", request.subject, request.to_json(), "store down", 5, stored=(ACTIONS.name, stored.seq))
        seq = (await remediator.jetstream(timeout=5).publish(MessageRejected.subject_for("remediator"), record.to_json(),
                                                             stream=DEAD_LETTERS.name)).seq
        await remediator.close()
        before = (await js.stream_info(ACTIONS.name)).state.messages
        assert await asyncio.to_thread(main, ["dead-letters", "replay", str(seq), "--by", "alice"]) == 0
        assert await asyncio.to_thread(main, ["dead-letters", "replay", str(seq)]) == 1
        out = capsys.readouterr().out
        assert f"dead letter {seq}: replayed to remediator-actions on {request.subject}" in out and "already replayed" in out and "by alice" in out
        assert (await js.stream_info(ACTIONS.name)).state.messages == before + 1
    finally:
        await admin.close()
