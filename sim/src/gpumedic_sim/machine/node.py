"""A simulated GPU node: the state, plus everything a real node answers on.

Below the node-sampler it stands where NVML, /proc, the host, the kernel log and the Docker
engine would be (`nvml()`, `process_table()`, `host`, a FIFO in /dev/kmsg's format, an engine
speaking the Docker API on a unix socket); on the network it runs an SSH server and a peer
status endpoint on loopback. The real sampler with all its watchers, the real remediator and
the real leader-health probe all run unchanged against it.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import sqlite3
import tempfile
import time
from pathlib import Path

import asyncssh
import node_sampler
from node_sampler.checks import CheckScripts
from node_sampler.files import ExpectedFiles
from node_sampler.logwatch import LogPattern, LogPatterns
from node_sampler.jobs import JobProbe, OutputGrowthProbe, RowGrowthProbe, StatusEndpointProbe
from node_sampler.listen import ListenQueue
from node_sampler.ras import RasWatch
from node_sampler.sampler import Sampler

from gpumedic_sim.machine.busy import BusyNode
from gpumedic_sim.machine.docker import SimDockerEngine
from gpumedic_sim.machine.kernel import SimKernelLog
from gpumedic_sim.machine.nccl import RasEndpoint
from gpumedic_sim.machine.nvml import SimNvml
from gpumedic_sim.machine.procs import SimContainerCgroups, SimProcessTable
from gpumedic_sim.machine.ssh import SshEndpoint
from gpumedic_sim.faults import Benign, Fault
from gpumedic_sim.machine.parts import JOB_MEMORY_MIB, SimProcess
from gpumedic_sim.machine.scripted import ScriptedFaults
from gpumedic_sim.machine.state import NodeState
from gpumedic_sim.machine.status import StatusEndpoint

LOOPBACK = "127.0.0.1"
EXAMPLE_CHECKS = Path(node_sampler.__file__).with_name("example_checks")
MODEL = Path("/models/selfplay-canonical.safetensors")
MODEL_BYTES = bytes(range(256)) * 256
"""The model every simulated node must have: 64 KiB, the same on every node."""
CHECKPOINTS = Path("/data/checkpoints")
"""Where the node's job keeps its network's checkpoint: runbook 002's own check (node-sampler's
shipped `nn-checkpoint`) looks there, the one operator's check every simulated node runs."""
OPERATOR_CHECKS = ("nn-checkpoint",)


def checks_every_s(interval_s: float) -> float:
    """How often a simulated node runs its checks: every two samples, but not more often than every
    10 s (a test's fleet samples every 0.2 s, and a shell per node five times a second is load no
    node has)."""
    return max(2 * interval_s, 10.0)


GAMES = Path("/data/games/selfplay.db")
"""Runbook 000's game database (`SELECT COUNT(*) FROM games`), under the node's root: a job that
records its games here writes rows into the database's free pages, so the file does not grow."""
GAMES_EVERY_S = 0.5
"""How often a job that records games adds one."""
GAME_PAGE_BYTES = 4096
"""What one game dirties in the database (a page): the job's /proc/PID/io counts it, the file's size does not."""
ROWS_HANG_AFTER_S = 20.0
"""How long the job of the rows_stopped fault records games before it hangs."""
WORKER_LOG = Path("/var/log/selfplay-worker.log")
WORKER_ERRORS = LogPattern(
    name="worker-errors", regex="Authentication failed|Failed to reset orphaned tasks|SSH connection failed", sources=(str(WORKER_LOG),)
)
"""Runbook 001's recurring error patterns, counted in the worker's log: the operator's one log pattern on every simulated node."""
BARE_OOM_AFTER_S = 15.0
"""How long a job launched on the host runs before the OOM killer ends it: a few samples see it on its GPU."""


class ScriptedNode(ScriptedFaults, NodeState):
    """A node's truth with its scripted faults, and no servers: what a test of one interface needs."""


class SimNode(ScriptedNode):
    """`SimNode("sim-node-01", gpus=8)`: a node with 8 idle GPUs; `start_job(gpu)` to load one."""

    def __init__(self, node_id: str, gpus: int, *, seed: int | None = None) -> None:
        super().__init__(node_id, gpus, seed=seed)
        self.host = LOOPBACK
        """The name the control plane reaches this node by (its inventory's host, its status URL)."""
        self.listen = LOOPBACK
        """The address its SSH and status servers bind to (0.0.0.0 where the fleet runs in a container)."""
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._ssh = SshEndpoint(self, self.host_key)
        self._status = StatusEndpoint(self)
        self.ras = RasEndpoint(self)
        """NCCL's RAS client port, answering for the jobs across nodes whose ranks run here."""
        self._restarts: set[asyncio.Task] = set()
        self.on_daemon_start = self._listen_again
        self._docker: SimDockerEngine | None = None
        self._rundir: Path | None = None
        """Where the node's kernel-log FIFO and engine socket live: short, under /tmp, since a
        unix socket path may not exceed 107 bytes."""

    @property
    def model_path(self) -> Path | None:
        """The model every node must have, where this node keeps it: the same bytes on every node, and
        the same path as the node names it (`MODEL`, under the node's own root: its run directory)."""
        return self._rundir / MODEL.relative_to("/") if self._rundir else None

    @property
    def checkpoint_dir(self) -> Path | None:
        return self._rundir / CHECKPOINTS.relative_to("/") if self._rundir else None

    @property
    def file_root(self) -> Path | None:
        """Where the node's own files are (its run directory stands for its /)."""
        return self._rundir

    @property
    def games_db(self) -> Path | None:
        return self._rundir / GAMES.relative_to("/") if self._rundir else None

    @property
    def worker_log(self) -> Path | None:
        return self._rundir / WORKER_LOG.relative_to("/") if self._rundir else None

    @property
    def kernel_log_path(self) -> Path | None:
        return self._rundir / "kmsg" if self._rundir else None

    @property
    def docker_socket(self) -> Path | None:
        return self._rundir / "docker.sock" if self._rundir else None

    @property
    def ssh_port(self) -> int | None:
        return self._ssh.port

    @property
    def status_port(self) -> int | None:
        return self._status.port

    @property
    def status_url(self) -> str:
        if self._status.port is None:
            raise RuntimeError(f"{self.node_id} is not started")
        return f"http://{self.host}:{self._status.port}/status"

    def known_hosts_line(self) -> str:
        """This node's line in a known_hosts file (non-22 ports are written `[host]:port`)."""
        key_type, key_data = self.host_key.export_public_key("openssh").decode().split()[:2]
        return f"[{self.host}]:{self.ssh_port} {key_type} {key_data}"

    async def start(self, client_public_key: asyncssh.SSHKey) -> None:
        """Start the SSH server (accepting `client_public_key` for any user) and the status endpoint."""
        await self._ssh.start(client_public_key, self.listen)
        await self._status.start(self.listen)
        await self.ras.start(self.listen)
        self._rundir = Path(tempfile.mkdtemp(prefix="gpumedic-sim-"))
        self.model_path.parent.mkdir(parents=True)
        self.model_path.write_bytes(MODEL_BYTES)
        self.checkpoint_dir.mkdir(parents=True)
        (self.checkpoint_dir / "selfplay-latest.pt").write_bytes(MODEL_BYTES)
        self.worker_log.parent.mkdir(parents=True)
        self.worker_log.write_text("INFO worker started\n")
        checks = self._rundir / "checks"  # the operator's checks, as a node keeps them: root's, writable by nobody else
        checks.mkdir(mode=0o755)
        for name in OPERATOR_CHECKS:
            shutil.copyfile(EXAMPLE_CHECKS / name, checks / name)
            (checks / name).chmod(0o755)
        _games_with_free_pages(self.games_db)
        self.kernel = SimKernelLog(self._rundir / "kmsg")
        self._docker = SimDockerEngine(self, self._rundir / "docker.sock")
        await self._docker.start()
        self._keep(self._record_games())

    async def _record_games(self) -> None:
        """The jobs that record games as rows add one each, while they compute (or in a CPU phase)."""
        games = sqlite3.connect(self.games_db, check_same_thread=False)
        try:
            while True:
                await asyncio.sleep(GAMES_EVERY_S)
                with self._lock:
                    playing = [p for pid, cpu in self.row_writers.items()
                               if (p := self.processes.get(pid)) is not None and p.alive and (cpu or p.producing)]
                    for p in playing:
                        p.rows_bytes += GAME_PAGE_BYTES
                if playing:
                    with games:
                        games.executemany("INSERT INTO games (played_at) VALUES (?)", [(time.time(),)] * len(playing))
        finally:
            games.close()

    def _keep(self, coroutine) -> None:
        task = asyncio.get_running_loop().create_task(coroutine)
        self._restarts.add(task)
        task.add_done_callback(self._restarts.discard)

    def inject_rows_stopped(self, gpu: int) -> None:
        """The job on `gpu` records its games as rows in the node's database (its output grows no
        file), and ROWS_HANG_AFTER_S later hangs: its GPU idles and no row is added."""
        job = self._job_on(gpu) or self.start_job(gpu)
        with self._lock:
            self.row_writers[job.pid] = False
        self._record(gpu, Fault.ROWS_STOPPED)
        asyncio.get_running_loop().call_later(ROWS_HANG_AFTER_S, self._hang_quietly, job)

    def _hang_quietly(self, job: SimProcess) -> None:
        with self._lock:
            if job.alive:
                job.set_activity(time.monotonic(), producing=False)

    def rows_cpu_phase(self, gpu: int, for_s: float = 60.0) -> None:
        """The job on `gpu` records its games as rows and spends `for_s` in a CPU phase: its GPU
        idles while games still go into the database's free pages (no byte grows), then it computes again."""
        job = self._job_on(gpu) or self.start_job(gpu)
        with self._lock:
            self.row_writers[job.pid] = True
            job.set_activity(time.monotonic(), producing=False)
            job.paused = True
        self.record(Benign.ROWS_IN_FREE_PAGES)
        asyncio.get_running_loop().call_later(for_s, self.resume_job, gpu)

    def inject_model_missing(self) -> None:
        """The node's copy of the model every node must have is gone."""
        if self.model_path is not None:
            self.model_path.unlink(missing_ok=True)
        self._record(None, Fault.MODEL_MISSING)

    def inject_check_failing(self) -> None:
        """The job's checkpoint directory is emptied: the operator's check of it says 'problem'."""
        for path in self._checkpoints():
            path.unlink(missing_ok=True)
        self._record(None, Fault.CHECK_FAILING)

    def unset_checkpoints(self) -> None:
        """The node is not set up for the job: no checkpoint directory, so the check cannot tell (exit 2)."""
        if self.checkpoint_dir is not None:
            shutil.rmtree(self.checkpoint_dir, ignore_errors=True)
        self.record(Benign.CHECK_UNKNOWN)

    def rewrite_checkpoint(self, for_s: float = 6.0) -> None:
        """The job saves its checkpoint anew: the old one is gone for `for_s` before the new one is there."""
        for path in self._checkpoints():
            path.unlink(missing_ok=True)
        asyncio.get_running_loop().call_later(for_s, self._write_checkpoint)
        self.record(Benign.CHECKPOINT_REWRITTEN)

    def _checkpoints(self) -> list[Path]:
        return list(self.checkpoint_dir.iterdir()) if self.checkpoint_dir is not None and self.checkpoint_dir.is_dir() else []

    def _write_checkpoint(self) -> None:
        if self.checkpoint_dir is not None and self.checkpoint_dir.is_dir():
            (self.checkpoint_dir / "selfplay-latest.pt").write_bytes(MODEL_BYTES)

    def inject_log_errors(self, count: int = 5) -> None:
        """The node's worker logs `count` lines of runbook 001's recurring errors at once."""
        errors = ("ERROR SSH connection failed: worker gpu-7 did not answer in 30s", "ERROR Failed to reset orphaned tasks: 3 tasks")
        self._log([errors[i % 2] for i in range(count)])
        self._record(None, Fault.LOG_ERRORS)

    def log_error_once(self) -> None:
        """The worker logs one such error among its ordinary lines: below the pattern's count."""
        self._log(["INFO claimed task 4711", "WARN Authentication failed once, retrying with the refreshed key"])
        self.record(Benign.LOG_ERROR_ONCE)

    def _log(self, lines: list[str]) -> None:
        if self.worker_log is not None:
            with self.worker_log.open("a") as f:
                f.writelines(f"{line}\n" for line in lines)

    def inject_nic_down(self, after: float = 15.0) -> None:
        """The node's fabric (four InfiniBand ports, up) loses mlx5_1 `after` seconds on: a cable pulled."""
        self.machine.fabric()["mlx5_1"].down_at = time.monotonic() + after
        self._record(None, Fault.NIC_DOWN)

    def inject_nic_flapping(self, every_s: float = 20.0) -> None:
        """mlx5_2 of the node's fabric goes down and back every `every_s` seconds from now, counting errors."""
        port = self.machine.fabric()["mlx5_2"]
        port.flaps_from, port.flap_every_s = time.monotonic() + every_s, every_s
        self._record(None, Fault.NIC_FLAPPING)

    def cable_one_port_less(self) -> None:
        """The node's fabric has a port nobody cabled (mlx5_3: DOWN, Disabled, from the start); the rest are up."""
        self.machine.fabric()["mlx5_3"].never_up = True
        self.record(Benign.UNCABLED_PORT)

    async def inject_daemon_down(self) -> None:
        """The peer daemon crashes: its status port refuses connections until its unit restarts."""
        await self._status.stop()
        self.listens_on_restart = True
        self.cluster.leave(self.node_id)
        self._record(None, Fault.DAEMON_DOWN)

    async def inject_status_backlog(self) -> None:
        """The peer daemon's event loop blocks before it accepts: connections pile up in its port's
        queue (runbook 002's "connection backlog grows") until its unit restarts."""
        await self._status.stop_accepting(self.listen)
        self.status_blocked = self.listens_on_restart = True
        self.cluster.leave(self.node_id)
        self._record(None, Fault.STATUS_BACKLOG)

    async def restart_daemon(self, down_s: float) -> None:
        """A planned restart of the peer daemon: its port refuses for `down_s`, then it listens
        again and rejoins the cluster."""
        await self._status.stop()
        self.cluster.leave(self.node_id)
        self.record(Benign.PLANNED_RESTART)

        async def back() -> None:
            await asyncio.sleep(down_s)
            await self._status.start(self.listen, self._status.port or 0)
            self.cluster.join(self.node_id)

        self._keep(back())

    def inject_bare_oom_kill(self, gpu: int) -> SimProcess:
        """The GPU's job runs on the host itself, outside any container (a launcher's bare `python`),
        and `BARE_OOM_AFTER_S` on the host's OOM killer ends it: exit -9, and the kernel's lines are
        all that tell (runbook 002's jobs "failing with exit code -9")."""
        self._check_gpu(gpu)
        with self._lock:
            if (old := self._job_on(gpu)) is not None:
                self._end(old, exit_code=0)  # its containerised run ended well; the next runs on the host
            bare = self._spawn(("python", "selfplay.py", "--gpu", str(gpu)), gpu, JOB_MEMORY_MIB, is_job=True, producing=True)
        self._record(gpu, Fault.BARE_OOM_KILL)
        asyncio.get_running_loop().call_later(BARE_OOM_AFTER_S, self._killed_by_host_oom, bare)
        return bare

    def _killed_by_host_oom(self, p: SimProcess) -> None:
        if p.alive:
            if self.kernel is not None:
                self.kernel.oom_kill(p.pid, p.comm, 1000, "", 31_457_280)
            self._end(p, exit_code=137)

    def dip_job(self, gpu: int, for_s: float) -> None:
        """The job on `gpu` stops computing for `for_s`, then goes on."""
        self.pause_job(gpu, checkpointing=False)
        asyncio.get_running_loop().call_later(for_s, self.resume_job, gpu)

    def checkpoint_job(self, gpu: int, for_s: float) -> None:
        """The GPU idles for `for_s` while the job writes a checkpoint (its output grows), then it goes on."""
        self.pause_job(gpu, checkpointing=True)
        asyncio.get_running_loop().call_later(for_s, self.resume_job, gpu)

    def _listen_again(self) -> None:
        self._keep(self._status.start(self.listen, self._status.port or 0))

    async def stop(self) -> None:
        for task in list(self._restarts):
            task.cancel()
        await self._ssh.stop()
        await self._status.stop()
        await self.ras.stop()
        if self._docker is not None:
            await self._docker.stop()
            self._docker = None
        if self.kernel is not None:
            self.kernel.close()
            self.kernel = None
        if self._rundir is not None:
            shutil.rmtree(self._rundir, ignore_errors=True)
            self._rundir = None

    async def inject_ssh_refuses(self) -> None:
        """sshd goes down: the node's SSH port refuses connections."""
        await self._ssh.refuse()
        self._record(None, Fault.SSH_REFUSES)

    async def inject_ssh_hangs(self) -> None:
        """sshd wedges: the port accepts TCP and never answers."""
        await self._ssh.hang(self.listen)
        self._record(None, Fault.SSH_HANGS)

    # --- the node-sampler's sources --------------------------------------------------------

    def nvml(self) -> SimNvml:
        return SimNvml(self)

    def process_table(self) -> SimProcessTable:
        return SimProcessTable(self)

    def probes(self, *, status_timeout_s: float = 2.0) -> list[JobProbe]:
        """What a real node's sampler would be configured with: the status endpoint's job
        count, and output growth (measured on the simulated output instead of on disk)."""
        return [
            StatusEndpointProbe(self.status_url, "selfplay_jobs", timeout_s=status_timeout_s),
            OutputGrowthProbe(lambda: (self.output_bytes(), [])),
            *([RowGrowthProbe([(self.games_db, "games")])] if self.games_db is not None else []),
        ]

    def sampler(self, interval_s: float = 5.0, probes: list[JobProbe] | None = None, busy: BusyNode | None = None) -> Sampler:
        """The real node-sampler's Sampler over this node, with every source and watcher a real
        node's has (the kernel log, the engine and NCCL's RAS only once the node has started). RAS
        is asked at the pace of the sampling (the detector's windows are scaled to it too). With
        `busy`, the node's CPUs are taken by its job: the sampler wakes late and its pressure shows."""
        return Sampler(
            self.node_id,
            self.nvml(),
            self.process_table(),
            self.probes() if probes is None else probes,
            interval_s,
            host=busy.host(self.machine) if busy is not None else self.machine,
            holder_scan_interval_s=interval_s,
            xid_events=True,
            kernel_log=self.kernel_log_path,
            docker_socket=self.docker_socket,
            ras=RasWatch(self.host, self.ras.port, after_s=3 * interval_s, every_s=2 * interval_s, timeout_s=max(2.0, interval_s))
            if self.ras.port is not None else None,
            files=ExpectedFiles([MODEL], root=self._rundir) if self._rundir is not None else None,
            checks=CheckScripts(self._rundir / "checks", interval_s=checks_every_s(interval_s), timeout_s=10.0, root=self._rundir)
            if self._rundir is not None else None,
            logs=LogPatterns([WORKER_ERRORS], interval_s=interval_s, root=self._rundir) if self._rundir is not None else None,
            listen=ListenQueue(self._status.port) if self._status.port else None,
            cgroups=SimContainerCgroups(self),
            **({"sleep": busy.sleep, "own_pressure": busy.pressure} if busy is not None else {}),
        )


def _games_with_free_pages(path: Path) -> None:
    """The games database as a long-running job leaves it: its old games deleted, so new ones go
    into free pages and the file keeps its size."""
    path.parent.mkdir(parents=True)
    with contextlib.closing(sqlite3.connect(path)) as games, games:
        games.execute("CREATE TABLE games (id INTEGER PRIMARY KEY, played_at REAL NOT NULL)")
        games.executemany("INSERT INTO games (played_at) VALUES (?)", [(0.0,)] * 4000)
        games.execute("DELETE FROM games")
