"""drain_node and undrain_node through the whole handler: the gate, a real SQLite store, the
scheduler's hook on a real HTTP receiver on loopback, and the policy's check command over real
SSH (Debian's sshd on this machine, where /bin/true and /bin/false are what they say)."""

from __future__ import annotations

import re
import subprocess
import sys
import time
import uuid
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from sqlalchemy import select

from gpumedic_bus import Delivery, publish_event
from gpumedic_bus.topology import owner_of
from gpumedic_events import ActionCompleted, ActionOutcome, ActionRequested, DrainNode, HttpAdmin, IncidentKind, NodeDrained, UndrainNode
from gpumedic_incidents import IncidentStates, PolicyError, load_policy
from gpumedic_incidents.policy import Actions, AdminEndpoint, AdminPolicy, CheckpointPolicy, DrainPolicy, Kinds, Policy, UndrainPolicy, dump_policy
from gpumedic_incidents.state import fingerprint
from gpumedic_sim import SimFleet
from gpumedic_sim.runs.pager import Pager
from gpumedic_store import NodeDrain, create_engine, session_factory
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator import repository
from remediator.handlers import ActionHandler
from remediator.main import executor_of, gate_of
from remediator.scheduler import StoreScheduler
from remediator.settings import Settings, SettingsError
from tests.remediator.conftest import incident_waiting_for

pytestmark = pytest.mark.sshd

TOKEN = "s3cret-hook-token"


class _Broker:
    def __init__(self) -> None:
        self.published: list[tuple[str, bytes, dict]] = []

    async def publish(self, data, subject, *, headers=None, stream=None, timeout=None):
        self.published.append((subject, data, dict(headers or {})))

    def subjects(self) -> list[str]:
        return [s for s, _, _ in self.published]


class _Remediator:
    """The action handler with its scheduler side, as `register` wires them."""

    def __init__(self, settings: Settings, incidents: IncidentStates) -> None:
        self.incidents = incidents
        self.broker = _Broker()
        self.engine = create_engine(settings.store.url)
        self.sessions = session_factory(self.engine)

        async def publish(event, msg_id):
            await publish_event(self.broker, event, msg_id=msg_id)

        scheduler = StoreScheduler(
            sessions=self.sessions,
            publish=publish,
            hook_url=settings.policy.load().actions.drain_node.hook_url,
            hook_token=settings.hook_token,
        )
        self.handler = ActionHandler(
            settings=settings, gate=gate_of(settings, settings.policy.load()),
            runtime=SimpleNamespace(broker=self.broker, metrics=ServiceMetrics("remediator")),
            sessions=self.sessions,
            executor=executor_of(settings),
            tracer=TracerProvider().get_tracer("test"),
            incidents=incidents,
            scheduler=scheduler,
        )

    async def ask(
        self, operation, incident_id: uuid.UUID, node: str = "gpu-node-01", kind: IncidentKind = IncidentKind.GPU_XID
    ) -> ActionCompleted:
        gpu = 0 if kind is IncidentKind.GPU_XID else None
        request = ActionRequested(
            source=owner_of(kind),
            action_id=uuid.uuid4(),
            incident_id=incident_id,
            node_id=node,
            attempt=1,
            operation=operation,
            reason=f"{kind.value} on {node}",
            fingerprint=fingerprint(node, kind, gpu, str(incident_id)[:8]),
        )
        await self.incidents.save(incident_waiting_for(request))
        await self.handler.handle(request, Delivery(request.subject, {}, 1))
        subject, data, _ = self.broker.published[-1]
        return ActionCompleted.from_json(data, subject=subject)

    async def held(self) -> list[tuple[str, str]]:
        async with self.sessions() as session:
            return [(r.node_id, r.incident_id) for r in (await session.scalars(select(NodeDrain))).all()]


@pytest.fixture
def hook():
    pager = Pager().start()
    yield pager
    pager.stop()


@pytest.fixture
def remediator(make_settings, incidents, tmp_path, hook):
    made = []

    def _make(check_command: str | None = None, *, checkpoint: CheckpointPolicy | None = None, fleet: SimFleet | None = None,
              **admin_endpoints: AdminEndpoint) -> _Remediator:
        """`checkpoint`: gpu_xid's checkpoint step; `fleet`: the simulated nodes to act on, instead of this machine's sshd."""
        policy_file = tmp_path / "policy.yaml"
        actions = Actions(
            drain_node=DrainPolicy(hook_url=hook.url),
            undrain_node=UndrainPolicy(check_command=check_command),
            http_admin=AdminPolicy(endpoints=admin_endpoints),
        )
        kinds = Kinds(gpu_xid=Kinds().gpu_xid.model_copy(update={"checkpoint": checkpoint}))
        dump_policy(Policy(actions=actions, kinds=kinds), policy_file)
        (tmp_path / "token").write_text(TOKEN)
        (tmp_path / "admin-token").write_text("node-admin-token\n")
        nodes = {"inventory": fleet.inventory_path, "known_hosts": fleet.known_hosts_path, "client_key": fleet.client_key_path} if fleet else {}
        settings = make_settings(
            policy={"file": policy_file}, hook_token_file=tmp_path / "token", admin_token_file=tmp_path / "admin-token", **nodes
        )
        made.append(_Remediator(settings, incidents))
        return made[-1]

    return _make


async def test_a_drain_holds_the_node_tells_the_hook_and_the_bus_and_an_undrain_gives_it_back(remediator, hook):
    r = remediator()
    incident = uuid.uuid4()
    drained = await r.ask(DrainNode(), incident)
    assert (drained.outcome, drained.detail) == (ActionOutcome.SUCCEEDED, "drained gpu-node-01")
    assert drained.steps == ("hold the node drained (node_drains)", "POST drained=true to the scheduler's hook", "publish NodeDrained")
    assert await r.held() == [("gpu-node-01", str(incident))]
    assert NodeDrained.subject_for("gpu-node-01") in r.broker.subjects()
    (page,) = hook.received
    assert page.body == {
        "node_id": "gpu-node-01", "drained": True, "reason": "gpu_xid on gpu-node-01",
        "incident_id": str(incident), "action_id": page.body["action_id"],
    }
    assert page.headers["Authorization"] == f"Bearer {TOKEN}"

    undrained = await r.ask(UndrainNode(), incident)
    assert (undrained.outcome, undrained.detail) == (ActionOutcome.SUCCEEDED, "undrained gpu-node-01 (DCGM diagnostics skipped: no dcgmi on the node)")
    assert await r.held() == [] and hook.received[-1].body["drained"] is False
    assert r.broker.subjects()[-2:] == ["gpumedic.v1.node.undrained.gpu-node-01", "gpumedic.v1.action.completed.gpu-node-01"]
    record = await _record(r, undrained)
    assert [a["command"] for a in record.audit] == [
        "command -v dcgmi", "POST drained=false to the scheduler's hook", "release the node (node_drains)", "publish NodeUndrained"
    ]
    assert record.audit[0]["exit_status"] != 0 and all(a["exit_status"] == 0 for a in record.audit[1:])  # Debian's sshd: no DCGM


async def test_jobs_are_asked_to_checkpoint_before_their_node_is_drained_and_one_that_ignores_it_only_costs_the_wait(remediator, hook, fleet):
    """Over real SSH to simulated nodes: the jobs that save on SIGUSR1 do, and exit, and only then
    is the node drained; on the other node they ignore it, and the drain goes ahead at the
    deadline. The drain's answer (the incident's timeline) says which, and what the wait cost."""
    r = remediator(checkpoint=CheckpointPolicy(how="signal", wait_s=4, poll_s=0.25), fleet=fleet)
    saving, ignoring = fleet.node("sim-node-01"), fleet.node("sim-node-02")
    saving.checkpoint_s = 1.0
    for node, answer in ((saving, "save"), (ignoring, "ignore")):
        for job in node.live_processes():
            job.on_checkpoint = answer
    jobs = saving.live_processes()
    pids = ", ".join(str(p.pid) for p in sorted(jobs, key=lambda p: p.gpu))

    drained = await r.ask(DrainNode(), uuid.uuid4(), node="sim-node-01")
    assert drained.outcome is ActionOutcome.SUCCEEDED, drained.detail
    assert re.fullmatch(rf"asked pid\(s\) {pids} to checkpoint \(SIGUSR1\): done after [1-3]s; then drained sim-node-01", drained.detail)
    assert all(not p.alive and p.killed_by is None for p in jobs)  # each saved, then exited of itself
    steps = list(drained.steps)
    assert steps[0] == "nvidia-smi --query-compute-apps=pid --format=csv,noheader"
    assert max(i for i, s in enumerate(steps) if s.startswith("kill -s USR1")) < steps.index("hold the node drained (node_drains)")
    assert hook.received[-1].body["node_id"] == "sim-node-01"

    before = ignoring.live_processes()
    late = await r.ask(DrainNode(), uuid.uuid4(), node="sim-node-02")
    waited = ", ".join(str(p.pid) for p in sorted(before, key=lambda p: p.gpu))
    assert (late.outcome, late.detail) == (
        ActionOutcome.SUCCEEDED,
        f"asked pid(s) {waited} to checkpoint (SIGUSR1): pid(s) {waited} not done after 4s, so the action went ahead; then drained sim-node-02",
    )
    assert all(p.alive for p in before) and hook.received[-1].body["node_id"] == "sim-node-02"


JOB = """
import os, pathlib, signal, sys, time
def save(*_):
    pathlib.Path("checkpoint.pt").write_text("saved on SIGUSR1")
    sys.exit(0)
signal.signal(signal.SIGUSR1, save)
pathlib.Path("ready").write_text("")
while True:
    if os.path.exists(".gpumedic-checkpoint"):  # asked with a file: save, remove it, go on
        pathlib.Path("checkpoint.pt").write_text("saved on the file")
        os.remove(".gpumedic-checkpoint")
    time.sleep(0.05)
"""


def _job(workdir) -> subprocess.Popen:
    """A real process that checkpoints as a training job would: on SIGUSR1 (then exits), or when a
    file appears in its working directory (then removes it and goes on)."""
    workdir.mkdir()
    job = subprocess.Popen([sys.executable, "-c", JOB], cwd=workdir)
    for _ in range(200):
        if (workdir / "ready").exists():
            return job
        time.sleep(0.05)
    job.kill()
    raise AssertionError("the job did not start")


async def test_a_real_process_on_this_machine_is_asked_by_signal_and_by_file_before_the_drain(remediator, hook, sshd, tmp_path):
    """Debian's sshd and real processes: `kill -s USR1` reaches the job's handler, which saves and
    exits; `touch -- /proc/PID/cwd/...` creates the file in its real working directory, which it
    saves on and removes; a node with no compute process is drained without asking anyone."""
    nobody = await remediator(checkpoint=CheckpointPolicy(how="signal", wait_s=5, poll_s=0.1)).ask(DrainNode(), uuid.uuid4())
    assert (nobody.outcome, nobody.detail) == (ActionOutcome.SUCCEEDED, "no checkpoint asked: no job runs on the GPUs; then drained gpu-node-01")

    signalled, asked_by_file = _job(tmp_path / "a"), _job(tmp_path / "b")
    try:
        sshd.computing(0, signalled.pid)
        sshd.computing(1, asked_by_file.pid)
        by_signal = remediator(checkpoint=CheckpointPolicy(how="signal", wait_s=5, poll_s=0.1))
        # (each drain here is another incident's: the node already was drained for the one before)
        drained = await by_signal.ask(DrainNode(), uuid.uuid4())
        assert re.fullmatch(rf"asked pid\(s\) {signalled.pid}, {asked_by_file.pid} to checkpoint \(SIGUSR1\): done after [0-4]s; "
                            r"then drained gpu-node-01 \(it already was, .*\)", drained.detail), drained.detail
        assert signalled.wait(5) == 0 and asked_by_file.wait(5) == 0
        assert (tmp_path / "a" / "checkpoint.pt").read_text() == "saved on SIGUSR1"

        filed = _job(tmp_path / "c")
        sshd.computing(0, filed.pid)
        sshd.computing(1)
        by_file = remediator(checkpoint=CheckpointPolicy(how="file", wait_s=5, poll_s=0.1))
        drained = await by_file.ask(DrainNode(), uuid.uuid4())
        assert re.fullmatch(rf"asked pid\(s\) {filed.pid} to checkpoint \(a file \.gpumedic-checkpoint in its working directory\): "
                            r"done after [0-4]s; then drained gpu-node-01 \(it already was, .*\)", drained.detail), drained.detail
        assert (tmp_path / "c" / "checkpoint.pt").read_text() == "saved on the file"
        assert filed.poll() is None and not (tmp_path / "c" / ".gpumedic-checkpoint").exists()  # saved, and runs on
        assert f"touch -- /proc/{filed.pid}/cwd/.gpumedic-checkpoint" in sshd.commands()
    finally:
        sshd.computing(0)
        sshd.computing(1)
        for job in (signalled, asked_by_file, locals().get("filed")):
            if job is not None and job.poll() is None:
                job.kill()
                job.wait()


HOOKED_JOB = """
import http.server, pathlib, sys, threading, time
saved = threading.Event()
def save():
    time.sleep(0.5)
    pathlib.Path("checkpoint.pt").write_text("saved on the hook")
    saved.set()
class Hook(http.server.BaseHTTPRequestHandler):
    def do_POST(self):  # asked: saving starts, answered at once
        threading.Thread(target=save, daemon=True).start()
        self.send_response(202); self.end_headers()
    def do_GET(self):
        self.send_response(200 if saved.is_set() else 202); self.end_headers()
    def log_message(self, *args):
        pass
server = http.server.HTTPServer(("127.0.0.1", 0), Hook)
pathlib.Path("ready").write_text(str(server.server_port))
server.serve_forever()
"""


async def test_a_real_job_is_asked_through_its_http_hook_with_curl_on_the_node_before_the_drain(remediator, hook, sshd, tmp_path):
    """Debian's sshd, curl and a real process serving its hook: one POST asks (202: saving), the
    GETs that follow answer 202 until the checkpoint is written, then 200; the drain comes after."""
    workdir = tmp_path / "hooked"
    workdir.mkdir()
    job = subprocess.Popen([sys.executable, "-c", HOOKED_JOB], cwd=workdir)
    try:
        for _ in range(200):
            if (workdir / "ready").exists() and (workdir / "ready").read_text():
                break
            time.sleep(0.05)
        url = f"http://127.0.0.1:{(workdir / 'ready').read_text()}/checkpoint"
        sshd.computing(0, job.pid)
        drained = await remediator(checkpoint=CheckpointPolicy(how="http", url=url, wait_s=5, poll_s=0.1)).ask(DrainNode(), uuid.uuid4())
        assert drained.outcome is ActionOutcome.SUCCEEDED, drained.detail
        assert re.fullmatch(rf"asked pid\(s\) {job.pid} through {url} to checkpoint: done after [0-4]s; then drained gpu-node-01.*",
                            drained.detail), drained.detail
        assert (workdir / "checkpoint.pt").read_text() == "saved on the hook" and job.poll() is None  # saved, runs on
        commands = sshd.commands()
        asked = commands.index(f"curl -sS -m 10 -X POST -o /dev/null -w '%{{http_code}}' {url}")
        assert f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {url}" in commands[asked + 1:]
    finally:
        sshd.computing(0)
        job.kill()
        job.wait()


async def test_a_node_two_incidents_drained_stays_drained_until_the_last_is_validated(remediator, hook):
    r = remediator()
    first, second = uuid.uuid4(), uuid.uuid4()
    await r.ask(DrainNode(), first)
    again = await r.ask(DrainNode(), second)
    assert again.detail == f"drained gpu-node-01 (it already was, for incident(s) {first})"
    released = await r.ask(UndrainNode(), first)
    assert released.outcome is ActionOutcome.SUCCEEDED
    assert released.detail == f"released this incident's hold; gpu-node-01 stays drained for incident(s) {second}"
    assert await r.held() == [("gpu-node-01", str(second))]
    assert [p.body["drained"] for p in hook.received] == [True, True]  # the scheduler was not told to undrain
    assert "gpumedic.v1.node.undrained.gpu-node-01" not in r.broker.subjects()
    assert (await r.ask(UndrainNode(), second)).detail == "undrained gpu-node-01 (DCGM diagnostics skipped: no dcgmi on the node)"
    assert [p.body["drained"] for p in hook.received] == [True, True, False]


async def test_a_failing_check_command_keeps_the_node_drained_and_a_passing_one_gives_it_back(remediator, hook):
    incident = uuid.uuid4()
    r = remediator(check_command="/bin/false")
    await r.ask(DrainNode(), incident)
    refused = await r.ask(UndrainNode(), incident)
    assert refused.outcome is ActionOutcome.FAILED
    assert refused.detail.startswith("gpu-node-01 stays drained: its check '/bin/false' failed")
    assert refused.steps == ("/bin/false",) and await r.held() == [("gpu-node-01", str(incident))]
    assert [p.body["drained"] for p in hook.received] == [True]
    r = remediator(check_command="/bin/true")
    passed = await r.ask(UndrainNode(), incident)
    assert (passed.outcome, passed.detail) == (ActionOutcome.SUCCEEDED, "undrained gpu-node-01 (its check passed; DCGM diagnostics skipped: no dcgmi on the node)")
    assert passed.steps[0] == "/bin/true" and await r.held() == []


async def test_a_hook_that_keeps_failing_fails_the_drain_naming_only_its_host_and_the_node_counts_as_drained(remediator, hook):
    hook.answers = [503, 503, 503]
    r = remediator()
    incident = uuid.uuid4()
    failed = await r.ask(DrainNode(), incident)
    assert failed.outcome is ActionOutcome.FAILED
    assert failed.detail == "gpu-node-01 is drained in gpumedic, but the scheduler's hook did not take it: 127.0.0.1 answered HTTP 503"
    assert hook.tries == 3 and "s3cr3t-path" not in failed.model_dump_json() and TOKEN not in failed.model_dump_json()
    assert await r.held() == [("gpu-node-01", str(incident))]
    assert NodeDrained.subject_for("gpu-node-01") not in r.broker.subjects()


async def test_undrain_of_a_node_nobody_holds_still_tells_the_scheduler(remediator, hook):
    """An interrupted drain may have told the scheduler without the store knowing: give it back anyway."""
    r = remediator()
    done = await r.ask(UndrainNode(), uuid.uuid4())
    assert done.outcome is ActionOutcome.SUCCEEDED and [p.body["drained"] for p in hook.received] == [False]


async def test_http_admin_through_the_gate_reads_the_token_file_and_keeps_it_out_of_the_ledger(remediator):
    service = Pager().start()
    try:
        url = service.url.replace("/hooks/T000/B000/s3cr3t-path", "/admin/reset-jobs")
        r = remediator(force_election=AdminEndpoint(url=url))
        done = await r.ask(HttpAdmin(endpoint="force_election"), uuid.uuid4(), kind=IncidentKind.NO_LEADER)
        assert (done.outcome, done.detail) == (ActionOutcome.SUCCEEDED, "force_election: the node's service answered HTTP 200")
        assert service.received[0].headers["Authorization"] == "Bearer node-admin-token"
        record = await _record(r, done)
        assert "node-admin-token" not in str(record.steps) + str(record.audit) + record.detail
    finally:
        service.stop()


@pytest.mark.parametrize(
    ("section", "value", "message"),
    [
        ("undrain_node", {"check_command": "/bin/sh -c reboot"}, "must be an absolute path of plain names, without arguments"),
        ("undrain_node", {"check_command": "/usr/bin/../sbin/reboot"}, "must be an absolute path of plain names"),
        ("undrain_node", {"check_command": "gpu-check"}, "must be an absolute path"),
        ("undrain_node", {"check_command": "/opt/check;reboot"}, "must be an absolute path"),
        ("drain_node", {"hook_url": "https://user:pw@scheduler/drain"}, "must be a plain http(s)://host[:port][/path]"),
        ("drain_node", {"hook_url": "https://scheduler/drain?x=$(id)"}, "must be a plain http(s)://host[:port][/path]"),
        ("drain_node", {"hook_url": "file:///etc/passwd"}, "must be a plain http(s)://host[:port][/path]"),
    ],
)
def test_hostile_check_commands_and_hook_urls_are_refused_when_the_policy_loads(tmp_path, section, value, message):
    path = tmp_path / "policy.yaml"
    path.write_text(f"version: 1\nactions:\n  {section}: {_flow(value)}\n")
    with pytest.raises(PolicyError, match=f"policy.yaml:3: actions.{section}.*{_escape(message)}"):
        load_policy(path)


def test_a_missing_or_empty_hook_token_file_stops_the_start(make_settings, tmp_path):
    for content in (None, "  \n"):
        path = tmp_path / "token"
        if content is not None:
            path.write_text(content)
        with pytest.raises(SettingsError, match="GPUMEDIC_REMEDIATOR_HOOK_TOKEN_FILE"):
            make_settings(hook_token_file=path).check_files()


def _flow(value: dict) -> str:
    (key, text), = value.items()
    return "{" + f"{key}: '{text}'" + "}"


def _escape(text: str) -> str:
    import re

    return re.escape(text)


async def _record(r: _Remediator, completed: ActionCompleted):
    async with r.sessions() as session:
        return await repository.get_action(session=session, action_id=completed.action_id)


async def test_a_rollouts_drain_is_the_operators_hold_beside_an_incidents(remediator, hook):
    """An operator's rollout drains and undrains the operators' hold only: a node an incident holds
    stays drained for it, and the incident's validation does not give back the operators' drain."""
    r = remediator()
    incident = uuid.uuid4()
    await r.ask(DrainNode(), incident)

    async def rollout(operation) -> str:
        request = ActionRequested(source="remediator", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id="gpu-node-01",
                                  attempt=1, operation=operation, reason="rollout drain_node by ops, batch 1")

        async def keep_going() -> None: ...

        return (await r.handler.run_gated(request, "", keep_going, rollout=True)).detail

    assert await rollout(DrainNode()) == f"drained gpu-node-01 (it already was, for incident(s) {incident})"
    assert sorted(await r.held()) == sorted([("gpu-node-01", str(incident)), ("gpu-node-01", "rollout")])
    assert await rollout(UndrainNode()) == f"released the operators' hold; gpu-node-01 stays drained for incident(s) {incident}"
    assert await r.held() == [("gpu-node-01", str(incident))]
    assert await rollout(UndrainNode()) == f"no rollout drained gpu-node-01: nothing to give back (it stays drained for incident(s) {incident})"
    await rollout(DrainNode())
    released = await r.ask(UndrainNode(), incident)
    assert released.detail == "released this incident's hold; gpu-node-01 stays drained for the operators' rollout drain"
    assert await r.held() == [("gpu-node-01", "rollout")]
