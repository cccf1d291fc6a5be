"""The remediator as deployed: `create_app` against a real nats-server, a SQLite store and sshd.

What only a real JetStream shows: one result per request, a redelivered request answered from
the ledger (the kill reaches the node once; the re-published result is identical and the
stream keeps it once, by its Nats-Msg-Id), and the incident's trace continuing into `act`.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

import nats
import pytest
from faststream import FastStream
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gpumedic_bus import ServiceRuntime
from gpumedic_events import ActionCompleted, ActionOutcome, ActionRequested
from gpumedic_telemetry import ACTION_ID, INCIDENT_ID, NODE_ID
from remediator.main import create_app

from tests.fixtures.apps import Apps
from tests.remediator.conftest import kill_request

pytestmark = pytest.mark.sshd

_TRACE_ID = 0x4BF92F3577B34DA6A3CE929D0E0E4736
_PARENT_ID = 0x00F067AA0BA902B7


@dataclass
class _Service:
    app: FastStream
    runtime: ServiceRuntime
    spans: InMemorySpanExporter
    task: asyncio.Task


@pytest.fixture
async def start_service(make_settings, nats_settings):
    started: list[_Service] = []

    async def _start(**changes) -> _Service:
        app = create_app(make_settings(nats=nats_settings, **changes))
        runtime: ServiceRuntime = app.runtime
        spans = InMemorySpanExporter()
        runtime.tracer_provider.add_span_processor(SimpleSpanProcessor(spans))
        task = asyncio.create_task(app.run())
        ready = asyncio.create_task(runtime.ready.wait())
        await asyncio.wait({task, ready}, timeout=20, return_when=asyncio.FIRST_COMPLETED)
        if task.done():
            task.result()  # raises the start-up error
        assert runtime.ready.is_set(), "remediator did not become ready"
        started.append(_Service(app, runtime, spans, task))
        return started[-1]

    yield _start
    apps = Apps()
    for service in started:
        apps.adopt(service.app, service.task)
    await apps.stop_all()


@pytest.fixture
async def results(nats_url):
    """Every ActionCompleted published on the wire (core NATS: also those the stream de-duplicates)."""
    nc = await nats.connect(nats_url)
    queue: asyncio.Queue = asyncio.Queue()
    await nc.subscribe(ActionCompleted.subject_filter(), cb=queue.put)
    await nc.flush()
    yield queue
    await nc.close()


async def _request(js, request: ActionRequested, *, msg_id: str | None = None, traceparent: str | None = None) -> None:
    headers = {"Nats-Msg-Id": msg_id or str(request.action_id)}
    if traceparent:
        headers["traceparent"] = traceparent
    ack = await js.publish(request.subject, request.to_json(), headers=headers)
    assert not ack.duplicate


async def _next(queue: asyncio.Queue, timeout_s: float = 20.0):
    msg = await asyncio.wait_for(queue.get(), timeout_s)
    return msg, ActionCompleted.from_json(msg.data, subject=msg.subject)


async def _finished(spans: InMemorySpanExporter, name: str, timeout_s: float = 5.0):
    """Finished spans named `name`; the span ends just after its result is published."""
    for _ in range(int(timeout_s / 0.05)):
        found = [s for s in spans.get_finished_spans() if s.name == name]
        if found:
            return found
        await asyncio.sleep(0.05)
    return []


async def _stored_results(js) -> list[ActionCompleted]:
    sub = await js.pull_subscribe(ActionCompleted.subject_filter(), stream="GPUMEDIC_ACTIONS")
    try:
        msgs = await sub.fetch(100, timeout=1)
    except nats.errors.TimeoutError:
        msgs = []
    finally:
        await sub.unsubscribe()
    return [ActionCompleted.from_json(m.data, subject=m.subject) for m in msgs]


async def test_kills_once_and_answers_a_redelivery_from_the_ledger(start_service, results, js, sshd, sleeper, open_incident):
    service = await start_service()
    request = kill_request(sleeper.target())
    await open_incident(request)
    await _request(js, request, traceparent=f"00-{_TRACE_ID:032x}-{_PARENT_ID:016x}-01")

    msg, completed = await _next(results)
    assert completed.outcome is ActionOutcome.SUCCEEDED, completed.detail
    assert sleeper.killed()
    assert msg.headers["Nats-Msg-Id"] == str(completed.event_id)
    assert completed.request_sha256 == request.request_sha256
    pid = sleeper.pid
    gpu_query = "nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id=0"
    assert completed.steps == (gpu_query, "nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=0", "fuser /dev/nvidia0", f"cat /proc/{pid}/stat", f"cat /proc/{pid}/cmdline", f"kill -s TERM {pid}", f"cat /proc/{pid}/stat")

    # The incident's trace continues: `act` is the child of the request's span, the result its child.
    [act] = await _finished(service.spans, "act")
    assert act.context.trace_id == _TRACE_ID and act.parent.span_id == _PARENT_ID
    assert act.attributes[INCIDENT_ID] == str(request.incident_id)
    assert act.attributes[NODE_ID] == "gpu-node-01"
    assert act.attributes[ACTION_ID] == str(request.action_id)
    assert msg.headers["traceparent"].split("-")[1:3] == [f"{_TRACE_ID:032x}", f"{act.context.span_id:016x}"]

    # The same request again, past JetStream's de-duplication (as after a long outage).
    await _request(js, request, msg_id=f"{request.action_id}-again")
    again_msg, again = await _next(results)
    assert again_msg.data == msg.data
    assert again == completed
    kills = [c for c in sshd.commands() if c.startswith("kill ") and c.endswith(f" {pid}")]
    assert kills == [f"kill -s TERM {pid}"]
    # Published twice on the wire, kept once by the stream.
    assert await _stored_results(js) == [completed]
    assert service.runtime.metrics.rejected() == 0


async def test_observe_mode_answers_observed_and_leaves_the_process(start_service, results, js, sshd, sleeper, open_incident):
    await start_service(mode="observe")
    request = kill_request(sleeper.target())
    await open_incident(request)
    await _request(js, request)
    _, completed = await _next(results)
    assert completed.outcome is ActionOutcome.OBSERVED
    assert "would run: " in completed.detail
    assert completed.steps == ()
    assert sleeper.alive()
    assert not sshd.commands_about(sleeper.pid)


async def test_a_node_the_inventory_does_not_name_is_blocked_saying_so(start_service, results, js, sshd, sleeper, open_incident):
    await start_service()
    request = kill_request(sleeper.target(), node="gpu-node-99")
    await open_incident(request)
    await _request(js, request)
    _, completed = await _next(results)
    assert completed.outcome is ActionOutcome.BLOCKED
    assert completed.detail.startswith("node gpu-node-99 is not in the remediator's inventory")
    assert completed.steps == ()
    assert sleeper.alive()


async def test_missing_files_stop_the_start_with_a_clear_message(start_service, tmp_path):
    missing = tmp_path / "nowhere" / "inventory.yaml"
    with pytest.raises(Exception, match=f"inventory file {missing} does not exist"):
        await start_service(inventory=missing)


async def test_a_forged_request_is_refused_and_a_real_one_still_runs(start_service, results, js, sshd, sleeper, open_incident):
    """The issue's reproduction: a hand-made request for a random incident naming a real pid."""
    await start_service()
    forged = kill_request(sleeper.target())
    await _request(js, forged)
    _, refused = await _next(results)
    assert refused.outcome is ActionOutcome.BLOCKED
    assert refused.detail.startswith(f"refused: incident {forged.incident_id} is not open")
    assert sleeper.alive() and not sshd.commands_about(sleeper.pid)

    real = kill_request(sleeper.target())
    await open_incident(real)
    await _request(js, real)
    _, done = await _next(results)
    assert done.outcome is ActionOutcome.SUCCEEDED, done.detail
    assert sleeper.killed()


async def test_a_request_that_waited_in_the_stream_too_long_is_refused(start_service, results, js, sshd, sleeper, open_incident):
    """A request stored while no remediator ran is judged by when the server stored it."""
    request = kill_request(sleeper.target())
    await open_incident(request)
    await _request(js, request)
    await asyncio.sleep(1.5)
    await start_service(max_request_age_s=1.0)
    _, refused = await _next(results)
    assert refused.outcome is ActionOutcome.BLOCKED
    assert refused.detail.startswith("refused: the request is ") and "old (limit 1s)" in refused.detail
    assert sleeper.alive()


async def test_the_audit_log_shows_every_decision_and_each_command_run(start_service, results, js, sshd, sleeper, open_incident, store_url, capsys):
    """`gpumedic actions`: the refusal with its rule, and for the kill each command with its exit
    status, a digest of its output (not the output: a command line may carry secrets) and timing."""
    import hashlib

    from gpumedic.cli import main

    await start_service()
    forged = kill_request(sleeper.target())
    await _request(js, forged)
    await _next(results)
    real = kill_request(sleeper.target())
    await open_incident(real)
    await _request(js, real)
    _, done = await _next(results)
    assert done.outcome is ActionOutcome.SUCCEEDED, done.detail

    assert await asyncio.to_thread(main, ["actions", "--store", store_url, "--node", "gpu-node-01"]) == 0
    listing = capsys.readouterr().out
    assert f"{str(forged.action_id)[:8]}" in listing and "blocked" in listing and "is not open" in listing
    assert f"kill pid {sleeper.pid} on GPU 0 (SIGTERM, SIGKILL after 10s)" in listing and "succeeded" in listing

    assert await asyncio.to_thread(main, ["actions", str(real.action_id)[:8], "--store", store_url]) == 0
    shown = capsys.readouterr().out
    pid = sleeper.pid
    rows = {line.split(None, 5)[-1]: line for line in shown.splitlines() if line.strip().endswith((f"/{pid}/stat", f"/{pid}/cmdline", f"TERM {pid}"))}
    assert rows[f"kill -s TERM {pid}"].split()[2] == rows[f"cat /proc/{pid}/cmdline"].split()[2] == "0"  # exit status
    assert sleeper.command not in shown  # the command line the node answered is kept as a digest only
    # the node answered the command line NUL-separated on stdout, nothing on stderr: the digest covers both
    answered = b"sleep\0" + b"300\0" + b"\0"
    assert rows[f"cat /proc/{pid}/cmdline"].split()[3:5] == [hashlib.sha256(answered).hexdigest()[:16], "10/0"], shown
    assert await asyncio.to_thread(main, ["actions", "ffffffff", "--store", store_url]) == 1
