"""A simulated fleet: N nodes with K GPUs each, and the files the control plane needs to reach them.

`start()` brings every node up on loopback and writes, into the work directory, what an operator
would hand the remediator for a real fleet: `inventory.yaml` (where each node's SSH is),
`known_hosts` (each node's own host key, so host keys are verified as in production) and
`client_key` (the one key the fleet accepts). `run_samplers` runs the real node-sampler for every
node through one publish callable, so hundreds of nodes share one NATS connection. `injected`
is the ground truth of scripted faults, to score detection against.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

import asyncssh
from aiohttp import web
from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import Event
from node_sampler.jobenv import JobEnv
from node_sampler.metrics import GpuCollector
from node_sampler.sampler import Sampler
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import Collector

from gpumedic.credentials import write_private
from gpumedic_sim.machine.busy import Busy, BusyNode
from gpumedic_sim.machine.cluster import ELECTION_S, PeerCluster
from gpumedic_sim.machine.nccl import RasNetwork
from gpumedic_sim.machine.node import LOOPBACK, SimNode
from gpumedic_sim.machine.parts import TRAIN_UNIT, SimProcess
from gpumedic_sim.faults import ARGUMENT, CLUSTER, DEFAULT_NCCL, FAULTS, Benign, Fault, InjectedFault, expected

log = logging.getLogger(__name__)

SSH_USER = "gpumedic"

Publish = Callable[[Event], Awaitable[None]]


SIM_GPU_PRICE = 2.49
"""$ per GPU-hour of a simulated node (the inventory's price_per_gpu_hour)."""


def node_ids_for(n_nodes: int) -> list[str]:
    """The ids of a fleet of `n_nodes`: sim-node-01.. (zero-padded to the widest number)."""
    width = max(2, len(str(n_nodes)))
    return [f"sim-node-{i:0{width}d}" for i in range(1, n_nodes + 1)]


RELAUNCH_S = 3.0
"""How long a job's agents take to start it again once restarted on its nodes."""


@dataclass(frozen=True)
class FleetJob:
    """One training job whose ranks run on several nodes. `launch` makes the busy job on every GPU
    of a run of nodes one torchrun job: each process gets the launcher's variables (`JobEnv`: the
    run's id, its rank, the world size, the ranks per node, the node count), as the sampler reads
    them from /proc/PID/environ on a real node. What happens to such a job is what happens to a
    collective: when one rank stops, every other rank waits in it, its GPU idle and nothing written
    (`wait`); a checkpoint is rank 0 writing while the rest wait (`checkpoint`); a job that ends
    ends on every node (`finish`)."""

    id: str
    """As the sampler reports it: torchelastic:<the run's id>."""
    nodes: tuple[SimNode, ...]

    @classmethod
    def launch(cls, nodes: Sequence[SimNode], run_id: str, *, nccl: str | None = DEFAULT_NCCL) -> FleetJob:
        """The busy job on each GPU of `nodes` becomes one rank of one job (a job starts where a GPU has
        none), linking NCCL `nccl` (its RAS answers on each node; None: RAS off, or NCCL before 2.24)."""
        per_node = len(nodes[0].gpus)
        job = cls(f"torchelastic:{run_id}", tuple(nodes))
        for i, node in enumerate(nodes):
            node.ras.nccl_version = nccl
            for gpu in range(per_node):
                process = next((p for p in node.live_processes(gpu) if p.is_job), None) or node.start_job(gpu)
                process.job = JobEnv(
                    id=job.id, rank=i * per_node + gpu, world_size=per_node * len(nodes), local_world_size=per_node, nodes=len(nodes)
                )
        return job

    def ranks(self) -> Iterator[tuple[SimNode, SimProcess]]:
        for node in self.nodes:
            for p in node.live_processes():
                if p.job is not None and p.job.id == self.id:
                    yield node, p

    def wait(self, *, but: SimNode | None = None) -> None:
        """Every rank (but those on `but`, whose own fault is what stopped) waits in the collective: its
        GPU idles, it writes nothing, it still runs and holds its memory."""
        now = time.monotonic()
        for node, p in self.ranks():
            if node is not but:
                p.set_activity(now, producing=False)

    def stop_rank(self, node: SimNode) -> None:
        """The rank on `node`'s GPU 0 stops without exiting (SIGSTOP, stuck in the kernel): it holds
        its GPU, idles and answers nothing; no fault of its GPU, NIC or host shows it."""
        now = time.monotonic()
        for where, p in self.ranks():
            if where is node and p.gpu == 0:
                p.stopped = True
                p.set_activity(now, producing=False)

    def stopped_without(self, culprit: SimNode) -> bool:
        """Every rank on the other nodes has ended, some of them by a signal from outside (a stop, not
        the job's own end); the node that stopped may hold what no one could stop (a lost GPU's rank)."""
        ranks = [(node, p) for node in self.nodes for p in list(node.processes.values()) if p.job is not None and p.job.id == self.id]
        others = [p for node, p in ranks if node is not culprit]
        return bool(others) and not any(p.alive for p in others) and any(p.killed_by in ("TERM", "KILL") for p in others)

    def checkpoint(self) -> None:
        """Rank 0 writes the checkpoint while every other rank waits for it; `resume` ends it."""
        now = time.monotonic()
        for _, p in self.ranks():
            p.set_activity(now, producing=False, checkpointing=p.job is not None and p.job.rank == 0)
            p.paused = True

    def resume(self) -> None:
        for node in self.nodes:
            for gpu in range(len(node.gpus)):
                node.resume_job(gpu)

    def finish(self) -> None:
        """The job is done: every rank exits 0, on every node."""
        for node in self.nodes:
            for gpu in range(len(node.gpus)):
                node.finish_job(gpu)


class SimFleet:
    def __init__(
        self,
        n_nodes: int,
        gpus_per_node: int,
        workdir: Path,
        *,
        jobs_per_gpu: int = 1,
        user: str = SSH_USER,
        listen: str = LOOPBACK,
        host: str | None = None,
        client_key: asyncssh.SSHKey | None = None,
    ) -> None:
        """`jobs_per_gpu` busy jobs start on every GPU (0 for an idle fleet), backdated by
        minutes to hours so start ticks differ as on a fleet that has been running. The nodes
        bind to `listen` and are reached as `host` (default: `listen`); they accept `client_key`
        (default: one generated here, written to `client_key_path`)."""
        if n_nodes < 1:
            raise ValueError("a fleet has at least one node")
        self.workdir = Path(workdir)
        self.user = user
        self.injected: list[InjectedFault] = []
        self.nodes: dict[str, SimNode] = {}
        for node_id in node_ids_for(n_nodes):
            node = SimNode(node_id, gpus_per_node)
            node.listen, node.host = listen, host or listen
            node.fault_listeners.append(self.injected.append)
            for gpu in range(gpus_per_node):
                for _ in range(jobs_per_gpu):
                    node.start_job(gpu, started_ago_s=node.random_age_s(600, 6 * 3600))
            self.nodes[node.node_id] = node
        self.cluster = PeerCluster(list(self.nodes))
        """The peer cluster every node's daemon belongs to; its first node leads."""
        ras = RasNetwork(list(self.nodes.values()))
        for node in self.nodes.values():
            node.cluster = self.cluster
            node.ras.network = ras  # a job's RAS threads reach each other across its nodes
        self.cluster.loads = self._load_of
        self.jobs: list[FleetJob] = []
        """Jobs across nodes, as scripted (job_across_nodes)."""
        self.guests: dict[str, SimNode] = {}
        """Nodes that joined while the fleet runs (rented workers): reachable over SSH, not sampled here."""
        self._listen, self._host = listen, host or listen
        self._own_key = client_key is None
        self.client_key = client_key or asyncssh.generate_private_key("ssh-ed25519")
        self._sampler_tasks: set[asyncio.Task] = set()
        self._timers: set[asyncio.Task] = set()
        self._started = False
        self.gpu_series: dict[str, GpuCollector] = {}
        """Each sampling node's GPU series, as its node-sampler's /metrics serves them."""
        self.samplers: dict[str, Sampler] = {}
        """Each sampling node's sampler (its `skipped_ticks`: the machine running the fleet could not keep up)."""
        self.busy_nodes: dict[str, BusyNode] = {}
        """Each node made busy (`run_samplers(busy=...)`): its late wake-ups and bursts."""
        self._metrics: web.AppRunner | None = None

    def control_plane_env(self) -> dict[str, str]:
        """Where a control plane on this machine finds the fleet: the remediator's inventory, known
        hosts and key, and leader-health's cluster of peers (every node's status URL)."""
        return {
            "GPUMEDIC_REMEDIATOR_INVENTORY": str(self.inventory_path),
            "GPUMEDIC_REMEDIATOR_KNOWN_HOSTS": str(self.known_hosts_path),
            "GPUMEDIC_REMEDIATOR_CLIENT_KEY": str(self.client_key_path),
            "GPUMEDIC_LEADER_CLUSTER": "sim",
            "GPUMEDIC_LEADER_PEERS": json.dumps([n.status_url for n in self.nodes.values()]),
            "GPUMEDIC_LEADER_INVENTORY": str(self.inventory_path),
        }

    @property
    def inventory_path(self) -> Path:
        return self.workdir / "inventory.yaml"

    @property
    def known_hosts_path(self) -> Path:
        return self.workdir / "known_hosts"

    @property
    def client_key_path(self) -> Path:
        return self.workdir / "client_key"

    def node(self, node_id: str) -> SimNode:
        try:
            return self.nodes[node_id]
        except KeyError:
            raise KeyError(f"no node {node_id!r} in the fleet") from None

    def set_leader(self, leader: str | None) -> None:
        """Which node the cluster's peers name as leader; None scripts "no leader"."""
        self.cluster.leader = leader

    async def inject(self, fault: str, node_id: str, gpu: int | None = None, **params: object) -> None:
        """Inject one fault, or script one benign behaviour, by name (the names of `Fault` and
        `Benign`, as scenario files use them), with the table's defaults for parameters not given:
        its entry in `gpumedic_sim.faults.FAULTS` names the stand-in that makes it happen."""
        entry = FAULTS.get(fault)
        if entry is None:
            raise ValueError(f"no fault named {fault!r}")
        node = self.node(node_id)
        arguments = {ARGUMENT.get(name, name): value for name, value in {**entry.params, **params}.items()}
        if entry.by == "fleet":
            done = getattr(self, entry.stand_in)(node, **arguments)
        elif entry.gpu:
            if gpu is None:
                raise ValueError(f"{fault} needs a GPU")
            done = getattr(node, entry.stand_in)(gpu, **arguments)
        else:
            done = getattr(node, entry.stand_in)(**arguments)
        if asyncio.iscoroutine(done):
            await done
        if entry.whole_cluster:
            self.injected.append(InjectedFault(datetime.now(UTC), CLUSTER, None, fault, expected(fault)))

    # The peer cluster's stand-ins: the fleet changes the cluster, and records on the node what it
    # did with that node in mind, except for what is the whole cluster's (recorded on `CLUSTER`).

    def lose_leader(self, node: SimNode) -> None:
        self.cluster.leader = None
        node.record(Fault.NO_LEADER)  # the election is forced on this node, where the incident belongs

    def lose_quorum(self, node: SimNode, for_s: float) -> None:
        self.cluster.quorum_lost = True
        self._later(for_s, lambda: setattr(self.cluster, "quorum_lost", False))

    def split_brain(self, node: SimNode, count: int, for_s: float) -> None:
        cluster = self.cluster
        cluster.rival, cluster.rival_followers = node.node_id, frozenset(self._nodes_from(node.node_id, count))
        self._later(for_s, lambda: setattr(cluster, "rival_followers", frozenset()))

    def flap_leader(self, node: SimNode, every_s: float, for_s: float) -> None:
        self._timers.add(asyncio.create_task(self._flap(for_s, every_s)))

    def partition_peer(self, node: SimNode, for_s: float) -> None:
        others = [n for n in self.nodes if n != node.node_id]
        self.cluster.hidden[node.node_id] = frozenset(others[::2])  # behind NAT: every other peer cannot reach it
        node.record(Fault.PEER_PARTITIONED)
        self._later(for_s, lambda: self.cluster.hidden.pop(node.node_id, None))

    def keep_peers_out(self, node: SimNode, count: int) -> None:
        self.cluster.never_join(self._nodes_from(node.node_id, count))

    def admit_stranger(self, node: SimNode) -> None:
        """A daemon nobody listed joins the cluster (runbook 002's `test`): every member counts it."""
        self.cluster.join("test")

    def hold_election(self, node: SimNode) -> None:
        self.cluster.leader = None
        node.record(Benign.ELECTION)
        self._later(ELECTION_S, lambda: self.cluster.elect(node.node_id))

    def join_peer(self, node: SimNode) -> None:
        self.cluster.join(node.node_id)
        node.record(Benign.PEER_JOINING)

    async def restart_peer(self, node: SimNode, for_s: float) -> None:
        leading = self.cluster.leader == node.node_id
        await node.restart_daemon(for_s)
        if leading:
            self._later(ELECTION_S, self.cluster.elect)

    async def _flap(self, for_s: float, every_s: float) -> None:
        """The leader changes every `every_s` for `for_s`, round the voters."""
        voters = self.cluster.voters
        for turn in range(1, int(for_s // every_s) + 1):
            await asyncio.sleep(every_s)
            self.cluster.elect(voters[turn % len(voters)])

    # Jobs across nodes (`FleetJob`): the fleet launches them, and stops or saves
    # their ranks together, as a collective does.

    def run_job_across(self, node: SimNode, count: int, nccl: str | None) -> None:
        members = [self.nodes[n] for n in self._nodes_from(node.node_id, count)]
        if len(members) < 2:
            raise ValueError(f"a job across nodes needs 2 nodes or more from {node.node_id}; the fleet has {len(members)}")
        if any(self._job_of(n) is not None for n in members):
            raise ValueError(f"{', '.join(m.node_id for m in members)}: a node there runs a job across nodes already")
        self.jobs.append(FleetJob.launch(members, f"train-{node.node_id}", nccl=nccl))
        node.record(Benign.JOB_ACROSS_NODES)

    def hang_job(self, node: SimNode, cause: str, every_s: float) -> None:
        job = self._job_across(node)
        if cause == "gpu_lost":
            node.inject_gpu_lost(0)
            job.wait()
        elif cause == "rank_crash":
            node.inject_segfault(0)
            job.wait()
        elif cause == "rank_stopped":
            job.stop_rank(node)
            job.wait()
        elif cause == "nic_flapping":
            node.inject_nic_flapping(every_s)
            self._later(every_s, job.wait)
        else:
            raise ValueError(f"no cause {cause!r} for job_hung")
        node.record(Fault.JOB_HUNG)
        self._timers.add(asyncio.create_task(self._relaunch_when_restarted(job, node)))

    async def _relaunch_when_restarted(self, job: FleetJob, culprit: SimNode) -> None:
        """The job's agents (torchrun's, a systemd unit on each node) start it again under its run id
        once its ranks were stopped from outside and the agent was restarted on each of its nodes but
        the one that stopped (drained: its rendezvous no longer admits it)."""
        others = [n for n in job.nodes if n is not culprit]
        before = {n.node_id: n.unit_restarts.get(TRAIN_UNIT, 0) for n in others}
        while not (job.stopped_without(culprit) and all(n.unit_restarts.get(TRAIN_UNIT, 0) > before[n.node_id] for n in others)):
            if job not in self.jobs:
                return
            await asyncio.sleep(1.0)
        await asyncio.sleep(RELAUNCH_S)
        self.jobs.remove(job)
        run_id = job.id.removeprefix("torchelastic:")
        self.jobs.append(FleetJob.launch([n for n in job.nodes if n is not culprit], run_id, nccl=culprit.ras.nccl_version))

    def checkpoint_job_across(self, node: SimNode, for_s: float) -> None:
        job = self._job_across(node)
        job.checkpoint()
        node.record(Benign.JOB_CHECKPOINT)
        self._later(for_s, job.resume)

    def end_job_across(self, node: SimNode) -> None:
        job = self._job_across(node)
        node.record(Benign.JOB_ENDS_EVERYWHERE)
        job.finish()
        self.jobs.remove(job)

    def _job_of(self, node: SimNode) -> FleetJob | None:
        return next((job for job in self.jobs if node in job.nodes), None)

    def _job_across(self, node: SimNode) -> FleetJob:
        job = self._job_of(node)
        if job is None:
            raise ValueError(f"{node.node_id} runs no job across nodes (script job_across_nodes first)")
        return job

    def _later(self, delay_s: float, then: Callable[[], object]) -> None:
        async def after() -> None:
            await asyncio.sleep(delay_s)
            then()

        self._timers.add(asyncio.create_task(after()))

    def _nodes_from(self, node_id: str, count: int) -> list[str]:
        """`count` nodes from `node_id` on, in fleet order."""
        ids = list(self.nodes)
        start = ids.index(node_id)
        return ids[start : start + count]

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        public = self.client_key.convert_to_public()
        await asyncio.gather(*(node.start(public) for node in self.nodes.values()))
        self._started = True
        self._write_files()
        log.info("simulated fleet of %d nodes up; inventory in %s", len(self.nodes), self.inventory_path)

    async def admit(self, node: SimNode) -> None:
        """A node that joins while the fleet runs (a rented worker that came up): its SSH started, and
        in the inventory and known_hosts from now on, as a provider's pod is once synced."""
        node.listen, node.host = self._listen, self._host
        await node.start(self.client_key.convert_to_public())
        self.guests[node.node_id] = node
        self._write_inventory()

    async def dismiss(self, node_id: str) -> None:
        """A joined node that is gone (a worker ended): out of the inventory, its SSH stopped."""
        node = self.guests.pop(node_id, None)
        if node is not None:
            self._write_inventory()
            await node.stop()

    async def stop(self) -> None:
        if self._metrics is not None:
            await self._metrics.cleanup()
            self._metrics = None
        await stop_tasks(self._sampler_tasks | self._timers)
        await asyncio.gather(*(node.stop() for node in (*self.nodes.values(), *self.guests.values())), return_exceptions=True)
        self.guests.clear()
        self._started = False

    async def run_samplers(self, publish: Publish, interval_s: float = 5.0, *, busy: Busy | None = None) -> None:
        """Run the real node-sampler for every node until cancelled (or `stop()`); with `busy`, on
        nodes whose job keeps every CPU busy (`gpumedic_sim.machine.busy`).

        The nodes' start times are spread over one interval, as real nodes booted at different
        moments would be, so the bus sees a steady stream rather than a burst per interval.
        """
        if not self._started:
            raise RuntimeError("start the fleet first")
        nodes = list(self.nodes.values())
        tasks = [
            asyncio.create_task(self._sample(node, publish, interval_s, i * interval_s / len(nodes), busy),
                                name=f"sampler-{node.node_id}")
            for i, node in enumerate(nodes)
        ]
        self._sampler_tasks.update(tasks)
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            self._sampler_tasks.difference_update(tasks)

    def _load_of(self, node_id: str) -> tuple[int | None, float] | None:
        node = self.nodes.get(node_id)
        return None if node is None else (node.counted_jobs, node.gpu_percent())

    async def __aenter__(self) -> SimFleet:
        await self.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.stop()

    async def _sample(self, node: SimNode, publish: Publish, interval_s: float, offset_s: float, busy: Busy | None) -> None:
        pressed = busy.of(node.node_id, interval_s) if busy is not None else None
        if pressed is not None:
            self.busy_nodes[node.node_id] = pressed
        link = pressed.link(publish) if pressed is not None else publish

        async def publish_unless_silent(event) -> None:
            if not node.sampler_silent:  # a hung sampler: nothing leaves the node
                await link(event)

        await asyncio.sleep(offset_s)
        sampler = self.samplers[node.node_id] = node.sampler(interval_s, busy=pressed)
        self.gpu_series[node.node_id] = GpuCollector.of(sampler, node.node_id)
        await sampler.run(publish_unless_silent)

    async def serve_metrics(self, host: str = LOOPBACK, port: int = 0) -> str:
        """Serve every node's GPU series as its node-sampler would (dcgm-exporter's names, `Hostname`
        the node id), all on one /metrics, for a Prometheus beside the demo; its `host:port`."""
        registry = CollectorRegistry()
        registry.register(_Merged(self.gpu_series))

        async def metrics(request: web.Request) -> web.Response:
            return web.Response(body=generate_latest(registry), headers={"Content-Type": CONTENT_TYPE_LATEST})

        app = web.Application()
        app.add_routes([web.get("/metrics", metrics)])
        self._metrics = web.AppRunner(app, access_log=None)
        await self._metrics.setup()
        await web.TCPSite(self._metrics, host, port).start()
        bound_host, bound_port = self._metrics.addresses[0][:2]
        return f"{bound_host}:{bound_port}"

    def _write_inventory(self) -> None:
        """The inventory and known_hosts, each replaced whole: the remediator reads them on every action."""
        # a simulated H100 at an on-demand price, so incidents on it have a cost to show
        lines = [f"defaults: {{price_per_gpu_hour: {SIM_GPU_PRICE}, labels: {{provider: simulated}}}}", "nodes:"]
        everyone = [*self.nodes.values(), *self.guests.values()]
        for node in everyone:
            lines.append(f"  {node.node_id}: {{host: {node.host}, port: {node.ssh_port}, user: {self.user}, gpus: {len(node.gpus)}}}")
        _replace(self.inventory_path, "\n".join(lines) + "\n")
        _replace(self.known_hosts_path, "".join(f"{n.known_hosts_line()}\n" for n in everyone))

    def _write_files(self) -> None:
        self._write_inventory()
        if self._own_key:  # a key handed in stays where its owner keeps it
            write_private(self.client_key_path, self.client_key.export_private_key())
        (self.workdir / "client_key.pub").write_bytes(self.client_key.export_public_key())


def _replace(path: Path, text: str) -> None:
    """Write `text` to `path` at once: a reader sees the old file or the new one, never half of one."""
    part = path.with_name(f".{path.name}.part")
    part.write_text(text)
    os.replace(part, path)


class _Merged(Collector):
    """Several nodes' collectors as one: each series once, with every node's samples."""

    def __init__(self, collectors: dict[str, Collector]) -> None:
        self.collectors = collectors

    def collect(self):
        merged: dict[str, Metric] = {}
        for collector in list(self.collectors.values()):
            for metric in collector.collect():
                into = merged.setdefault(metric.name, Metric(metric.name, metric.documentation, metric.type))
                into.samples.extend(metric.samples)
        yield from merged.values()
