"""The fleet's files (inventory, known_hosts, client key) and its samplers."""

from __future__ import annotations

import asyncio
import stat

import yaml

from gpumedic_sim import SimFleet


async def test_inventory_known_hosts_and_key(fleet):
    text = fleet.inventory_path.read_text()
    inventory = yaml.safe_load(text)
    nodes = inventory["nodes"]
    assert list(nodes) == ["sim-node-01", "sim-node-02"]
    assert inventory["defaults"] == {"price_per_gpu_hour": 2.49, "labels": {"provider": "simulated"}}  # what incidents cost
    for node_id, entry in nodes.items():
        node = fleet.node(node_id)
        assert entry == {"host": "127.0.0.1", "port": node.ssh_port, "user": "gpumedic", "gpus": len(node.gpus)}
    lines = fleet.known_hosts_path.read_text().splitlines()
    assert lines == [fleet.node(n).known_hosts_line() for n in nodes]
    assert lines[0].startswith(f"[127.0.0.1]:{fleet.node('sim-node-01').ssh_port} ssh-ed25519 AAAA")
    assert stat.S_IMODE(fleet.client_key_path.stat().st_mode) == 0o600
    assert fleet.client_key_path.read_text().startswith("-----BEGIN OPENSSH PRIVATE KEY-----")


async def test_every_node_starts_with_one_busy_job_per_gpu(fleet):
    for node in fleet.nodes.values():
        assert node.running_jobs == 2 and node.output_growing
        assert {p.gpu for p in node.live_processes()} == {0, 1}


async def test_samplers_share_one_publish_callable(fleet):
    fleet.node("sim-node-02").inject_zombie(1)
    events = []

    async def publish(event):
        events.append(event)

    task = asyncio.create_task(fleet.run_samplers(publish, interval_s=0.1))
    async with asyncio.timeout(10):
        while {e.node_id for e in events if e.jobs.output_growing is not None} != {"sim-node-01", "sim-node-02"}:
            await asyncio.sleep(0.02)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    last = {e.node_id: e for e in events}
    assert last["sim-node-01"].jobs.running == 2
    assert last["sim-node-02"].gpus[1].utilization_gpu_pct == 0
    assert all(e.errors == () for e in events)
    assert [(f.node_id, f.gpu, f.fault) for f in fleet.injected] == [("sim-node-02", 1, "zombie_job")]


async def test_stop_ends_running_samplers(tmp_path):
    fleet = SimFleet(3, 1, tmp_path, jobs_per_gpu=0)
    await fleet.start()
    assert all(n.running_jobs == 0 for n in fleet.nodes.values())
    task = asyncio.create_task(fleet.run_samplers(lambda e: asyncio.sleep(0), interval_s=0.05))
    await asyncio.sleep(0.1)
    await fleet.stop()
    await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
    assert task.done()


def test_node_ids_widen_for_big_fleets(tmp_path):
    fleet = SimFleet(120, 0, tmp_path)
    assert list(fleet.nodes)[:2] == ["sim-node-001", "sim-node-002"] and "sim-node-120" in fleet.nodes


async def test_a_busy_fleet_runs_the_real_sampler_late_and_bursty_and_its_samples_say_so(fleet):
    """`gpumedic sim --busy`: the samples the real sampler takes on a busy node say how late they
    were, the ticks they missed and the pressure; what the node sends goes out in bursts, in order."""
    from gpumedic_sim.machine.busy import Busy

    arrived: list[tuple[float, object]] = []

    async def publish(event):
        arrived.append((asyncio.get_running_loop().time(), event))

    task = asyncio.create_task(fleet.run_samplers(publish, interval_s=0.1, busy=Busy(late_share=0.5, held_share=0.3, seed=7)))
    async with asyncio.timeout(20):
        while sum(1 for _, e in arrived if getattr(e, "missed_ticks", 0)) < 3 or sum(b.bursts for b in fleet.busy_nodes.values()) < 3:
            await asyncio.sleep(0.05)
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)

    samples = [e for _, e in arrived if e.subject.startswith("gpumedic.v1.node.sampled")]
    assert all(e.host.cpu_pressure is not None and 60.0 <= e.host.cpu_pressure.some_avg10_pct <= 98.0 for e in samples)
    assert all(e.sampler_cpu_pressure is not None for e in samples)
    assert max((e.occurred_at - e.due_at).total_seconds() for e in samples) > 0.05  # woken late
    for node in ("sim-node-01", "sim-node-02"):  # bursts keep each node's order
        taken = [e.occurred_at for e in samples if e.node_id == node]
        assert taken == sorted(taken)
    assert 3 <= sum(e.missed_ticks for e in samples) <= sum(s.skipped_ticks for s in fleet.samplers.values())  # each said in the next sample
