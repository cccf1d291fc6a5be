"""NCCL's RAS on the simulated fleet, asked by node-sampler's own client: the whole job seen from
any node, a rank stopped without exiting missing (dead after a minute), JSON from 2.28.7 and text
before, and nothing answering where RAS is off or its port's holder is stopped."""

from __future__ import annotations

import pytest

from gpumedic_sim import SimFleet
from gpumedic_sim.machine.nccl import fabric_address
from node_sampler.ras import ask


@pytest.fixture
async def four(tmp_path):
    fleet = SimFleet(4, 2, tmp_path / "fleet")
    async with fleet:
        yield fleet


async def ask_on(fleet: SimFleet, node_id: str, timeout_s: float = 5.0):
    node = fleet.node(node_id)
    return await ask(node.host, node.ras.port, timeout_s)


@pytest.mark.parametrize("nccl, output", [("2.29.1", "json"), ("2.26.5", "text")])
async def test_a_stopped_rank_is_missing_from_any_other_node_and_dead_after_a_minute(four, nccl, output):
    four.run_job_across(four.node("sim-node-01"), 4, nccl)
    healthy = await ask_on(four, "sim-node-03")
    assert (healthy.output, healthy.nccl_version is not None, healthy.missing, healthy.error) == (output, True, (), None)
    four.hang_job(four.node("sim-node-02"), "rank_stopped", 10.0)
    stopped = next(p for p in four.node("sim-node-02").live_processes(0) if p.job is not None)
    answer = await ask_on(four, "sim-node-04")
    (missing,) = answer.missing
    assert (missing.rank, missing.communicator_size, missing.host, missing.pid, missing.dead) == (
        2, 8, fabric_address("sim-node-02"), stopped.pid, False)
    network = four.node("sim-node-04").ras.network
    network._missing_since[(stopped.job.id, 2)] -= 61  # a minute on
    (missing,) = (await ask_on(four, "sim-node-01")).missing
    assert missing.rank == 2 and missing.dead


async def test_nothing_answers_where_ras_is_off_or_the_ports_holder_is_stopped(four):
    four.run_job_across(four.node("sim-node-01"), 2, None)
    off = await ask_on(four, "sim-node-01")
    assert off.output is None and off.missing == () and off.error.startswith("NCCL RAS on")  # closed, or reset, unanswered
    four.run_job_across(four.node("sim-node-03"), 2, "2.29.1")
    holder = min((p for p in four.node("sim-node-03").live_processes() if p.job is not None), key=lambda p: p.started_at)
    holder.stopped = True
    hung = await ask_on(four, "sim-node-03", timeout_s=0.5)
    assert "did not answer within" in hung.error
    assert (await ask_on(four, "sim-node-04")).missing[0].pid == holder.pid  # its neighbour's RAS names it


async def test_a_lost_gpus_rank_still_answers_ras(four):
    four.run_job_across(four.node("sim-node-01"), 2, "2.29.1")
    four.hang_job(four.node("sim-node-02"), "gpu_lost", 10.0)
    assert (await ask_on(four, "sim-node-01")).missing == ()  # the RAS thread runs on the CPU
