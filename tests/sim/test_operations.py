"""Every catalogue operation, run by the remediator's own code over real SSH against a simulated
node, which interprets the commands and changes its state as a real node would: each test checks
what the node's sampler sees afterwards."""

from __future__ import annotations

import re

import pytest

from gpumedic_sim import SimFleet, SimNode
from gpumedic_sim.machine.host import DOCKER_ROOT
from gpumedic_events import ActionOutcome, DockerPrune, GpuReset, HttpAdmin, KillGpuProcesses, ProcessTarget, RebootNode, RestartUnit
from gpumedic_incidents.policy import ActionPolicy, Actions, AdminEndpoint, AdminPolicy, CheckpointPolicy
from gpumedic_nodes.ssh import SshExecutor
from remediator import catalogue


def _executor(fleet: SimFleet) -> SshExecutor:
    return SshExecutor(
        inventory=fleet.inventory_path,
        known_hosts=fleet.known_hosts_path,
        client_key=fleet.client_key_path,
        connect_timeout_s=5.0,
        command_timeout_s=5.0,
    )


async def _run(fleet: SimFleet, node: SimNode, operation, actions: Actions = Actions(), verify_timeout_s: float = 3.0, checkpoint=None):
    async with _executor(fleet).session(node.node_id) as session:
        return await catalogue.execute(operation, session.run, actions=actions, verify_timeout_s=verify_timeout_s, checkpoint=checkpoint)


def _target(process) -> ProcessTarget:
    return ProcessTarget(pid=process.pid, start_ticks=process.start_ticks, command=process.command)


async def test_kill_sends_term_then_kill_after_the_grace_to_a_zombie_that_ignores_term(fleet):
    node = fleet.node("sim-node-01")
    zombie = node.inject_zombie(1, ignore_term=True)
    operation = KillGpuProcesses(gpu_index=1, targets=(_target(zombie),), signal="TERM", grace_s=1.0, max_gpu_utilization_pct=5)
    result = await _run(fleet, node, operation)
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert f"sent TERM to {zombie.pid}; sent KILL after 1s to {zombie.pid}; verified gone: {zombie.pid}" == result.detail
    assert zombie.killed_by == "KILL"
    after = await node.sampler(1.0).sample()
    assert after.gpus[1].processes == () and after.gpus[1].memory_used_mib == 0


async def test_kill_stops_at_term_when_the_process_exits_in_its_grace(fleet):
    node = fleet.node("sim-node-01")
    zombie = node.inject_zombie(0)
    operation = KillGpuProcesses(gpu_index=0, targets=(_target(zombie),), signal="TERM", grace_s=5.0, max_gpu_utilization_pct=5)
    result = await _run(fleet, node, operation)
    assert result.outcome is ActionOutcome.SUCCEEDED and zombie.killed_by == "TERM"
    assert f"kill -s KILL {zombie.pid}" not in node.ssh_commands


async def test_restart_unit_brings_a_hung_sampler_back(fleet):
    node = fleet.node("sim-node-02")
    node.inject_sampler_silent()
    result = await _run(fleet, node, RestartUnit(unit="gpumedic-node-sampler.service"))
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert result.detail == "restarted gpumedic-node-sampler.service (systemd); active"
    assert not node.sampler_silent and node.unit_restarts == {"gpumedic-node-sampler.service": 1}
    assert node.ssh_commands == [
        "systemctl restart gpumedic-node-sampler.service",
        "systemctl is-active gpumedic-node-sampler.service",
    ]


async def test_restart_of_a_unit_outside_the_allow_list_is_refused_before_connecting(fleet):
    node = fleet.node("sim-node-02")
    with pytest.raises(catalogue.InvalidParameter, match="ssh.service is not in the policy's restart_unit allow-list"):
        await _run(fleet, node, RestartUnit(unit="ssh.service"))
    assert node.ssh_commands == [] and node.unit_restarts == {}


async def test_gpu_reset_is_refused_while_a_leftover_holds_the_device_and_runs_once_it_is_gone(fleet):
    node = fleet.node("sim-node-01")
    leftover = node.inject_orphan(1, context=False)  # holds /dev/nvidia1, invisible to NVML
    node.gpus[1].remapped_rows_pending = True
    held = await _run(fleet, node, GpuReset(gpu_index=1))
    assert held.outcome is ActionOutcome.BLOCKED
    assert held.detail == f"refused: /dev/nvidia1 is held by pid(s) {leftover.pid}; not reset"
    assert "nvidia-smi --gpu-reset -i 1" not in node.ssh_commands
    node.kill(leftover.pid)
    done = await _run(fleet, node, GpuReset(gpu_index=1))
    assert done.outcome is ActionOutcome.SUCCEEDED and done.detail == "GPU 1 reset; it answers again with 0 MiB in use"
    after = await node.sampler(1.0).sample()
    assert after.gpus[1].remapped_rows_pending is False


async def test_gpu_reset_is_refused_while_a_job_computes_on_the_gpu(fleet):
    node = fleet.node("sim-node-01")
    (job,) = node.live_processes(0)
    result = await _run(fleet, node, GpuReset(gpu_index=0))
    assert result.outcome is ActionOutcome.BLOCKED and result.detail == f"refused: GPU 0 runs compute process(es) {job.pid}; not reset"
    assert job.alive


async def test_docker_prune_frees_what_filled_docker_s_disk_and_says_how_much(fleet):
    node = fleet.node("sim-node-02")
    node.inject_disk_full(DOCKER_ROOT)
    before = await node.sampler(1.0).sample()
    assert next(d for d in before.host.disks if d.path == DOCKER_ROOT).used_pct == 100
    result = await _run(fleet, node, DockerPrune())
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert result.detail.startswith("expected to free 1154.5 GB (docker system df); freed 1154.5 GB on /var/lib/docker")
    after = await node.sampler(1.0).sample()
    assert next(d for d in after.host.disks if d.path == DOCKER_ROOT).used_pct == pytest.approx(70, abs=0.5)
    assert "docker volume prune --force" not in node.ssh_commands


async def test_a_volume_prune_needs_the_policy_s_consent(fleet):
    node = fleet.node("sim-node-02")
    with pytest.raises(catalogue.InvalidParameter, match="which the policy does not allow"):
        await _run(fleet, node, DockerPrune(volumes=True))
    assert node.ssh_commands == []
    allowing = Actions(docker_prune={"volumes": True})
    result = await _run(fleet, node, DockerPrune(volumes=True), actions=allowing)
    assert result.outcome is ActionOutcome.SUCCEEDED and "docker volume prune --force" in node.ssh_commands


async def test_reboot_ends_every_process_and_starts_a_new_boot(fleet):
    node = fleet.node("sim-node-01")
    boot, jobs = node.boot_id, node.live_processes()
    result = await _run(fleet, node, RebootNode(), actions=Actions(reboot_node=ActionPolicy(mode="enforce")))
    assert result.outcome is ActionOutcome.SUCCEEDED and f"boot id was {boot!r}" in result.detail
    assert node.boot_id != boot and jobs and not node.live_processes()


async def test_inventory_check_reaches_every_simulated_node_with_every_tool(fleet):
    from gpumedic_nodes.check import check_inventory

    checks = await check_inventory(_executor(fleet), fleet.inventory_path)
    assert [c.node_id for c in checks] == sorted(n.node_id for n in fleet.nodes.values())
    assert all(c.ok and not c.missing for c in checks), [c for c in checks if not c.ok or c.missing]


async def test_preflight_look_names_a_lost_gpu_and_a_missing_driver(fleet):
    from gpumedic_incidents.policy import PreflightPolicy
    from remediator.catalogue import preflight
    from remediator.catalogue.base import Node

    node = fleet.node("sim-node-01")
    node.finish_job(0)
    node.inject_gpu_lost(0)
    async with _executor(fleet).session(node.node_id) as session:
        looks = await preflight.inspect(Node(session.run, 1.0, None, None), None, PreflightPolicy())
        # GPU 1 still runs its job: not ready either, but it answers.
        assert [(look.readiness.index, look.readiness.ready, look.answers) for look in looks] == [(0, False, False), (1, False, True)]
        assert looks[0].readiness.problems[0].startswith("does not answer NVML")
        assert preflight.refusal_to_clean(looks[0], PreflightPolicy()).startswith("GPU 0: nothing to clean")
        node.inject_nvml_missing()
        with pytest.raises(preflight.NoGpuState, match="nvidia-smi fails on the node"):
            await preflight.inspect(Node(session.run, 1.0, None, None), None, PreflightPolicy())


async def test_a_forced_election_over_http_admin_gives_a_leaderless_cluster_its_leader(fleet):
    node = fleet.node("sim-node-02")
    node.admin_token = "p2p-admin"
    fleet.set_leader(None)
    actions = Actions(http_admin=AdminPolicy(endpoints={"force_election": AdminEndpoint(url="http://127.0.0.1:8080/force_election")}))
    async with _executor(fleet).session(node.node_id) as session:
        wrong = await catalogue.execute(HttpAdmin(endpoint="force_election"), session.run, actions=actions, admin_token="guess", verify_timeout_s=1)
        assert (wrong.outcome, wrong.detail) == (ActionOutcome.FAILED, "force_election: the node's service did not take it (HTTP 401)")
        assert all(n.leader is None for n in fleet.nodes.values())
        right = await catalogue.execute(
            HttpAdmin(endpoint="force_election"), session.run, actions=actions, admin_token="p2p-admin", verify_timeout_s=1
        )
    assert right.outcome is ActionOutcome.SUCCEEDED, right.detail
    assert {n.leader for n in fleet.nodes.values()} == {"sim-node-02"} and node.admin_calls == ["/force_election"]
    assert not any("p2p-admin" in c for c in node.ssh_commands)


async def test_an_undrain_runs_dcgm_diagnostics_first_and_a_gpu_waiting_for_a_remap_keeps_the_node_drained(fleet):
    """The simulated node answers `dcgmi diag -j` as DCGM 4.x does; the undrain reads it."""
    import uuid
    from contextlib import asynccontextmanager

    from gpumedic_events import ActionRequested, UndrainNode
    from remediator.catalogue.base import Means, Node

    node = fleet.node("sim-node-01")
    released = []

    class Scheduler:  # the store and hook side of a drain, which this test does not reach
        async def holders(self, node_id):
            return []

        async def release(self, request, holder):
            released.append(request.node_id)

        async def tell(self, request, *, drained): ...

        async def publish(self, request, *, drained): ...

    async def undrain():
        request = ActionRequested(source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=node.node_id,
                                  attempt=1, operation=UndrainNode(), reason="validated")
        async with _executor(fleet).session(node.node_id) as session:

            @asynccontextmanager
            async def on_node(at=None):
                yield Node(session.run, 3.0, None, None)

            return await catalogue.perform(UndrainNode(), Means(actions=Actions(), node=on_node, request=request, scheduler=Scheduler()))

    node.gpus[1].remapped_rows_pending = True
    kept = await undrain()
    assert kept.outcome is ActionOutcome.FAILED and released == []
    assert kept.detail.startswith("sim-node-01 stays drained: DCGM diagnostics level 1 failed: memory fail on GPU 1: ")
    node.gpus[1].remapped_rows_pending = False
    given_back = await undrain()
    assert (given_back.outcome, given_back.detail) == (ActionOutcome.SUCCEEDED, "undrained sim-node-01 (DCGM diagnostics level 1 passed)")
    assert released == ["sim-node-01"]


async def test_a_new_worker_is_accepted_only_with_every_gpu_free_and_dcgm_passing_and_then_promoted(fleet, tmp_path):
    """accept_worker, a new worker's burn-in on the node: pre-flight's look, DCGM's diagnostic,
    then the policy's promotion in a real SQLite task database (the runbook's `spawning` ->
    `active`, as the simulated pool's workers record themselves)."""
    import sqlite3
    import uuid
    from contextlib import asynccontextmanager

    from gpumedic_events import AcceptWorker, ActionRequested
    from gpumedic_incidents.policy import AcceptPolicy
    from gpumedic_sim.fleet.workers import PROMOTE
    from gpumedic_store import TaskDatabase
    from remediator.catalogue.base import Means, Node

    node = fleet.node("sim-node-02")
    path = tmp_path / "tasks.db"
    with sqlite3.connect(path) as db:
        db.execute("CREATE TABLE workers (id TEXT PRIMARY KEY, status TEXT NOT NULL, heartbeat_at TEXT)")
        db.execute("INSERT INTO workers VALUES ('sim-node-02', 'spawning', NULL)")

    def status() -> str:
        with sqlite3.connect(path) as db:
            return db.execute("SELECT status FROM workers WHERE id = 'sim-node-02'").fetchone()[0]

    tasks = TaskDatabase(f"sqlite:///{path}", "the test's task database")
    actions = Actions(accept_worker=AcceptPolicy(statement=PROMOTE))

    async def accept():
        request = ActionRequested(source="autoscaler", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=node.node_id,
                                  attempt=1, operation=AcceptWorker(), reason="burn-in")
        async with _executor(fleet).session(node.node_id) as session:

            @asynccontextmanager
            async def on_node(at=None):
                yield Node(session.run, 3.0, None, None)

            return await catalogue.perform(AcceptWorker(), Means(actions=actions, node=on_node, request=request, task_db=tasks))

    for gpu in range(len(node.gpus)):
        node.finish_job(gpu)  # a new worker: nothing runs yet
    leftover = node.inject_orphan(1)
    refused = await accept()
    assert refused.outcome is ActionOutcome.FAILED and status() == "spawning"
    assert refused.detail.startswith("sim-node-02 not accepted: GPU 1: "), refused.detail
    assert str(leftover.pid) in refused.detail
    node.processes.pop(leftover.pid)
    node.gpus[0].remapped_rows_pending = True
    failed_diag = await accept()
    assert failed_diag.outcome is ActionOutcome.FAILED and status() == "spawning"
    assert failed_diag.detail.startswith("sim-node-02 not accepted: DCGM diagnostics level 1 failed: memory fail on GPU 0"), failed_diag.detail
    node.gpus[0].remapped_rows_pending = False
    accepted = await accept()
    assert (accepted.outcome, accepted.detail) == (
        ActionOutcome.SUCCEEDED,
        f"accepted sim-node-02: {len(node.gpus)} GPU(s) free and healthy; DCGM diagnostics level 1 passed; "
        "promoted in the task database (1 record(s) changed)",
    )
    assert status() == "active"
    assert f"fuser /dev/nvidia{len(node.gpus) - 1}" in node.ssh_commands and not any(c.startswith(("kill", "systemctl")) for c in node.ssh_commands)


async def test_a_job_asked_with_a_file_saves_removes_the_file_and_goes_on_so_the_reset_still_waits_for_its_gpu(fleet):
    """The checkpoint step's file: written in the job's working directory (/proc/PID/cwd), done
    when the job removes it. The job saved and runs on, so the GPU reset after it is refused as
    in use (asked again later by its ladder), and the job's work is safe either way."""
    node = fleet.node("sim-node-01")
    node.checkpoint_s = 1.0
    (job,) = node.live_processes(0)
    job.on_checkpoint = "save"
    rule = CheckpointPolicy(how="file", file=".save-now", wait_s=10, poll_s=0.25)
    result = await _run(fleet, node, GpuReset(gpu_index=0), checkpoint=rule)
    assert result.outcome is ActionOutcome.BLOCKED and result.in_use, result.detail
    assert re.fullmatch(rf"asked pid\(s\) {job.pid} to checkpoint \(a file \.save-now in its working directory\): done after [1-4]s; "
                        rf"then refused: GPU 0 runs compute process\(es\) {job.pid}; not reset", result.detail), result.detail
    assert job.alive and job.files == set() and job.producing  # saved, the file gone, computing again
    touched = node.ssh_commands.index(f"touch -- /proc/{job.pid}/cwd/.save-now")
    assert f"test -e /proc/{job.pid}/cwd/.save-now" in node.ssh_commands[touched:]
    assert "nvidia-smi --query-compute-apps=pid --format=csv,noheader --id=0" in node.ssh_commands[touched:]  # the reset's own check, after


HOOK = "http://127.0.0.1:8765/checkpoint"


async def test_a_job_asked_through_its_hook_saves_and_the_reboot_follows_one_that_ignores_it_costs_the_wait(fleet):
    """The checkpoint step's HTTP hook: one POST on the node, then a GET each poll until it answers
    200; a hook that keeps answering 202 costs the wait, and a node where nothing listens is
    rebooted without waiting (nobody could be asked)."""
    rule = CheckpointPolicy(how="http", url=HOOK, wait_s=4, poll_s=0.25)
    saving = fleet.node("sim-node-01")
    saving.checkpoint_s = 1.0
    jobs = saving.live_processes()
    for job in jobs:
        job.on_checkpoint = "save"
    pids = ", ".join(str(p.pid) for p in sorted(jobs, key=lambda p: p.gpu))
    result = await _run(fleet, saving, RebootNode(), checkpoint=rule)
    assert re.fullmatch(rf"asked pid\(s\) {pids} through {HOOK} to checkpoint: done after [1-3]s; then .*", result.detail), result.detail
    posted = saving.ssh_commands.index(f"curl -sS -m 10 -X POST -o /dev/null -w '%{{http_code}}' {HOOK}")
    assert f"curl -sS -m 10 -o /dev/null -w '%{{http_code}}' {HOOK}" in saving.ssh_commands[posted:]
    assert saving.ssh_commands.index("systemctl reboot") > posted

    other = fleet.node("sim-node-02")  # its jobs serve no hook: the reset is not held up
    plain = await _run(fleet, other, GpuReset(gpu_index=0), checkpoint=rule)
    assert plain.detail.startswith(f"no checkpoint asked: the hook {HOOK} did not accept it "
                                   "('curl: (7) Failed to connect to 127.0.0.1 port 8765: Connection refused'); then refused: "), plain.detail

    for job in other.live_processes():
        job.on_checkpoint = "ignore"
    late = await _run(fleet, other, RebootNode(), checkpoint=rule)
    assert re.fullmatch(rf"asked pid\(s\) [0-9, ]+ through {HOOK} to checkpoint: not done after 4s, so the action went ahead; then .*",
                        late.detail), late.detail
    assert "systemctl reboot" in other.ssh_commands


@pytest.mark.parametrize("url", [None, "http://10.0.0.5:8765/checkpoint", "http://127.0.0.1:8765/x;reboot", "http://127.0.0.1/x\n"])
def test_an_http_checkpoint_needs_a_plain_loopback_hook(url):
    with pytest.raises(ValueError, match="url"):
        CheckpointPolicy(how="http", url=url)


async def test_a_kill_s_idle_targets_are_not_asked_to_checkpoint_unless_the_policy_says_even_when_idle(fleet):
    node = fleet.node("sim-node-02")
    zombie = node.inject_zombie(1)
    zombie.on_checkpoint = "save"
    operation = KillGpuProcesses(gpu_index=1, targets=(_target(zombie),), signal="TERM", grace_s=1.0, max_gpu_utilization_pct=5)
    skipped = await _run(fleet, node, operation, checkpoint=CheckpointPolicy(how="signal", wait_s=5, poll_s=0.25))
    assert skipped.detail.startswith("no checkpoint asked: the job idled for the whole idle window (nothing to save); then sent TERM")
    assert zombie.killed_by == "TERM" and not any(c.startswith("kill -s USR1") for c in node.ssh_commands)

    other = node.inject_zombie(0)
    other.on_checkpoint = "save"
    operation = KillGpuProcesses(gpu_index=0, targets=(_target(other),), signal="TERM", grace_s=1.0, max_gpu_utilization_pct=5)
    asked = await _run(fleet, node, operation, checkpoint=CheckpointPolicy(how="signal", wait_s=5, poll_s=0.25, even_when_idle=True))
    # it saved and exited of itself: the kill finds nothing left to end
    assert asked.detail.startswith(f"asked pid(s) {other.pid} to checkpoint (SIGUSR1): done after "), asked.detail
    assert other.killed_by is None and not other.alive and f"kill -s USR1 {other.pid}" in node.ssh_commands
