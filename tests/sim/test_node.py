"""The simulated node's state, its fake NVML, its shell interpreter and its status endpoint."""

from __future__ import annotations

import asyncio
import inspect
import json

import httpx
import pynvml
import pytest

from gpumedic_sim import GPU_NAME, GPU_TOTAL_MIB, Fault, SimNode, interpret
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_sim.fleet.workers import Hosts
from gpumedic_sim.machine.docker import EngineNode
from gpumedic_sim.machine.nccl import RasNode
from gpumedic_sim.machine.nvml import NvmlNode
from gpumedic_sim.machine.procs import ProcNode
from gpumedic_sim.machine.ssh import ShellNode
from gpumedic_sim.machine.status import DaemonNode, StatusEndpoint


def _members(protocol: type) -> set[str]:
    calls = {name for name in vars(protocol) if not name.startswith(("__", "_abc_", "_is_"))}
    return calls | set(inspect.get_annotations(protocol))


@pytest.mark.parametrize(
    ("protocol", "real"),
    [(p, SimNode) for p in (DaemonNode, EngineNode, NvmlNode, ProcNode, RasNode, ShellNode)] + [(Hosts, SimFleet)],
    ids=lambda p: p.__name__,
)
def test_each_interface_reads_what_the_node_has_as_the_node_has_it(protocol, real):
    """Each interface names what it reads of a node (a Protocol, so the machine's interfaces stand
    beside the node's state, not on it): every name is the real class's, every call its signature."""
    made = real("sim-node-01", 1) if real is SimNode else None
    members = _members(protocol)
    assert members
    for name in sorted(members):
        if name in inspect.get_annotations(protocol):
            assert hasattr(made, name) if made is not None else name in inspect.get_annotations(real), name
        else:
            ours, theirs = getattr(protocol, name), getattr(real, name)
            if isinstance(ours, property):
                assert isinstance(theirs, property), name
            else:
                assert inspect.signature(ours) == inspect.signature(theirs), name


def test_a_new_node_is_idle_and_start_job_loads_it():
    node = SimNode("sim-node-09", 2)
    assert node.running_jobs == 0 and node.utilization(0) == (0, 0)
    job = node.start_job(1)
    assert node.running_jobs == 1 and node.output_growing
    assert 85 <= node.utilization(1)[0] <= 95 and node.memory_used_mib(1) == job.used_mib
    assert node.gpus[0].name == GPU_NAME and node.gpus[0].total_mib == GPU_TOTAL_MIB
    assert node.gpus[0].uuid != node.gpus[1].uuid


async def test_zombie_orphan_and_ground_truth():
    node = SimNode("sim-node-09", 1)
    busy = node.start_job(0)
    zombie = node.inject_zombie(0)
    assert zombie is busy  # the job itself hangs
    assert node.running_jobs == 1 and not node.output_growing and node.utilization(0) == (0, 0)
    size = node.output_bytes()
    assert node.output_bytes() == size

    old_container = zombie.container_id
    orphan = node.inject_orphan(0)
    assert orphan is zombie  # the job outlived its container's restart
    assert node.running_jobs == 0  # the job manager does not count a leftover
    assert node.memory_used_mib(0) == busy.used_mib  # it still holds the GPU
    assert old_container not in node.containers
    (replacement,) = node.containers.values()
    assert replacement.exit_code == 1 and "busy or unavailable" in replacement.logs[-1]
    assert [(f.node_id, f.gpu, f.fault) for f in node.injected] == [
        ("sim-node-09", 0, Fault.ZOMBIE_JOB),
        ("sim-node-09", 0, Fault.ORPHAN_GPU_HOLDER),
    ]

    sample = await node.sampler(1.0, probes=[]).sample()
    (held,) = sample.gpus[0].processes
    assert held.pid == orphan.pid and held.container_id == old_container


async def test_gpu_lost_and_nvml_missing_reach_the_sample_as_errors():
    node = SimNode("sim-node-09", 2)
    node.start_job(0)
    node.inject_gpu_lost(1)
    node.gpus[0].failing["nvmlDeviceGetName"] = pynvml.NVMLError_Unknown
    node.gpus[0].failing["nvmlDeviceGetEnforcedPowerLimit"] = pynvml.NVMLError_NotSupported
    sampler = node.sampler(1.0, probes=[])

    sample = await sampler.sample()
    assert sample.gpus[1].lost and sample.gpus[1].memory_used_mib is None and sample.gpus[1].uuid == ""
    assert "gpu 1: NVMLError_GpuIsLost" in sample.errors
    assert "gpu 0 name: NVMLError_Unknown" in sample.errors
    # an unsupported query is a property of the GPU, not a fault: no note, the field stays empty
    assert sample.gpus[0].power_limit_w is None and not any("PowerLimit" in e or "power limit" in e for e in sample.errors)
    assert sample.gpus[0].utilization_gpu_pct >= 85 and sample.gpus[0].power_w > 72

    node.inject_nvml_missing()
    fresh = node.sampler(1.0, probes=[])
    assert (await fresh.sample()).errors == ("NVML unavailable: NVMLError_LibraryNotFound",)


def test_nvml_before_init_raises_like_the_binding():
    nvml = SimNode("sim-node-09", 1).nvml()
    with pytest.raises(pynvml.NVMLError_Uninitialized):
        nvml.nvmlDeviceGetCount()
    nvml.nvmlInit()
    with pytest.raises(pynvml.NVMLError_InvalidArgument):
        nvml.nvmlDeviceGetHandleByIndex(5)


def test_interpreter_without_a_network():
    node = SimNode("sim-node-09", 1)
    job = node.start_job(0)
    assert interpret(node, "cat /proc/abc/stat").exit_status == 1
    assert interpret(node, "kill -s KILL 1 " + str(job.pid)).exit_status == 1
    assert node.process(job.pid) is None  # the live one died even though pid 1 was missing
    assert interpret(node, "kill -s KILL 'unterminated").exit_status == 2
    assert interpret(node, "").exit_status == 0


async def test_status_endpoint_answers_json(fleet):
    node = fleet.node("sim-node-02")
    status, body = await http_get(node.status_url)
    assert status == 200
    document = json.loads(body)
    assert 86400.0 <= document.pop("uptime_s") < 86460  # up a day before the fleet started, and the test's own seconds
    assert document == {
        "node_id": "sim-node-02",
        "role": "follower",
        "leader": "sim-node-01",
        "peers": {"sim-node-01": {"alive": True, "is_voter": True, "selfplay_jobs": 2, "gpu_percent": 90.0}},
        "voters": 2,
        "voters_total": 2,
        "quorum": True,
        "healthy": True,
        "selfplay_jobs": 2,
    }
    node.inject_zombie(0)
    node.kill(node.live_processes(1)[0].pid)
    fleet.set_leader(None)
    status, body = await http_get(node.status_url)
    assert json.loads(body)["selfplay_jobs"] == 1 and json.loads(body)["leader"] is None
    status, _ = await http_get(node.status_url.replace("/status", "/nope"))
    assert status == 404


async def test_blocked_status_endpoint_accepts_but_never_answers(fleet):
    node = fleet.node("sim-node-01")
    node.inject_status_blocked()
    reading = await node.probes(status_timeout_s=0.2)[0].observe()
    assert reading.running is None and "no answer within 0.2s" in reading.errors[0]


async def test_stopping_the_status_endpoint_ends_each_connections_handler_without_an_error():
    # Two clients connected without asking yet (a probe cut off mid-request), one to a blocked
    # endpoint: the stop closes them and waits for their handlers, so none is left to be cancelled
    # when the loop ends, which Python 3.11 reports as an error with a traceback.
    loop = asyncio.get_running_loop()
    reported: list[dict] = []
    loop.set_exception_handler(lambda _loop, context: reported.append(context))
    try:
        node = SimNode("sim-node-09", 1)
        endpoint = StatusEndpoint(node)
        port = await endpoint.start()
        clients = [await asyncio.open_connection("127.0.0.1", port) for _ in range(2)]
        node.inject_status_blocked()
        clients.append(await asyncio.open_connection("127.0.0.1", port))
        await asyncio.sleep(0.2)  # the server has taken all three
        handlers = [t for t in asyncio.all_tasks() if t.get_coro().__qualname__ == "StatusEndpoint._handle"]
        assert len(handlers) == 3
        await endpoint.stop()
        assert all(task.done() and not task.cancelled() for task in handlers)
        await asyncio.sleep(0)
        assert reported == []
        for _, writer in clients:
            writer.close()
    finally:
        loop.set_exception_handler(None)


def test_backdated_jobs_started_earlier():
    node = SimNode("sim-node-09", 1)
    old = node.start_job(0, started_ago_s=3600)
    new = node.start_job(0)
    assert new.start_ticks - old.start_ticks >= 3600 * 100 - 1
    assert node.output_bytes() >= 3600 * 256 * 1024 - 1024 * 1024


async def test_a_phantom_count_stays_after_the_jobs_end_until_the_leader_resets_it(fleet):
    node, leader = fleet.node("sim-node-02"), fleet.node("sim-node-01")
    node.inject_phantom_jobs()
    assert node.running_jobs == 0 and node.counted_jobs == 2
    _, body = await http_get(leader.status_url)
    assert json.loads(body)["peers"]["sim-node-02"] == {"alive": True, "is_voter": True, "selfplay_jobs": 2, "gpu_percent": 0.0}
    reset = json.dumps({"node_id": "sim-node-02"})
    assert node.admin("/admin/reset_node_jobs", None, reset) == 409  # only the leader keeps the counts
    assert leader.admin("/admin/reset_node_jobs", None, "not json") == 400
    assert leader.admin("/admin/reset_node_jobs", None, "{}") == 400
    assert node.counted_jobs == 2
    assert leader.admin("/admin/reset_node_jobs", None, reset) == 200
    assert node.counted_jobs == 0


async def http_get(url: str) -> tuple[int, bytes]:
    async with httpx.AsyncClient() as client:
        answer = await client.get(url)
    return answer.status_code, answer.content


async def test_a_stuck_gpu_outlives_every_signal_until_its_pod_is_restarted_through_runpods_api(fleet, tmp_path):
    """Runbook 003 on a rented pod: the leftover ignores TERM and KILL; the fleet's pods, served as
    RunPod's API, restart the node (everything on it ends) when the real provider code asks."""
    from gpumedic_providers.runpod import RunPodProvider
    from gpumedic_sim.fleet.runpod import RentedFleet

    node = fleet.node("sim-node-02")
    stuck = node.inject_gpu_stuck(0)
    assert node.running_jobs == 0 and node.live_processes() == [stuck]  # the run stopped; only the leftover holds a GPU
    assert interpret(node, f"kill -s KILL {stuck.pid}").exit_status == 0 and node.process(stuck.pid) is not None
    rented = RentedFleet(fleet.nodes, tmp_path / "rented")
    await rented.start()
    provider = RunPodProvider(rented.api.key, image="x", base_url=rented.api.base_url)
    try:
        (pod,) = [w for w in await provider.workers() if w.name == "sim-node-02"]
        await provider.restart(pod.worker_id)
        (after,) = [w for w in await provider.workers() if w.name == "sim-node-02"]
    finally:
        await provider.close()
        await rented.stop()
    assert after.started_at > pod.started_at and after.status == "running"
    assert node.process(stuck.pid) is None and node.compute_pids(0) == []
