"""Every scripted fault, seen through the real node-sampler with all its watchers running over
the simulated node's NVML event set, kernel log FIFO and Docker engine socket."""

from __future__ import annotations

import asyncio
import contextlib

import asyncssh
import pytest
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import ContainerExited, GpuLost, GpuXidReported, NodeSampled, ProcessOomKilled

from gpumedic_sim import SimFleet
from gpumedic_sim.fleet.nodes import FleetJob
from gpumedic_sim.faults import FAULTS, PARAMETERS, Entry, Fault


class Running:
    """One node's real sampler, running, with what it published."""

    def __init__(self, fleet: SimFleet, node_id: str, interval_s: float = 0.2) -> None:
        self.node = fleet.node(node_id)
        self.events: list = []
        self.failures_left = 0
        self.sampler = self.node.sampler(interval_s, probes=[])
        self._task: asyncio.Task | None = None

    async def publish(self, event) -> None:
        if self.failures_left > 0:
            self.failures_left -= 1
            raise ConnectionError("NATS unreachable")
        self.events.append(event)

    async def __aenter__(self) -> Running:
        self._task = asyncio.create_task(self.sampler.run(self.publish))
        await self.wait_for(NodeSampled)
        # the engine's event stream must be open before a fault, as on a node that has run a while
        async with asyncio.timeout(5):
            while not self.sampler.containers.connected:
                await asyncio.sleep(0.02)
        return self

    async def __aexit__(self, *exc) -> None:
        await stop_tasks([self._task])

    async def wait_for(self, kind, where=lambda e: True, timeout_s: float = 5.0):
        async with asyncio.timeout(timeout_s):
            while True:
                found = [e for e in self.events if isinstance(e, kind) and where(e)]
                if found:
                    return found[0]
                await asyncio.sleep(0.02)

    def samples_after(self, event) -> list[NodeSampled]:
        return [e for e in self.events if isinstance(e, NodeSampled) and e.occurred_at > event.occurred_at]


async def test_oom_kill_gives_the_kernel_lines_and_a_137_exit_with_oomkilled(fleet):
    async with Running(fleet, "sim-node-01") as run:
        job = run.node.inject_oom_kill(1)
        oom = await run.wait_for(ProcessOomKilled)
        exit_ = await run.wait_for(ContainerExited)

    assert oom.node_id == "sim-node-01" and oom.pid == job.pid and oom.process_name == "python"
    assert oom.constraint == "CONSTRAINT_MEMCG" and oom.container_id == job.container_id
    assert any("Killed process" in line for line in oom.kernel_lines)
    assert (exit_.container_id, exit_.exit_code, exit_.oom_killed, exit_.signal) == (job.container_id, 137, True, "SIGKILL")
    assert exit_.last_log_lines and exit_.finished_at is not None


@pytest.mark.parametrize(("inject", "code", "signal", "log_text"), [
    ("inject_segfault", 139, "SIGSEGV", "Segmentation fault"),
    ("inject_sigterm", 143, "SIGTERM", "SIGTERM"),
    ("inject_gpu_oom", 1, None, "CUDA out of memory"),
])
async def test_container_exits_carry_code_signal_and_logs(fleet, inject, code, signal, log_text):
    async with Running(fleet, "sim-node-02") as run:
        job = getattr(run.node, inject)(0)
        exit_ = await run.wait_for(ContainerExited)
        after = await run.wait_for(NodeSampled, lambda e: e.occurred_at > exit_.occurred_at)

    assert (exit_.exit_code, exit_.signal, exit_.oom_killed) == (code, signal, False)
    assert any(log_text in line for line in exit_.last_log_lines)
    assert job.pid not in [p.pid for p in after.gpus[0].processes]


async def test_xid_79_gives_the_xid_and_then_gpu_lost_once(fleet):
    async with Running(fleet, "sim-node-01") as run:
        run.node.inject_xid(1, 79)
        xid = await run.wait_for(GpuXidReported)
        lost = await run.wait_for(GpuLost)
        await asyncio.sleep(0.6)  # a few more samples: still lost, no second event

    assert (xid.gpu_index, xid.xid, xid.description) == (1, 79, "GPU has fallen off the bus")
    assert xid.gpu_uuid == run.node.gpus[1].uuid
    assert (lost.gpu_index, lost.gpu_uuid, lost.reason) == (1, run.node.gpus[1].uuid, "NVMLError_GpuIsLost")
    assert len([e for e in run.events if isinstance(e, GpuLost)]) == 1
    latest = run.samples_after(lost)[-1]
    assert latest.gpus[1].lost and not latest.gpus[0].lost


async def test_orphan_after_a_container_restart_shows_its_container_is_gone(fleet):
    async with Running(fleet, "sim-node-02") as run:
        orphan = run.node.inject_orphan(1)
        failed = await run.wait_for(ContainerExited, lambda e: e.exit_code == 1)
        sample = await run.wait_for(
            NodeSampled, lambda e: any(p.container_exists is False for g in e.gpus for p in g.processes)
        )

    (held,) = sample.gpus[1].processes
    assert held.pid == orphan.pid and held.container_id == orphan.container_id and held.container_exists is False
    assert held.user == "ml" and held.age_s is not None and held.age_s >= 0
    assert all(p.container_exists is True for p in sample.gpus[0].processes)
    assert any("busy or unavailable" in line for line in failed.last_log_lines)


async def test_a_holder_without_a_compute_context_is_listed_apart(fleet):
    async with Running(fleet, "sim-node-01") as run:
        orphan = run.node.inject_orphan(0, context=False)
        sample = await run.wait_for(NodeSampled, lambda e: e.device_holders)

    (holder,) = sample.device_holders
    assert holder.pid == orphan.pid and "/dev/nvidia0" in holder.devices
    assert orphan.pid not in [p.pid for g in sample.gpus for p in g.processes]


async def test_disk_full_reaches_the_host_part_of_the_sample(fleet):
    async with Running(fleet, "sim-node-01") as run:
        run.node.inject_disk_full("/data")
        sample = await run.wait_for(NodeSampled, lambda e: any(d.used_pct == 100 for d in e.host.disks))

    (data,) = [d for d in sample.host.disks if d.path == "/data"]
    assert data.available_bytes == 0 and data.used_bytes == data.total_bytes
    assert sample.host.memory_total_mib > sample.host.memory_available_mib > 0


async def test_the_fabric_faults_reach_the_sample_as_the_kernel_would_show_them(fleet):
    """A port up, then DOWN (Polling) once its cable is pulled; a flapping link's link_downed counting
    up; a port nobody cabled DOWN (Disabled) from the start; a node without a fabric has no ports."""
    async with Running(fleet, "sim-node-01") as run:
        assert run.events[-1].host.ib_ports == ()
        run.node.inject_nic_down(after=0.5)
        up = await run.wait_for(NodeSampled, lambda e: len(e.host.ib_ports) == 4)
        assert {(p.state, p.phys_state, p.rate_gbps) for p in up.host.ib_ports} == {("ACTIVE", "LinkUp", 400.0)}
        down = await run.wait_for(NodeSampled, lambda e: any(p.state == "DOWN" for p in e.host.ib_ports))
        assert [(p.device, p.phys_state) for p in down.host.ib_ports if p.state == "DOWN"] == [("mlx5_1", "Polling")]
        run.node.inject_nic_flapping(every_s=0.2)
        flapped = await run.wait_for(NodeSampled, lambda e: any((p.link_downed or 0) >= 2 for p in e.host.ib_ports))
        assert [p.device for p in flapped.host.ib_ports if p.link_downed] == ["mlx5_2"]
        run.node.cable_one_port_less()
        uncabled = await run.wait_for(NodeSampled, lambda e: any(p.phys_state == "Disabled" for p in e.host.ib_ports))
        assert [p.device for p in uncabled.host.ib_ports if p.phys_state == "Disabled"] == ["mlx5_3"]


async def test_an_immediate_event_waits_for_nats_and_is_not_lost(fleet):
    async with Running(fleet, "sim-node-02") as run:
        run.failures_left = 3  # the next publishes fail: samples are dropped, the OOM event is retried
        run.node.inject_oom_kill(0)
        oom = await run.wait_for(ProcessOomKilled, timeout_s=10)
    assert oom.node_id == "sim-node-02"


async def test_silent_sampler_publishes_nothing(fleet):
    fleet.node("sim-node-02").inject_sampler_silent()
    events = []

    async def publish(event):
        events.append(event)

    task = asyncio.create_task(fleet.run_samplers(publish, interval_s=0.1))
    for _ in range(100):  # a loaded machine takes a while for the first samples
        if sum(e.node_id == "sim-node-01" for e in events) >= 5:
            break
        await asyncio.sleep(0.1)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    assert {e.node_id for e in events} == {"sim-node-01"}  # five of node 01's intervals, none of node 02's


async def test_ssh_refuses_then_a_node_whose_ssh_hangs(fleet):
    key = fleet.client_key
    node = fleet.node("sim-node-01")
    await fleet.inject("ssh_refuses", "sim-node-01")
    with pytest.raises(OSError):
        await asyncssh.connect(node.host, node.ssh_port, client_keys=[key], known_hosts=str(fleet.known_hosts_path))

    hung = fleet.node("sim-node-02")
    await fleet.inject("ssh_hangs", "sim-node-02")
    with pytest.raises((asyncssh.Error, TimeoutError, OSError)):
        await asyncssh.connect(
            hung.host, hung.ssh_port, client_keys=[key], known_hosts=str(fleet.known_hosts_path), login_timeout=0.5
        )
    assert [f.fault for f in fleet.injected] == ["ssh_refuses", "ssh_hangs"]


async def test_inject_names_what_it_cannot_do(fleet):
    with pytest.raises(ValueError, match="needs a GPU"):
        await fleet.inject("oom_kill", "sim-node-01")
    with pytest.raises(ValueError, match="no fault named 'meltdown'"):
        await fleet.inject("meltdown", "sim-node-01")
    with pytest.raises(KeyError, match="no node 'sim-node-99'"):
        await fleet.inject("zombie_job", "sim-node-99", 0)


async def test_nvml_going_missing_under_a_running_sampler_is_noted_every_sample(fleet):
    async with Running(fleet, "sim-node-01") as run:
        run.node.inject_nvml_missing()
        sample = await run.wait_for(NodeSampled, lambda e: "NVML unavailable: NVMLError_LibraryNotFound" in e.errors)
    assert sample.gpus == ()


async def test_every_kind_a_scenario_can_name_is_one_lookup_and_its_stand_in_records_it(tmp_path):
    fleet = SimFleet(len(FAULTS), 2, tmp_path / "fleet")
    placed = dict(zip(fleet.nodes, FAULTS, strict=True))
    hung_on = next(n for n, fault in placed.items() if fault == Fault.JOB_HUNG)
    fleet.jobs.append(FleetJob.launch([fleet.node(hung_on), fleet.node("sim-node-01")], "t"))  # what job_hung stops
    async with fleet:
        for node_id, (fault, entry) in zip(fleet.nodes, FAULTS.items(), strict=True):
            await fleet.inject(fault, node_id, 1 if entry.gpu else None)
        with pytest.raises(ValueError, match="no fault named 'melted'"):
            await fleet.inject("melted", "sim-node-01")
        with pytest.raises(ValueError, match="zombie_job needs a GPU"):
            await fleet.inject("zombie_job", "sim-node-01")
    # each stand-in records its own kind (a job's hang records its lost GPU too, a job's end each rank's)
    assert [f.fault for f in fleet.injected if f.node_id == "sim" or placed[f.node_id] == f.fault] == list(FAULTS)
    assert all(f.expect == FAULTS[f.fault].expect for f in fleet.injected if f.fault != Fault.XID)  # an XID's number decides
    assert [f.node_id for f in fleet.injected if FAULTS[f.fault].whole_cluster] == ["sim"] * sum(e.whole_cluster for e in FAULTS.values())



def test_every_parameter_has_one_check_its_default_passes_and_an_unchecked_one_fails_at_once():
    for kind, entry in FAULTS.items():
        for name, default in entry.params.items():
            assert PARAMETERS[name](default) == default or (name, default) == ("nccl", "none"), (kind, name)
    assert PARAMETERS["for"]("90s") == 90.0
    with pytest.raises(ValueError, match="longer than 0s"):
        PARAMETERS["every"](0)
    with pytest.raises(ValueError, match="no check in PARAMETERS for melt_rate"):
        Entry("a GPU melts", "inject_melt", params={"melt_rate": 1.0})

# --- benign behaviour, seen the same way ---------------------------------------------------


async def test_a_container_stopped_on_purpose_carries_the_engines_signal_and_a_sigterm_fault_none(fleet):
    async with Running(fleet, "sim-node-02") as run:
        stopped = run.node.stop_job(0)
        planned = await run.wait_for(ContainerExited, lambda e: e.container_id == stopped.container_id)
        killed = run.node.inject_sigterm(1)
        unplanned = await run.wait_for(ContainerExited, lambda e: e.container_id == killed.container_id)
    assert (planned.exit_code, planned.engine_signal) == (143, "SIGTERM")
    assert (unplanned.exit_code, unplanned.engine_signal) == (143, None)  # a SIGTERM nobody on the node asked for


async def test_a_finished_job_exits_0_and_frees_its_gpu(fleet):
    async with Running(fleet, "sim-node-01") as run:
        done = run.node.finish_job(0)
        exit_ = await run.wait_for(ContainerExited, lambda e: e.container_id == done.container_id)
        after = (await run.wait_for(NodeSampled, lambda e: e.occurred_at > exit_.occurred_at)).gpus[0]
    assert exit_.exit_code == 0 and after.processes == () and after.memory_used_mib == 0


def test_a_checkpoint_pause_idles_the_gpu_while_output_grows_and_a_dip_stops_both(fleet):
    node = fleet.node("sim-node-01")
    job = node.pause_job(0, checkpointing=True)
    before = node.output_bytes()
    job.writing_since -= 10  # ten seconds of checkpoint writing
    assert node.utilization(0)[0] == 0 and node.output_bytes() > before and node.output_growing
    node.resume_job(0)
    assert node.utilization(0)[0] > 80
    node.pause_job(1, checkpointing=False)
    other = node.live_processes(1)[0]
    assert node.utilization(1)[0] == 0 and other.writing_since is None
    frozen = other.output_bytes(0.0)
    assert other.output_bytes(10**9) == frozen  # a dip writes nothing meanwhile


async def test_nvml_that_cannot_be_used_at_all_is_a_field_of_the_sample(fleet):
    async with Running(fleet, "sim-node-02") as run:
        run.node.inject_nvml_missing()
        sample = await run.wait_for(NodeSampled, lambda e: e.nvml_error is not None)
    assert "NVMLError_" in sample.nvml_error and sample.gpus == ()  # the driver went away, then cannot load
