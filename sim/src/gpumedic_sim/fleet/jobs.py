"""Jobs across nodes on the simulated fleet: one training job whose ranks run on several nodes.

`launch` makes the busy job on every GPU of a run of nodes one torchrun job: each process gets
the launcher's variables (`JobEnv`: the run's id, its rank, the world size, the ranks per node,
the node count), as the sampler reads them from /proc/PID/environ on a real node. What happens to
such a job is what happens to a collective: when one rank stops, every other rank waits in it,
its GPU idle and nothing written (`wait`); a checkpoint is rank 0 writing while the rest wait
(`checkpoint`); a job that ends ends on every node (`finish`).
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from node_sampler.jobenv import JobEnv

from gpumedic_sim.faults import DEFAULT_NCCL
from gpumedic_sim.machine.node import SimNode
from gpumedic_sim.machine.parts import SimProcess


@dataclass(frozen=True)
class FleetJob:
    id: str
    """As the sampler reports it: torchelastic:<the run's id>."""
    nodes: tuple[SimNode, ...]

    def ranks(self) -> Iterator[tuple[SimNode, SimProcess]]:
        for node in self.nodes:
            for p in node.live_processes():
                if p.job is not None and p.job.id == self.id:
                    yield node, p


def launch(nodes: Sequence[SimNode], run_id: str, *, nccl: str | None = DEFAULT_NCCL) -> FleetJob:
    """The busy job on each GPU of `nodes` becomes one rank of one job (a job starts where a GPU has
    none), linking NCCL `nccl` (its RAS answers on each node; None: RAS off, or NCCL before 2.24)."""
    per_node = len(nodes[0].gpus)
    job = FleetJob(f"torchelastic:{run_id}", tuple(nodes))
    for i, node in enumerate(nodes):
        node.ras.nccl_version = nccl
        for gpu in range(per_node):
            process = next((p for p in node.live_processes(gpu) if p.is_job), None) or node.start_job(gpu)
            process.job = JobEnv(
                id=job.id, rank=i * per_node + gpu, world_size=per_node * len(nodes), local_world_size=per_node, nodes=len(nodes)
            )
    return job


def wait(job: FleetJob, *, but: SimNode | None = None) -> None:
    """Every rank (but those on `but`, whose own fault is what stopped) waits in the collective: its
    GPU idles, it writes nothing, it still runs and holds its memory."""
    now = time.monotonic()
    for node, p in job.ranks():
        if node is not but:
            p.set_activity(now, producing=False)


def stop_rank(job: FleetJob, node: SimNode) -> None:
    """The rank on `node`'s GPU 0 stops without exiting (SIGSTOP, stuck in the kernel): it holds
    its GPU, idles and answers nothing; no fault of its GPU, NIC or host shows it."""
    now = time.monotonic()
    for where, p in job.ranks():
        if where is node and p.gpu == 0:
            p.stopped = True
            p.set_activity(now, producing=False)


def stopped_without(job: FleetJob, culprit: SimNode) -> bool:
    """Every rank on the other nodes has ended, some of them by a signal from outside (a stop, not
    the job's own end); the node that stopped may hold what no one could stop (a lost GPU's rank)."""
    ranks = [(node, p) for node in job.nodes for p in list(node.processes.values()) if p.job is not None and p.job.id == job.id]
    others = [p for node, p in ranks if node is not culprit]
    return bool(others) and not any(p.alive for p in others) and any(p.killed_by in ("TERM", "KILL") for p in others)


def checkpoint(job: FleetJob) -> None:
    """Rank 0 writes the checkpoint while every other rank waits for it; `resume` ends it."""
    now = time.monotonic()
    for _, p in job.ranks():
        p.set_activity(now, producing=False, checkpointing=p.job is not None and p.job.rank == 0)
        p.paused = True


def resume(job: FleetJob) -> None:
    for node in job.nodes:
        for gpu in range(len(node.gpus)):
            node.resume_job(gpu)


def finish(job: FleetJob) -> None:
    """The job is done: every rank exits 0, on every node."""
    for node in job.nodes:
        for gpu in range(len(node.gpus)):
            node.finish_job(gpu)
