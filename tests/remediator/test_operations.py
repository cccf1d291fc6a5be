"""Every catalogue operation over Debian's OpenSSH, with stand-in `systemctl`, `nvidia-smi`,
`fuser` and `docker` on the server's PATH (see tests/fixtures/sshd.py) and the real `cat`, `kill`,
`df` and `curl`: each test checks the node's state (the stand-ins' files, a real process, a real
HTTP server) after the action, and that hostile parameters never reach the server."""

from __future__ import annotations

import shutil
import subprocess
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from threading import Thread

import pytest
from pydantic import ValidationError

from gpumedic_sim.runs.pager import Pager
from gpumedic_events import (
    ActionOutcome,
    ActionRequested,
    DockerPrune,
    GpuReset,
    HttpAdmin,
    KillGpuProcesses,
    ProcessTarget,
    RebootNode,
    RestartJob,
    RestartUnit,
)
from gpumedic_incidents.policy import ActionPolicy, Actions, AdminEndpoint, AdminPolicy, JobRestart, RestartJobPolicy, RestartPolicy, UnitRule
from gpumedic_nodes.ssh import SshExecutor
from remediator import catalogue
from remediator.catalogue.kill import parse_stat
from tests.fixtures.real import needs

pytestmark = pytest.mark.sshd


def _executor(sshd) -> SshExecutor:
    return SshExecutor(
        inventory=sshd.inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key, connect_timeout_s=5.0, command_timeout_s=5.0
    )


async def _run(sshd, operation, actions: Actions = Actions(), verify_timeout_s: float = 2.0, admin_token: str | None = None,
               request: ActionRequested | None = None):
    async with _executor(sshd).session(sshd.node_id) as session:
        return await catalogue.execute(
            operation, session.run, actions=actions, admin_token=admin_token, request=request, verify_timeout_s=verify_timeout_s
        )


def _admin_request(node: str, operation: HttpAdmin) -> ActionRequested:
    return ActionRequested(source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=node, attempt=1,
                           operation=operation, reason="phantom job count")


def _unit(sshd, state: str, *, after_restart: str | None = None) -> str:
    """A unit known to the stand-in systemctl, in `state`; a fresh name per test."""
    name = f"job-daemon-{uuid.uuid4().hex[:8]}.service"
    (sshd.directory / "units" / name).write_text(f"{state}\n")
    if after_restart is not None:
        (sshd.directory / "units" / f"{name}.after-restart").write_text(f"{after_restart}\n")
    return name


def _restarts(sshd, unit: str) -> int:
    path = sshd.directory / "units" / f"{unit}.restarts"
    return len(path.read_text().splitlines()) if path.exists() else 0


def _allowing(unit: str, health_url: str | None = None) -> Actions:
    return Actions(restart_unit=RestartPolicy(units={unit: UnitRule(health_url=health_url)}))


async def test_kill_terms_a_real_process_then_kills_it_after_the_grace(sshd):
    # `sleep` dies of SIGTERM; this shell ignores it, so the grace runs out and SIGKILL follows.
    stubborn = subprocess.Popen(["sh", "-c", "trap '' TERM; while :; do sleep 0.1; done"])
    try:
        start = parse_stat(Path(f"/proc/{stubborn.pid}/stat").read_text()).start_ticks
        command = "sh -c trap '' TERM; while :; do sleep 0.1; done"
        target = ProcessTarget(pid=stubborn.pid, start_ticks=start, command=command)
        op = KillGpuProcesses(gpu_index=0, targets=(target,), signal="TERM", grace_s=1.0, max_gpu_utilization_pct=5)
        sshd.hold(0, stubborn.pid)
        try:
            result = await _run(sshd, op)
        finally:
            sshd.release(0, stubborn.pid)
        assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
        assert stubborn.wait(timeout=5) == -9
        assert result.detail == f"sent TERM to {stubborn.pid}; sent KILL after 1s to {stubborn.pid}; verified gone: {stubborn.pid}"
    finally:
        if stubborn.poll() is None:
            stubborn.kill()
            stubborn.wait()


async def test_restart_unit_restarts_the_allowed_unit_and_checks_it_is_active(sshd):
    unit = _unit(sshd, "failed")
    result = await _run(sshd, RestartUnit(unit=unit), _allowing(unit))
    assert (result.outcome, result.detail) == (ActionOutcome.SUCCEEDED, f"restarted {unit} (systemd); active")
    assert _restarts(sshd, unit) == 1
    assert sshd.commands()[-2:] == [f"systemctl restart {unit}", f"systemctl is-active {unit}"]


def test_restart_unit_goes_through_the_service_manager_the_inventory_names():
    from remediator.catalogue.units import render_restart

    actions = _allowing("p2p-node.service")
    op = RestartUnit(unit="p2p-node.service")
    assert render_restart(op, actions) == ("systemctl restart p2p-node.service", "systemctl is-active p2p-node.service")
    assert render_restart(op, actions, "supervisor") == (
        '"$HOME"/.gpumedic/bin/gpumedic-node restart p2p-node.service', '"$HOME"/.gpumedic/bin/gpumedic-node is-active p2p-node.service')
    assert render_restart(op, actions, "supervisor", "/workspace/.gpumedic")[0] == "/workspace/.gpumedic/bin/gpumedic-node restart p2p-node.service"
    assert render_restart(op, actions, "docker") == ("docker restart p2p-node", "docker inspect --format '{{.State.Running}}' p2p-node")


async def test_restart_job_restarts_the_allowed_unit_or_runs_the_allowed_command(sshd, tmp_path):
    unit = _unit(sshd, "inactive")
    started = tmp_path / "started"
    script = tmp_path / "restart-selfplay"
    script.write_text(f"#!/bin/sh\necho started >> {started}\n")
    script.chmod(0o755)
    broken = tmp_path / "broken-restart"
    broken.write_text("#!/bin/sh\necho 'no checkpoint to resume from' >&2\nexit 3\n")
    broken.chmod(0o755)
    jobs = RestartJobPolicy(jobs={"by_unit": JobRestart(unit=unit), "by_command": JobRestart(command=str(script)),
                                  "broken": JobRestart(command=str(broken))})
    actions = Actions(restart_job=jobs)
    result = await _run(sshd, RestartJob(job="by_unit"), actions)
    assert (result.outcome, result.detail) == (ActionOutcome.SUCCEEDED, "the job by_unit started; its unit is active")
    assert _restarts(sshd, unit) == 1
    result = await _run(sshd, RestartJob(job="by_command"), actions)
    assert (result.outcome, result.detail) == (ActionOutcome.SUCCEEDED, "the job by_command started (its command exited 0)")
    assert started.read_text() == "started\n" and sshd.commands()[-1] == str(script)
    result = await _run(sshd, RestartJob(job="broken"), actions)
    assert (result.outcome, result.detail) == (ActionOutcome.FAILED, "the job broken did not start: 'no checkpoint to resume from'")
    before = len(sshd.commands())
    with pytest.raises(catalogue.InvalidParameter, match=r"job nope is not in the policy's restart_job list \(allowed: broken, by_command, by_unit\)"):
        await _run(sshd, RestartJob(job="nope"), actions)
    assert len(sshd.commands()) == before


@pytest.mark.parametrize("job", [{"command": "restart"}, {"command": "/opt/x/../../bin/sh"}, {"command": "/opt/x restart"},
                                 {"command": "/opt/$(reboot)"}, {"unit": "a.service; reboot"}, {}, {"unit": "a.service", "command": "/a"}])
def test_a_restart_job_entry_is_one_plain_unit_or_path(job):
    with pytest.raises(ValidationError):
        JobRestart(**job)


async def test_a_unit_that_does_not_come_back_fails_the_action(sshd):
    unit = _unit(sshd, "failed", after_restart="activating")
    result = await _run(sshd, RestartUnit(unit=unit), _allowing(unit), verify_timeout_s=1.0)
    assert result.outcome is ActionOutcome.FAILED
    assert result.detail == f"restarted {unit}, but it is 'activating' after 1s, not active"


class _Health(BaseHTTPRequestHandler):
    answers = True
    hits = 0

    def do_GET(self):  # noqa: N802 (the http.server interface)
        type(self).hits += 1
        self.send_response(200 if self.answers else 503)
        self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture
def health():
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Health)
    Thread(target=server.serve_forever, daemon=True).start()
    _Health.answers, _Health.hits = True, 0
    yield f"http://127.0.0.1:{server.server_address[1]}/health"
    server.shutdown()


@needs(shutil.which("curl"), "curl")
async def test_restart_unit_waits_for_the_health_endpoint_the_policy_names(sshd, health):
    unit = _unit(sshd, "active")
    result = await _run(sshd, RestartUnit(unit=unit), _allowing(unit, health))
    assert result.outcome is ActionOutcome.SUCCEEDED and result.detail.endswith("and its health endpoint answers")
    assert _Health.hits == 1 and sshd.commands()[-1] == f"curl -fsS -m 5 -o /dev/null {health}"
    _Health.answers = False
    result = await _run(sshd, RestartUnit(unit=unit), _allowing(unit, health), verify_timeout_s=1.0)
    assert result.outcome is ActionOutcome.FAILED and "health endpoint does not answer" in result.detail
    assert "503" in result.detail  # curl's own words


async def test_gpu_reset_refuses_a_held_gpu_and_resets_a_free_one(sshd):
    resets = sshd.directory / "gpu5.resets"
    (sshd.directory / "holders5").write_text("31337\n")
    held = await _run(sshd, GpuReset(gpu_index=5))
    assert (held.outcome, held.detail) == (ActionOutcome.BLOCKED, "refused: /dev/nvidia5 is held by pid(s) 31337; not reset")
    assert held.in_use  # worth asking again once the holder is gone
    (sshd.directory / "holders5").unlink()
    (sshd.directory / "gpu5.apps").write_text("4242\n")
    busy = await _run(sshd, GpuReset(gpu_index=5))
    assert busy.detail == "refused: GPU 5 runs compute process(es) 4242; not reset" and busy.in_use
    assert not resets.exists()
    (sshd.directory / "gpu5.apps").unlink()
    done = await _run(sshd, GpuReset(gpu_index=5))
    assert (done.outcome, done.detail, done.in_use) == (ActionOutcome.SUCCEEDED, "GPU 5 reset; it answers again with 0 MiB in use", False)
    assert resets.read_text() == "reset\n"


async def test_docker_prune_removes_stopped_containers_images_and_cache_never_volumes(sshd):
    junk = sshd.directory / "junk"
    for kind, size in (("container", 3000), ("image", 5000), ("builder", 2000), ("volume", 7000)):
        (junk / kind).mkdir(parents=True, exist_ok=True)
        (junk / kind / "layer").write_bytes(b"x" * size)
    (sshd.directory / "docker-df").write_text(
        "Images=2.5GB (40%)\nContainers=120MB (100%)\nLocal Volumes=7GB (90%)\nBuild Cache=1.2GB\n"
    )
    result = await _run(sshd, DockerPrune())
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert result.detail.startswith("expected to free 3.8 GB (docker system df); freed ")  # volumes not counted
    assert sorted(p.name for p in junk.iterdir()) == ["volume"]
    assert (sshd.directory / "prunes").read_text().splitlines() == ["container prune", "image prune", "builder prune"]


async def test_reboot_runs_only_as_systemctl_reboot(sshd):
    reboots = sshd.directory / "reboots"
    result = await _run(sshd, RebootNode(), Actions(reboot_node=ActionPolicy(mode="enforce")))
    assert result.outcome is ActionOutcome.SUCCEEDED and "the node's next samples show whether it came back" in result.detail
    assert reboots.read_text() == "reboot\n"
    assert sshd.commands()[-2:] == ["cat /proc/sys/kernel/random/boot_id", "systemctl reboot"]


async def test_http_admin_posts_to_the_named_loopback_endpoint_with_its_token_on_stdin_only(sshd):
    service = Pager().start()  # the node's own service, on the node's loopback (real curl calls it)
    try:
        url = service.url.replace("/hooks/T000/B000/s3cr3t-path", "/admin/elect")
        actions = Actions(http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url=url)}))
        result = await _run(sshd, HttpAdmin(endpoint="force_election"), actions, admin_token="adm1n-t0ken")
        assert (result.outcome, result.detail) == (ActionOutcome.SUCCEEDED, "force_election: the node's service answered HTTP 200")
        (call,) = service.received
        assert call.path == "/admin/elect" and call.headers["Authorization"] == "Bearer adm1n-t0ken" and call.body == {}
        # The token crossed SSH on stdin: it is in no command line the node or the ledger saw.
        assert not any("adm1n-t0ken" in line for line in [*sshd.commands(), *result.steps])
        # Without a token curl still gets the end of its stdin at once (not a wait for a timeout).
        untokened = await _run(sshd, HttpAdmin(endpoint="force_election"), actions)
        assert untokened.outcome is ActionOutcome.SUCCEEDED and "Authorization" not in service.received[-1].headers
        service.answers = [403]
        refused = await _run(sshd, HttpAdmin(endpoint="force_election"), actions, admin_token="wrong")
        assert (refused.outcome, refused.detail) == (ActionOutcome.FAILED, "force_election: the node's service did not take it (HTTP 403)")
    finally:
        service.stop()


async def test_http_admin_called_on_the_leader_posts_the_body_naming_the_incidents_node(sshd):
    """The runbook's reset: `POST http://leader:8770/admin/reset_node_jobs {"node_id": "..."}`, run on
    the leader (`at`); the body's only value from the incident is its node id, JSON-encoded."""
    service = Pager().start()
    try:
        url = service.url.replace("/hooks/T000/B000/s3cr3t-path", "/admin/reset_node_jobs")
        reset = AdminEndpoint(url=url, target="leader", body={"node_id": "{node_id}", "reason": "phantom count"})
        actions = Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": reset}))
        request = _admin_request("gpu-node-07", HttpAdmin(endpoint="reset_job_count", at=sshd.node_id))
        result = await _run(sshd, request.operation, actions, admin_token="t0k", request=request)
        assert (result.outcome, result.detail) == (ActionOutcome.SUCCEEDED, f"reset_job_count: {sshd.node_id}'s service answered HTTP 200")
        (call,) = service.received
        assert call.path == "/admin/reset_node_jobs" and call.body == {"node_id": "gpu-node-07", "reason": "phantom count"}
        # where the policy says the leader, a request must name one; where it says the node, none
        with pytest.raises(catalogue.InvalidParameter, match="called on the cluster's leader, and the request names none"):
            catalogue.render(HttpAdmin(endpoint="reset_job_count"), actions)
        node_only = Actions(http_admin=AdminPolicy(endpoints={"reset_job_count": AdminEndpoint(url=url)}))
        with pytest.raises(catalogue.InvalidParameter, match="called on the incident's node only, not on 'gpu-node-01'"):
            catalogue.render(HttpAdmin(endpoint="reset_job_count", at="gpu-node-01"), node_only)
        assert len(service.received) == 1
    finally:
        service.stop()


@pytest.mark.parametrize("body", [{"node_id": "{node_id!r}"}, {"node_id": "{gpu_index}"}, {"node_id": "{0}"}, {"node_id": "'; reboot"},
                                  {"bad key": "x"}, {"node_id": "{node_id"}, {"node_id": "$(reboot)"}])
def test_admin_body_templates_take_only_the_node_id_and_plain_text(body):
    with pytest.raises(ValidationError, match="body"):
        AdminEndpoint(url="http://127.0.0.1:8770/admin/reset_node_jobs", target="leader", body=body)


@pytest.mark.parametrize("endpoint", ["force_election; reboot", "$(reboot)", "http://evil/", "../admin", "Force", "a\nb", ""])
async def test_hostile_or_unlisted_admin_endpoints_are_refused_and_nothing_runs(sshd, endpoint):
    before = len(sshd.commands())
    actions = Actions(http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url="http://127.0.0.1:8080/admin/elect")}))
    with pytest.raises(ValidationError, match="endpoint"):
        HttpAdmin(endpoint=endpoint)
    with pytest.raises(catalogue.InvalidParameter, match="is not an endpoint name"):
        await _run(sshd, HttpAdmin.model_construct(endpoint=endpoint), actions)
    with pytest.raises(catalogue.InvalidParameter, match="reset_job_count is not in the policy's http_admin list .allowed: force_election."):
        await _run(sshd, HttpAdmin(endpoint="reset_job_count"), actions)
    assert len(sshd.commands()) == before


HOSTILE_UNITS = ["a.service; reboot", "$(reboot).service", "a.service\nreboot", "../../etc/passwd.service", "-H evil.service", "a b.service", "sshd"]


@pytest.mark.parametrize("unit", HOSTILE_UNITS)
async def test_hostile_unit_names_are_refused_by_the_event_and_by_the_catalogue(sshd, unit):
    before = len(sshd.commands())
    with pytest.raises(ValidationError, match="unit"):
        RestartUnit(unit=unit)
    forged = RestartUnit.model_construct(unit=unit)  # as if event validation had been skipped
    with pytest.raises(catalogue.InvalidParameter, match="is not a systemd service name"):
        await _run(sshd, forged, _allowing("job-daemon.service"))
    assert len(sshd.commands()) == before


@pytest.mark.parametrize("gpu", [-1, 64, "0; reboot", "$(id)", True, 1.5, "0\n1"])
async def test_hostile_gpu_indexes_are_refused_and_nothing_runs(sshd, gpu):
    before = len(sshd.commands())
    with pytest.raises(ValidationError):
        GpuReset(gpu_index=gpu)
    with pytest.raises(catalogue.InvalidParameter, match="GPU index .* is not an integer in 0..63"):
        await _run(sshd, GpuReset.model_construct(gpu_index=gpu))
    assert len(sshd.commands()) == before


def test_an_operation_outside_the_catalogue_is_refused_at_parse():
    request = {
        "source": "x", "action_id": str(uuid.uuid4()), "incident_id": str(uuid.uuid4()), "node_id": "n1", "attempt": 1,
        "operation": {"operation": "run_shell", "command": "reboot"}, "reason": "r",
    }
    with pytest.raises(ValidationError, match="does not match any of the expected tags: 'kill_gpu_processes', 'restart_unit'"):
        ActionRequested.model_validate(request)
