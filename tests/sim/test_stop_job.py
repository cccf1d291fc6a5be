"""stop_job over real SSH on the simulated fleet: a hung job's ranks stopped on every node of the
job (a stopped rank, whose SIGTERM waits, by SIGKILL after the grace), and nothing stopped when a
rank's GPU works again or a node other than the one that stopped does not answer."""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid

import pytest

from gpumedic_events import ActionOutcome, ActionRequested, RankTarget, RestartJob, StopJob
from gpumedic_incidents.policy import Actions, JobRestart, RestartJobPolicy
from gpumedic_nodes.ssh import SshExecutor
from gpumedic_sim import SimFleet
from remediator import catalogue
from remediator.catalogue.base import Means, Node


@pytest.fixture
async def four(tmp_path):
    fleet = SimFleet(4, 2, tmp_path / "fleet")
    async with fleet:
        fleet.run_job_across(fleet.node("sim-node-01"), 4, "2.29.1")
        yield fleet


def stop_of(fleet: SimFleet) -> StopJob:
    (job,) = fleet.jobs
    return StopJob(job=job.id, grace_s=1.0, max_gpu_utilization_pct=4, ranks=tuple(
        RankTarget(node_id=node.node_id, gpu_index=p.gpu, pid=p.pid, start_ticks=p.start_ticks, command=p.command)
        for node, p in job.ranks()))


TRAIN = Actions(restart_job=RestartJobPolicy(jobs={"train": JobRestart(unit="train.service")}))


async def perform(fleet: SimFleet, operation: StopJob | RestartJob, on: str = "sim-node-03"):
    executor = SshExecutor(inventory=fleet.inventory_path, known_hosts=fleet.known_hosts_path, client_key=fleet.client_key_path,
                           connect_timeout_s=2.0, command_timeout_s=5.0)
    request = ActionRequested(source="zombie-detector", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=on, attempt=1,
                              operation=operation, reason="job_hung")

    @contextlib.asynccontextmanager
    async def node(at: str | None = None):
        async with executor.session(at or on) as session:
            yield Node(session.run, 3.0, asyncio.sleep, time.monotonic)

    return await catalogue.perform(operation, Means(actions=TRAIN, node=node, request=request))


def alive(fleet: SimFleet) -> list[int]:
    return [p.pid for _, p in fleet.jobs[0].ranks()]


async def test_every_rank_is_stopped_the_stopped_one_by_sigkill(four):
    four.hang_job(four.node("sim-node-03"), "rank_stopped", 10.0)
    stopped = next(p for p in four.node("sim-node-03").live_processes(0) if p.job is not None)
    result = await perform(four, stop_of(four))
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert alive(four) == [] and stopped.killed_by == "KILL"
    assert result.detail.startswith(f"stopped the job {four.jobs[0].id}'s ranks on 4 of 4 node(s): sim-node-01: 2 GPU(s)' ranks gone on SIGTERM;")
    assert f"sim-node-03: 1 GPU(s)' ranks gone on SIGTERM | GPU 0: sent TERM to {stopped.pid}; sent KILL after 1s to {stopped.pid}" in result.detail


async def test_the_stopped_job_starts_again_without_the_node_that_stopped_once_its_agents_restarted_on_the_others(four):
    four.hang_job(four.node("sim-node-03"), "rank_stopped", 10.0)
    assert (await perform(four, stop_of(four))).outcome is ActionOutcome.SUCCEEDED
    others = ("sim-node-01", "sim-node-02", "sim-node-04")
    result = await perform(four, RestartJob(job="train", nodes=others))
    assert result.outcome is ActionOutcome.SUCCEEDED and result.detail == "the job train started on 3 of 3 node(s)", result.detail
    for _ in range(50):
        if four.jobs and alive(four):
            break
        await asyncio.sleep(0.2)
    (job,) = four.jobs
    assert tuple(n.node_id for n in job.nodes) == others and {p.job.world_size for _, p in job.ranks()} == {6}
    # a node that does not answer: the rest still start, and the restart says where it did not
    await four.node("sim-node-02").inject_ssh_refuses()
    result = await perform(four, RestartJob(job="train", nodes=others))
    assert result.outcome is ActionOutcome.FAILED and result.detail.startswith("the job train started on 2 of 3 node(s); not on sim-node-02: ")


async def test_a_rank_working_again_stops_nothing(four):
    four.hang_job(four.node("sim-node-03"), "rank_stopped", 10.0)
    operation = stop_of(four)
    back = next(p for p in four.node("sim-node-04").live_processes(1) if p.job is not None)
    back.set_activity(time.monotonic(), producing=True)  # the job came back on one rank: it is not hung
    result = await perform(four, operation)
    assert result.outcome is ActionOutcome.BLOCKED and "sim-node-04: refused: GPU 1 is busy again" in result.detail
    assert len(alive(four)) == 8


async def test_another_node_that_does_not_answer_stops_nothing_and_the_one_that_stopped_is_left_alone(four):
    four.hang_job(four.node("sim-node-03"), "rank_stopped", 10.0)
    operation = stop_of(four)
    await four.node("sim-node-02").inject_ssh_refuses()
    result = await perform(four, operation)
    assert result.outcome is ActionOutcome.FAILED and result.detail.startswith("sim-node-02 does not answer")
    assert len(alive(four)) == 8
    # the node that stopped is the incident's: unreachable, its ranks are left, the rest stopped
    result = await perform(four, stop_of(four), on="sim-node-02")
    assert result.outcome is ActionOutcome.SUCCEEDED, result.detail
    assert "sim-node-02: not reached" in result.detail and "on 3 of 4 node(s)" in result.detail
    assert sorted(alive(four)) == sorted(p.pid for p in four.node("sim-node-02").live_processes() if p.job is not None)


def test_a_rank_listed_twice_or_without_its_identity_is_refused_before_anything_runs():
    rank = RankTarget(node_id="n1", gpu_index=0, pid=4242, start_ticks=9, command="python train.py")
    with pytest.raises(catalogue.InvalidParameter, match="listed twice"):
        catalogue.render(StopJob(job="slurm:7", ranks=(rank, rank), max_gpu_utilization_pct=4))
    with pytest.raises(catalogue.InvalidParameter, match="without its start time"):
        catalogue.render(StopJob(job="slurm:7", ranks=(rank.model_copy(update={"start_ticks": None}),), max_gpu_utilization_pct=4))
