"""The simulated node's in-memory truth: GPUs, processes, jobs, and the faults scripted into them.

Everything a real node would show through NVML, /proc, its status endpoint and its shell is
derived from this one state, so a kill sent over SSH is seen by the next sample exactly as on a
real node. The sampler reads it from a worker thread while SSH commands change it on the event
loop, hence the lock.
"""

from __future__ import annotations

import os
import queue
import random
import threading
import json
import time
import uuid
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Literal

from node_sampler.jobenv import JobEnv

from gpumedic_sim.machine.cluster import PeerCluster
from gpumedic_sim.faults import Benign, Fault, InjectedFault, expected
from gpumedic_sim.machine.host import SimHost
from gpumedic_sim.machine.kernel import SimKernelLog

CLK_TCK = 100
"""Clock ticks per second, as on Linux (sysconf(_SC_CLK_TCK)); start_ticks are in these."""
GPU_NAME = "Simulated H100 80GB"
GPU_TOTAL_MIB = 81559
JOB_MEMORY_MIB = 20480
ORPHAN_MEMORY_MIB = 8192
OUTPUT_BYTES_PER_S = 256 * 1024
"""How fast a producing job's output grows (games, checkpoints)."""
BOOTED_AGO_S = 3 * 86_400
SAMPLER_UNIT = "gpumedic-node-sampler.service"
PEER_UNIT = "selfplay-p2p.service"
"""The peer daemon that serves the node's /status: restarting it unblocks a blocked event loop."""
JOB_UNIT = "selfplay.service"
"""The node's job launcher: restarting it starts a job on every GPU that has none."""
TRAIN_UNIT = "train.service"
"""The node's agent of jobs across nodes (torchrun's): a stopped job starts again once every node
of it but the one that stopped restarted it (`gpumedic_sim.fleet`)."""
UNITS = frozenset({SAMPLER_UNIT, PEER_UNIT, JOB_UNIT, TRAIN_UNIT, "docker.service", "ssh.service"})
"""The systemd services a simulated node has."""


DEVICE_BUSY = "RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable"
CUDA_OOM = (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity "
    "of 79.19 GiB of which 1.06 GiB is free."
)


STUCK_AGE_S = 3 * 3600.0
"""A stuck process's age: past the runbook's 2 hours."""
STATUS_LAG_S = 6.0
"""A slow daemon's lag: past the runbook's 5 s, within leader-health's 10 s HTTP timeout."""


APPLICATION_XIDS = frozenset({13, 31, 43, 45})
"""XIDs NVIDIA documents as the application's fault (a bad kernel, a page fault, a job stopped),
not the GPU's: one of these on a healthy GPU is no node fault."""
CHECKPOINT_SIGNALS = frozenset({"USR1", "USR2", "INT"})
"""Signals a job may handle to checkpoint; without a handler their default ends the process."""
SIGNAL_NUMBERS = {"INT": 2, "USR1": 10, "USR2": 12, "TERM": 15}
ADMIN_PATHS = frozenset({"/force_election", "/admin/reset_node_jobs"})
"""The runbooks' daemon's admin endpoints (`curl -X POST http://localhost:8770/force_election`),
which a simulated node's daemon offers on its status port."""
REMAP_XIDS = frozenset({48, 63, 94, 95})
"""Uncorrectable memory errors after which, on Ampere and later, a row remap waits for a GPU reset."""

NVLINKS = 18
"""An H100 SXM's NVLinks."""


@dataclass
class SimNvLink:
    """One NVLink of a simulated GPU."""

    up: bool = True
    replay_errors: int = 0
    recovery_errors: int = 0
    crc_errors: int = 0


@dataclass
class SimGpu:
    index: int
    uuid: str
    name: str = GPU_NAME
    total_mib: int = GPU_TOTAL_MIB
    lost: bool = False
    """Fell off the bus: every NVML query about it raises NVMLError_GpuIsLost."""
    failing: dict[str, type[Exception]] = field(default_factory=dict)
    """NVML function name -> the NVMLError subclass that call raises (one broken query)."""
    temperature_c: int = 34
    power_limit_w: float = 700.0
    idle_power_w: float = 72.0
    ecc_uncorrected: int = 0
    ecc_corrected: int = 0
    remapped_rows_pending: bool = False
    remapped_rows_failed: bool = False
    compute_mode: int = 0
    """NVML_COMPUTEMODE_DEFAULT."""
    # the health figures, as an H100 SXM answers them (an H200's, docs/real-nvml.md, differ little)
    sm_clock_max_mhz: int = 1980
    memory_clock_mhz: int = 2619
    temperature_slowdown_c: int = 89
    temperature_shutdown_c: int = 95
    temperature_max_operating_c: int = 87
    memory_temperature_max_c: int = 95
    heat_c: int = 0
    """Degrees above what its load explains (a failed fan, a blocked inlet)."""
    clock_event_reasons: int = 0
    """Reasons the clocks are held down beyond what load and power explain (a fault's)."""
    pcie_link_gen: int = 5
    pcie_link_gen_max: int = 5
    pcie_link_width: int = 16
    pcie_link_width_max: int = 16
    pcie_replays: int = 0
    nvlinks: list[SimNvLink] = field(default_factory=lambda: [SimNvLink() for _ in range(NVLINKS)])
    power_capped: bool = False
    """The operator set `power_limit_w` below the board's default: a busy GPU runs under SW power cap."""
    retired_pages: int | None = None
    """None: no page retirement (Hopper remaps rows); a count: a GPU that retires pages."""
    pace: float = 1.0
    """The share of its clocks and power a busy GPU reaches (a failing VRM, a clock stuck low: below 1)."""


@dataclass
class SimProcess:
    pid: int
    start_ticks: int
    argv: tuple[str, ...]
    gpu: int | None
    used_mib: int
    is_job: bool
    """Counted by the node's job manager (its status endpoint) as a running job."""
    producing: bool
    """Computing (the GPU busy) and writing output; False for a hung job or a leftover process."""
    ignores_term: bool = False
    ignores_kill: bool = False
    """Stuck in the driver (uninterruptible): no signal ends it; a pod restart does (runbook 003)."""
    user: str = "ml"
    container_id: str = ""
    """The container it runs in; empty for a process on the host."""
    devices: tuple[str, ...] = ()
    """/dev/nvidia* files it holds open; a compute process holds its GPU's too."""
    alive: bool = True
    started_at: float = field(default_factory=time.monotonic)
    killed_by: str | None = None
    checkpointing: bool = False
    """Writing a checkpoint: output grows while the GPU idles."""
    paused: bool = False
    """Stopped computing for a while (a dip or a checkpoint) and will resume."""
    written_bytes: float = 0.0
    """Output written before `writing_since`."""
    writing_since: float | None = None
    """Since when it writes output (monotonic); None while it writes nothing."""
    rows_bytes: int = 0
    """What the games it recorded as rows dirtied (a page each): its /proc/PID/io counts them though no file grows."""
    on_checkpoint: Literal["save", "ignore"] | None = None
    """How it answers a request to checkpoint: saves (for its node's `checkpoint_s`), then exits
    on a signal or removes the file; ignores it; None: it has no handler, so such a signal ends it."""
    files: set[str] = field(default_factory=set)
    """Files in its working directory (the checkpoint request's)."""
    saved_at: float | None = None
    """When the checkpoint it is writing is done (monotonic); then it exits (`exits`) or removes the file."""
    exits: bool = False
    job: JobEnv | None = None
    """The job across nodes it is a rank of, as its launcher's environment says (`gpumedic_sim.fleet.jobs`)."""
    stopped: bool = False
    """Stopped without exiting (SIGSTOP, stuck in the kernel): it keeps its GPU and answers nothing, not even NCCL's RAS."""

    @property
    def command(self) -> str:
        return " ".join(self.argv)

    @property
    def cgroup(self) -> str:
        if self.container_id:
            return f"/system.slice/docker-{self.container_id}.scope"
        return "/user.slice/user-1000.slice/session-1.scope"

    @property
    def comm(self) -> str:
        # the kernel keeps the first 15 bytes of the executable's name (TASK_COMM_LEN)
        return os.path.basename(self.argv[0])[:15] if self.argv else "?"

    def output_bytes(self, now: float) -> int:
        since = self.writing_since
        return int(self.written_bytes + (max(0.0, now - since) * OUTPUT_BYTES_PER_S if since is not None else 0.0))

    def set_activity(self, now: float, *, producing: bool, checkpointing: bool = False) -> None:
        """Start or stop computing and writing, keeping the output written so far."""
        if self.writing_since is not None:
            self.written_bytes += max(0.0, now - self.writing_since) * OUTPUT_BYTES_PER_S
        self.producing, self.checkpointing = producing, checkpointing
        self.writing_since = now if self.alive and (producing or checkpointing) else None


@dataclass
class SimContainer:
    """A container as the node's Docker engine knows it."""

    id: str
    name: str
    image: str = "registry.example/selfplay:2026.11"
    running: bool = True
    exit_code: int | None = None
    oom_killed: bool = False
    finished_at: datetime | None = None
    logs: list[str] = field(default_factory=list)
    engine_signal: int | None = None
    """The signal the engine itself sent before the exit (docker stop: 15); it reports a `kill` event."""
    log_driver: str = "json-file"
    """Its logging driver (HostConfig.LogConfig.Type): with `none` the engine keeps no log to read."""


class NodeState:
    """One simulated node's GPUs and processes, and the helpers that script faults into them."""

    def __init__(self, node_id: str, gpus: int, *, seed: int | None = None) -> None:
        if not 0 <= gpus <= 64:
            raise ValueError("a node has 0 to 64 GPUs")
        self.node_id = node_id
        self._lock = threading.RLock()
        self._random = random.Random(zlib.crc32(node_id.encode()) if seed is None else seed)
        self._boot = time.monotonic() - BOOTED_AGO_S - self._random.uniform(0, 86_400)
        self._next_pid = self._random.randint(20_000, 60_000)
        self.gpus = [
            SimGpu(index=i, uuid=f"GPU-{uuid.UUID(int=self._random.getrandbits(128), version=4)}") for i in range(gpus)
        ]
        self.processes: dict[int, SimProcess] = {}
        self.row_writers: dict[int, bool] = {}
        """Jobs that record their games as rows in the node's database, not as bytes (pid -> whether
        they write rows while their GPU idles, in a CPU phase)."""
        self.nvml_missing = False
        self.status_blocked = False
        self.status_lag_s = 0.0
        """How long the daemon's lagging event loop takes before each /status answer."""
        self.sampler_silent = False
        """The node's sampler is hung: it publishes nothing."""
        self.unit_restarts: dict[str, int] = {}
        self.boot_id = str(uuid.UUID(int=self._random.getrandbits(128), version=4))
        self.machine = SimHost()
        """Memory, swap, load and disks, as the sampler's host reader sees them."""
        self.kernel: SimKernelLog | None = None
        """The node's /dev/kmsg (a FIFO the real kernel-log watcher reads); set once the node starts."""
        self.cluster = PeerCluster([node_id])
        """The peer cluster its daemon belongs to (alone, until a fleet makes it a member of one)."""
        self.admin_token: str | None = None
        """The bearer token its service's admin endpoints want (None: they want none)."""
        self.checkpoint_s = 3.0
        """How long a job that saves on request takes to write its checkpoint."""
        self.jobs_checkpoint: Literal["save", "ignore"] | None = None
        """How its jobs, those running and those to come, answer a request to checkpoint (`SimProcess.on_checkpoint`)."""
        self.admin_calls: list[str] = []
        """Admin endpoints called and accepted, by path, in order."""
        self.reports_jobs = True
        """Whether its daemon gives a job count (a node outside the job cluster gives none)."""
        self.listens_on_restart = False
        """The peer daemon's server is gone (it crashed: the port refuses) or accepts nothing (its
        loop blocked before accept): a restart of its unit listens again."""
        self.on_daemon_start: Callable[[], None] | None = None
        """What a restart of the peer unit does then: listen again."""
        self.injected: list[InjectedFault] = []
        self.fault_listeners: list[Callable[[InjectedFault], None]] = []
        self.ssh_commands: list[str] = []
        self.ssh_stalls: dict[str, float] = {}
        """Command word -> seconds its SSH command hangs before it runs (a node whose SSH hangs)."""
        self.containers: dict[str, SimContainer] = {}
        self.container_listeners: list[Callable[[str, SimContainer], None]] = []
        """Called with ("start" | "die" | "destroy", container) as the engine would report it."""
        self.xid_queue: queue.Queue[tuple[int, int]] = queue.Queue()
        """(gpu index, xid) pending for the NVML event set; filled by faults, drained by NVML."""
        self.kernel_log: list[str] = []
        """Kernel log records in /dev/kmsg format ("prio,seq,usec,-;message"), oldest first."""
        self.kernel_listeners: list[Callable[[str], None]] = []

    # --- what the node looks like -------------------------------------------------------

    def random_age_s(self, low: float, high: float) -> float:
        """A reproducible (per node) random duration, for backdating what the node runs."""
        with self._lock:
            return self._random.uniform(low, high)

    def now_ticks(self) -> int:
        return int((time.monotonic() - self._boot) * CLK_TCK)

    def process(self, pid: int) -> SimProcess | None:
        """The live process with this pid, or None."""
        with self._lock:
            p = self.processes.get(pid)
            if p is not None and p.saved_at is not None:
                self._saved(p, time.monotonic())
            return p if p is not None and p.alive else None

    def live_processes(self, gpu: int | None = None) -> list[SimProcess]:
        with self._lock:
            now = time.monotonic()
            for p in self.processes.values():
                if p.saved_at is not None:
                    self._saved(p, now)
            return [p for p in self.processes.values() if p.alive and (gpu is None or p.gpu == gpu)]

    @property
    def running_jobs(self) -> int:
        return sum(1 for p in self.live_processes() if p.is_job)

    @property
    def counted_jobs(self) -> int | None:
        """The jobs the peer daemons count on it: the running ones, and any the cluster never saw end
        (None: its daemon gives no count)."""
        if not self.reports_jobs:
            return None
        return self.running_jobs + self.cluster.stale_jobs.get(self.node_id, 0)

    def gpu_percent(self) -> float:
        """Its GPUs' mean utilisation, as its daemon reports it to the leader."""
        return round(sum(self.utilization(g)[0] for g in range(len(self.gpus))) / max(1, len(self.gpus)), 1)

    @property
    def output_growing(self) -> bool:
        return any(p.is_job and p.writing_since is not None for p in self.live_processes())

    def output_bytes(self) -> int:
        """Total output the node's jobs have written; grows only while a job produces."""
        now = time.monotonic()
        with self._lock:
            return sum(p.output_bytes(now) for p in self.processes.values() if p.is_job and p.pid not in self.row_writers)

    def utilization(self, gpu: int) -> tuple[int, int]:
        """(kernel busy %, memory controller busy %) of one GPU now."""
        with self._lock:
            if any(p.producing for p in self.live_processes(gpu)):
                return self._random.randint(85, 95), self._random.randint(30, 45)
            return 0, 0

    def memory_used_mib(self, gpu: int) -> int:
        return sum(p.used_mib for p in self.live_processes(gpu))

    # --- what happens to it ---------------------------------------------------------------

    def start_job(
        self,
        gpu: int,
        *,
        argv: tuple[str, ...] | None = None,
        used_mib: int = JOB_MEMORY_MIB,
        started_ago_s: float = 0.0,
    ) -> SimProcess:
        """A busy job on `gpu`: util ~90 %, output growing. `started_ago_s` backdates it (a fleet
        that has been running a while), which its start ticks and output show."""
        self._check_gpu(gpu)
        with self._lock:
            container = self._new_container(f"selfplay-gpu{gpu}")
            return self._spawn(
                argv or _job_argv(gpu), gpu, used_mib, is_job=True, producing=True, ago_s=started_ago_s, container=container
            )

    def inject_zombie(self, gpu: int, *, ignore_term: bool = False) -> SimProcess:
        """The job on `gpu` hangs: it keeps its GPU memory and counts as running, but its GPU
        sits at 0 % and its output stops growing. Without a job there, a hung one starts."""
        self._check_gpu(gpu)
        with self._lock:
            job = next((p for p in self.live_processes(gpu) if p.is_job), None)
            if job is None:
                job = self._spawn(_job_argv(gpu), gpu, JOB_MEMORY_MIB, is_job=True, producing=False)
            job.set_activity(time.monotonic(), producing=False)
            job.ignores_term = ignore_term
        self._record(gpu, Fault.ZOMBIE_JOB)
        return job

    def inject_gpu_stuck(self, gpu: int) -> SimProcess:
        """Runbook 003 on a rented pod: after a container restart the old process still holds `gpu`
        and no signal ends it (stuck in the driver), so the new run dies "device busy" on start and
        every other GPU of the pod idles too. Only restarting the whole pod frees it."""
        for other in range(len(self.gpus)):  # the run was stopped for its restart
            if other != gpu and (job := self._job_on(other)) is not None:
                self._end(job, exit_code=0, logs=["stopping for a restart", "checkpoint saved"])
        leftover = self._leave_orphan(gpu, ORPHAN_MEMORY_MIB, context=True)
        with self._lock:
            leftover.ignores_term = leftover.ignores_kill = True
        self._record(gpu, Fault.GPU_STUCK)
        return leftover

    def restart_pod(self) -> None:
        """The provider restarts the whole pod: every process ends, stuck ones too, and with them what
        held the GPUs; the containers go (the pod's own start brings its work back, not modelled)."""
        with self._lock:
            for p in self.live_processes():
                p.ignores_term = p.ignores_kill = False
                self.kill(p.pid, "KILL")
            for container in list(self.containers.values()):
                self._destroy_container(container)

    def inject_orphan(self, gpu: int, *, used_mib: int = ORPHAN_MEMORY_MIB, context: bool = True) -> SimProcess:
        """A container restart leaves its process behind: the job on `gpu` outlives its container
        (which is gone, replaced by a new one), nobody counts it as a job any more and it computes
        nothing, yet it still holds the GPU, so the new container's job dies with "device busy".
        Without a job there, a leftover with `used_mib` appears. With `context=False` the leftover
        holds only the /dev/nvidia* files, which nvidia-smi does not show."""
        leftover = self._leave_orphan(gpu, used_mib, context=context)
        self._record(gpu, Fault.ORPHAN_GPU_HOLDER)
        return leftover

    def _leave_orphan(self, gpu: int, used_mib: int, *, context: bool) -> SimProcess:
        self._check_gpu(gpu)
        with self._lock:
            leftover = self._job_on(gpu)
            if leftover is None:
                argv = ("python", "-m", "selfplay.worker", "--gpu", str(gpu), "--resume")
                leftover = self._spawn(
                    argv, gpu, used_mib, is_job=False, producing=False, container=self._new_container(f"selfplay-gpu{gpu}")
                )
            leftover.is_job = False
            leftover.set_activity(time.monotonic(), producing=False)
            if not context:
                leftover.gpu = None
                leftover.used_mib = 0
            old = self.containers.get(leftover.container_id)
            if old is not None:
                if old.running:
                    self._exit_container(old, 137, logs=["received SIGKILL"])
                self._destroy_container(old)
            replacement = self._new_container(f"selfplay-gpu{gpu}")
            self._exit_container(replacement, 1, logs=["starting selfplay worker", DEVICE_BUSY])
        return leftover

    def inject_oom_kill(self, gpu: int) -> SimProcess | None:
        """The job on `gpu` outgrows its container's memory limit: the kernel's OOM killer ends
        it (its lines go to the kernel log) and the container exits 137 with OOMKilled."""
        job = self._job_on(gpu)
        if job is not None:
            if self.kernel is not None:
                self.kernel.oom_kill(job.pid, job.comm, 1000, job.container_id, 31_457_280)
            self._end(job, exit_code=137, oom_killed=True, logs=["game 18231 done in 41.2s"])
        self._record(gpu, Fault.OOM_KILL)
        return job

    def inject_segfault(self, gpu: int, *, logs: Sequence[str] = ()) -> SimProcess | None:
        """The job on `gpu` dies of SIGSEGV: a segfault line in the kernel log, exit 139; `logs` are
        what it printed before."""
        job = self._job_on(gpu)
        if job is not None:
            if self.kernel is not None:
                self.kernel.segfault(job.pid, job.comm)
            self._end(job, exit_code=139, logs=[*logs, "Fatal Python error: Segmentation fault"])
        self._record(gpu, Fault.SEGFAULT)
        return job

    def inject_sigterm(self, gpu: int) -> SimProcess | None:
        """The job on `gpu` is stopped with SIGTERM (a preemption, a `docker stop`): exit 143."""
        job = self._job_on(gpu)
        if job is not None:
            self._end(job, exit_code=143, logs=["received SIGTERM, saving checkpoint", "checkpoint saved"])
        self._record(gpu, Fault.SIGTERM)
        return job

    def inject_gpu_oom(self, gpu: int) -> SimProcess | None:
        """The job on `gpu` runs out of GPU memory: CUDA's out-of-memory error in its logs, exit 1."""
        job = self._job_on(gpu)
        if job is not None:
            self._end(job, exit_code=1, logs=["Traceback (most recent call last):", CUDA_OOM])
        self._record(gpu, Fault.GPU_OOM)
        return job

    # --- benign behaviour: what a healthy fleet does, which must open no incident --------------

    def finish_job(self, gpu: int) -> SimProcess | None:
        """The job on `gpu` is done: it exits 0 and its container with it; the GPU is free."""
        job = self._job_on(gpu)
        if job is not None:
            self._end(job, exit_code=0, logs=["all games played", "exiting"])
        self._record(gpu, Benign.JOB_FINISHED)
        return job

    def stop_job(self, gpu: int) -> SimProcess | None:
        """The node stops the job's container on purpose (docker stop): SIGTERM from the engine, exit 143."""
        job = self._stop_on_purpose(gpu)
        self._record(gpu, Benign.CONTAINER_STOPPED)
        return job

    def _stop_on_purpose(self, gpu: int) -> SimProcess | None:
        job = self._job_on(gpu)
        if job is not None:
            with self._lock:
                container = self.containers.get(job.container_id)
                if container is not None:
                    container.engine_signal = 15
            self._end(job, exit_code=143, logs=["received SIGTERM, saving checkpoint", "checkpoint saved"])
        return job

    def run_bad_image(self, gpu: int, image: str) -> None:
        """A rollout: the job on `gpu` is stopped (docker stop, exit 143) and started again on
        `image`, which fails at once (exit 1, an import error in its log); the GPU is left free."""
        self._stop_on_purpose(gpu)
        failed = self._new_container(f"selfplay-gpu{gpu}", image=image)
        self._exit_container(failed, 1, logs=[
            "Traceback (most recent call last):", '  File "/app/selfplay.py", line 3, in <module>',
            "ImportError: libcudnn.so.9: cannot open shared object file: No such file or directory",
        ])
        self._record(gpu, Fault.BAD_IMAGE)

    def pause_job(self, gpu: int, *, checkpointing: bool) -> SimProcess | None:
        """The job on `gpu` stops computing for a while (a short dip, or a checkpoint that still
        writes output); `resume_job` ends it. Neither is a zombie."""
        job = self._job_on(gpu)
        if job is not None:
            with self._lock:
                job.set_activity(time.monotonic(), producing=False, checkpointing=checkpointing)
                job.paused = True
        self._record(gpu, Benign.CHECKPOINT_PAUSE if checkpointing else Benign.SHORT_DIP)
        return job

    def resume_job(self, gpu: int) -> None:
        with self._lock:
            for p in self.live_processes(gpu):
                if p.paused:
                    p.set_activity(time.monotonic(), producing=True)
                    p.paused = False

    def inject_disk_full(self, path: str = "/var/lib/docker") -> None:
        """The file system under `path` fills up."""
        self.machine.fill_disk(path)
        self._record(None, Fault.DISK_FULL)

    def inject_xid(self, gpu: int, xid: int = 79) -> None:
        """The driver reports XID `xid` on `gpu` (NVML event). XID 79 also means the GPU fell off
        the bus: every NVML query about it fails from now on."""
        self._check_gpu(gpu)
        self.xid_queue.put((gpu, xid))
        if self.kernel is not None:
            self.kernel.write(f"NVRM: Xid (PCI:0000:{0x18 + gpu:02x}:00): {xid}, pid='<unknown>', name=<unknown>")
        if xid == 79:
            self.gpus[gpu].lost = True
        elif xid in REMAP_XIDS:  # an uncorrectable error: a row remap waits for the next reset
            self.gpus[gpu].remapped_rows_pending = True
            self.gpus[gpu].ecc_uncorrected += 1
        elif xid == 64:
            self.gpus[gpu].remapped_rows_failed = True
        # The answer key: XID 79 is a GPU off the bus; an application XID alone is no node fault; a
        # memory error's remap is the XID's incident, or row_remap's where the XID itself asks nothing
        if xid == 79:
            expect: frozenset[str] | None = frozenset({"gpu_lost"})
        elif xid in APPLICATION_XIDS:
            expect = frozenset()
        elif xid in REMAP_XIDS or xid == 64:
            expect = frozenset({"gpu_xid", "row_remap"})
        else:
            expect = None
        self._record(gpu, Fault.XID, expect)

    # A change to one GPU's state, as NVML will then report it: the hardware's own behaviour (heat,
    # a power brake, a memory error, a link trained down) follows in gpumedic_sim.machine.nvml.

    def inject_gpu_thermal(self, gpu: int) -> None:
        self._change(gpu, Fault.GPU_THERMAL, lambda g: setattr(g, "heat_c", 20))  # 74 C busy + 20: past the 89 C slowdown

    def inject_gpu_throttled(self, gpu: int) -> None:
        self._change(gpu, Fault.GPU_THROTTLED, lambda g: setattr(g, "clock_event_reasons", g.clock_event_reasons | 0x8 | 0x80))

    def inject_ecc_errors(self, gpu: int) -> None:
        self._change(gpu, Fault.ECC_ERRORS, lambda g: setattr(g, "ecc_uncorrected", g.ecc_uncorrected + 1))

    def inject_row_remap(self, gpu: int) -> None:
        self._change(gpu, Fault.ROW_REMAP, lambda g: setattr(g, "remapped_rows_pending", True))

    def inject_pcie_degraded(self, gpu: int) -> None:
        self._change(gpu, Fault.PCIE_DEGRADED, lambda g: setattr(g, "pcie_link_width", 8))

    def inject_nvlink_degraded(self, gpu: int) -> None:
        self._change(gpu, Fault.NVLINK_DEGRADED, lambda g: setattr(g.nvlinks[3], "up", False))

    def inject_gpu_straggler(self, gpu: int) -> None:
        self._change(gpu, Fault.GPU_STRAGGLER, lambda g: setattr(g, "pace", 0.6))

    def run_hot(self, gpu: int) -> None:
        self._change(gpu, Benign.HOT_BUT_FINE, lambda g: setattr(g, "heat_c", 9))  # 83 C busy

    def cap_power(self, gpu: int) -> None:
        self._change(gpu, Benign.POWER_CAPPED, lambda g: (setattr(g, "power_limit_w", 400.0), setattr(g, "power_capped", True)))

    def retire_page(self, gpu: int) -> None:
        self._change(gpu, Benign.RETIRED_PAGE, lambda g: setattr(g, "retired_pages", 1))

    def _change(self, gpu: int, fault: str, change: Callable[[SimGpu], object]) -> None:
        self._check_gpu(gpu)
        with self._lock:
            change(self.gpus[gpu])
        self._record(gpu, fault)

    def inject_sampler_silent(self) -> None:
        """The node's sampler hangs: it publishes nothing from now on."""
        self.sampler_silent = True
        self._record(None, Fault.SAMPLER_SILENT)

    def inject_gpu_lost(self, gpu: int) -> None:
        """`gpu` falls off the bus: every NVML query about it raises NVMLError_GpuIsLost."""
        self._check_gpu(gpu)
        self.gpus[gpu].lost = True
        self._record(gpu, Fault.GPU_LOST)

    def inject_nvml_missing(self) -> None:
        """The driver is gone (a bad upgrade): nvmlInit raises NVMLError_LibraryNotFound."""
        self.nvml_missing = True
        self._record(None, Fault.NVML_MISSING)

    @property
    def leader(self) -> str | None:
        """The leader its peer daemon names."""
        return self.cluster.leader_of(self.node_id)

    def record(self, fault: str) -> None:
        """Record what the fleet did to the peer cluster with this node in mind (the fleet
        changes the cluster; the ground truth is kept per node)."""
        self._record(None, fault)

    def inject_status_blocked(self) -> None:
        """The node's event loop blocks: its status port accepts TCP but never answers."""
        self.status_blocked = True
        self.cluster.leave(self.node_id)
        self._record(None, Fault.STATUS_BLOCKED)

    def inject_phantom_jobs(self) -> None:
        """Its jobs' processes are gone (killed by hand, say), and the cluster never saw them end:
        the daemons go on counting them while the GPUs idle, until the leader's count is reset."""
        ended = [p for p in self.live_processes() if p.is_job]
        for job in ended:
            self._end(job, exit_code=0, logs=["exiting"])
        self.cluster.stale_jobs[self.node_id] = self.cluster.stale_jobs.get(self.node_id, 0) + max(1, len(ended))
        self._record(None, Fault.PHANTOM_JOBS)

    def inject_stuck(self, gpu: int, *, age_s: float = STUCK_AGE_S) -> SimProcess:
        """On a node whose daemon gives no job count, a process started `age_s` ago holds `gpu` and
        stops computing (the job there, if it is that old; else the job ends and an old one hangs)."""
        self._check_gpu(gpu)
        self.reports_jobs = False
        job = self._job_on(gpu)
        if job is not None and self.now_ticks() - job.start_ticks < age_s * CLK_TCK:
            self._end(job, exit_code=0, logs=["exiting"])
            job = None
        with self._lock:
            if job is None:
                job = self._spawn(_job_argv(gpu), gpu, JOB_MEMORY_MIB, is_job=True, producing=False, ago_s=age_s,
                                  container=self._new_container(f"selfplay-gpu{gpu}"))
            job.set_activity(time.monotonic(), producing=False)
        self._record(gpu, Fault.STUCK_PROCESS)
        return job

    def inject_status_slow(self, lag_s: float = STATUS_LAG_S) -> None:
        """The daemon's event loop lags: every /status answer comes `lag_s` late (it stays a member)."""
        self.status_lag_s = lag_s
        self._record(None, Fault.STATUS_SLOW)

    def kill(self, pid: int, signal: str = "KILL") -> bool:
        """Deliver a signal; False if no such live process. KILL always ends the process, TERM
        unless it ignores TERM or is stopped. A dead process frees its GPU memory and stops counting as a job."""
        with self._lock:
            p = self.process(pid)
            if p is None:
                return False
            if signal in CHECKPOINT_SIGNALS and p.on_checkpoint is not None:
                if p.on_checkpoint == "save" and p.saved_at is None:
                    self._save(p, then_exit=True)
                return True
            if (signal == "TERM" and p.ignores_term) or p.ignores_kill or (p.stopped and signal != "KILL"):
                return True  # a stopped process's signals wait for it to run again; SIGKILL does not
            self._stop(p, signal, 137 if signal == "KILL" else 128 + SIGNAL_NUMBERS[signal])
            return True

    def ask_file(self, pid: int, name: str) -> bool:
        """A file written in the process's working directory (a request to checkpoint): one that
        saves on request starts to, and removes the file when done. False: no such process."""
        with self._lock:
            p = self.process(pid)
            if p is None:
                return False
            p.files.add(name)
            if p.on_checkpoint == "save" and p.saved_at is None:
                self._save(p, then_exit=False)
            return True

    def jobs_save_on_request(self) -> None:
        self._answer_checkpoints("save", Benign.JOBS_SAVE_ON_REQUEST)

    def jobs_ignore_requests(self) -> None:
        self._answer_checkpoints("ignore", Benign.JOBS_IGNORE_REQUESTS)

    def _answer_checkpoints(self, answer: Literal["save", "ignore"], benign: Benign) -> None:
        with self._lock:
            self.jobs_checkpoint = answer
            for p in self.processes.values():
                if p.is_job:
                    p.on_checkpoint = answer
        self._record(None, benign)

    def checkpoint_hook(self, *, ask: bool) -> int | None:
        """The jobs' checkpoint hook on the node (any loopback URL): None when no job serves one;
        a POST (`ask`) starts every saving job's checkpoint. The answer: 200 once none is saving
        and none ignores the hook, else 202."""
        with self._lock:
            jobs = [p for p in self.live_processes() if p.is_job and p.on_checkpoint is not None]
            if not jobs:
                return None
            for p in jobs:
                if ask and p.on_checkpoint == "save" and p.saved_at is None:
                    self._save(p, then_exit=False)
            pending = any(p.on_checkpoint == "ignore" or p.saved_at is not None for p in jobs)
            return 202 if pending else 200

    def has_file(self, pid: int, name: str) -> bool:
        with self._lock:
            p = self.process(pid)
            return p is not None and name in p.files

    def _save(self, p: SimProcess, *, then_exit: bool) -> None:
        now = time.monotonic()
        p.saved_at, p.exits = now + self.checkpoint_s, then_exit
        p.set_activity(now, producing=False, checkpointing=True)

    def _saved(self, p: SimProcess, now: float) -> None:
        """A checkpoint due by now is written: the process exits, or removes the file and goes on."""
        if p.saved_at is None or now < p.saved_at:
            return
        p.saved_at = None
        if p.exits:
            self._stop(p, None, 0)
        else:
            p.files.clear()
            p.set_activity(now, producing=True)

    def _stop(self, p: SimProcess, signal: str | None, exit_code: int) -> None:
        """The process ends (by `signal`, or of itself: None); its container exits once nothing in it lives."""
        p.alive = False
        p.killed_by = signal
        p.set_activity(time.monotonic(), producing=False)
        container = self.containers.get(p.container_id)
        if container is not None and container.running and not self._container_has_live(container.id):
            self._exit_container(container, exit_code)

    # --- what systemd, nvidia-smi and the node's own service do -----------------------------

    def admin(self, path: str, authorization: str | None, body: str = "{}") -> int:
        """The node's daemon's admin API (POST): its HTTP status. /force_election forces an election
        (this node wins); /admin/reset_node_jobs, on the leader only, sets the count of the node
        its body names (`{"node_id": ...}`) back to the jobs that node really runs."""
        if self.admin_token is not None and authorization != f"Bearer {self.admin_token}":
            return 401
        if path not in ADMIN_PATHS:
            return 404
        try:
            fields = json.loads(body)
        except ValueError:
            return 400
        if not isinstance(fields, dict):
            return 400
        with self._lock:
            self.admin_calls.append(path)
        if path == "/force_election":
            self.cluster.elect(self.node_id)
        elif path == "/admin/reset_node_jobs":
            if not isinstance(fields.get("node_id"), str):
                return 400
            if self.cluster.leader_of(self.node_id) != self.node_id:
                return 409  # only the leader keeps the counts
            self.cluster.stale_jobs.pop(fields["node_id"], None)
        return 200

    def restart_unit(self, unit: str) -> bool:
        """`systemctl restart`; False for a unit the node does not have. Restarting the sampler's
        unit ends a hung sampler."""
        if unit not in UNITS:
            return False
        with self._lock:
            self.unit_restarts[unit] = self.unit_restarts.get(unit, 0) + 1
            if unit == SAMPLER_UNIT:
                self.sampler_silent = False
            if unit == PEER_UNIT:
                self.status_lag_s = 0.0  # a fresh event loop
            if unit == JOB_UNIT:
                for gpu in range(len(self.gpus)):
                    if not self.live_processes(gpu):
                        self.start_job(gpu)
            if unit == PEER_UNIT and (self.status_blocked or self.listens_on_restart):
                self.status_blocked = False
                if self.listens_on_restart and self.on_daemon_start is not None:
                    self.listens_on_restart = False
                    self.on_daemon_start()
                self.cluster.join(self.node_id)
        return True

    def reboot(self) -> None:
        """Every process ends, the hung sampler with them; GPUs off the bus come back; a new boot."""
        with self._lock:
            for p in self.live_processes():
                self.kill(p.pid, "KILL")
            self.sampler_silent = False
            for gpu in self.gpus:
                gpu.lost = False
            self._boot = time.monotonic()
            self.boot_id = str(uuid.UUID(int=self._random.getrandbits(128), version=4))

    def compute_pids(self, gpu: int) -> list[int]:
        """The GPU's compute processes, as NVML lists them."""
        return [p.pid for p in self.live_processes(gpu) if p.used_mib > 0]

    def device_holders(self, path: str) -> list[int]:
        """Live processes holding the device file open (what fuser finds)."""
        with self._lock:
            return [p.pid for p in self.processes.values() if p.alive and path in p.devices]

    def reset_gpu(self, gpu: int) -> str:
        """`nvidia-smi --gpu-reset`: '' when it worked, else nvidia-smi's complaint."""
        with self._lock:
            target = self.gpus[gpu]
            if target.lost:
                return "Unable to reset GPU: GPU is lost. Reboot the system to recover this GPU"
            if self.compute_pids(gpu) or self.device_holders(f"/dev/nvidia{gpu}"):
                return "Unable to reset GPU because it's being used by some other process"
            target.remapped_rows_pending = False
            target.ecc_uncorrected = 0
            return ""

    # --- containers ---------------------------------------------------------------------------

    def _new_container(self, name: str, image: str = "") -> SimContainer:
        with self._lock:
            container = SimContainer(id=f"{self._random.getrandbits(256):064x}", name=name, **({"image": image} if image else {}))
            self.containers[container.id] = container
        self._container_event("start", container)
        return container

    def _container_has_live(self, container_id: str) -> bool:
        return any(p.container_id == container_id for p in self.live_processes())

    def _exit_container(
        self, container: SimContainer, exit_code: int, *, oom_killed: bool = False, logs: list[str] | None = None
    ) -> None:
        with self._lock:
            container.running = False
            container.exit_code = exit_code
            container.oom_killed = oom_killed
            container.finished_at = datetime.now(UTC)
            container.logs.extend(logs or ())
        self._container_event("die", container)

    def _destroy_container(self, container: SimContainer) -> None:
        with self._lock:
            self.containers.pop(container.id, None)
        self._container_event("destroy", container)

    def _container_event(self, action: str, container: SimContainer) -> None:
        for listener in list(self.container_listeners):
            listener(action, container)

    def _job_on(self, gpu: int) -> SimProcess | None:
        self._check_gpu(gpu)
        return next((p for p in self.live_processes(gpu) if p.is_job), None)

    def _end(self, p: SimProcess, *, exit_code: int, oom_killed: bool = False, logs: list[str] | None = None) -> None:
        """The process ends by itself (not by a kill from outside); its container exits with it."""
        with self._lock:
            p.alive = False
            p.set_activity(time.monotonic(), producing=False)
            container = self.containers.get(p.container_id)
        if container is not None and container.running:
            self._exit_container(container, exit_code, oom_killed=oom_killed, logs=logs)

    def _spawn(
        self,
        argv: tuple[str, ...],
        gpu: int | None,
        used_mib: int,
        *,
        is_job: bool,
        producing: bool,
        ago_s: float = 0.0,
        container: SimContainer | None = None,
    ) -> SimProcess:
        ago_s = max(0.0, min(ago_s, BOOTED_AGO_S))
        with self._lock:
            pid = self._new_pid()
            p = SimProcess(
                pid=pid,
                start_ticks=self.now_ticks() - int(ago_s * CLK_TCK),
                started_at=time.monotonic() - ago_s,
                argv=argv,
                gpu=gpu,
                used_mib=used_mib,
                is_job=is_job,
                producing=producing,
                container_id=container.id if container else "",
                devices=_devices(gpu) if gpu is not None else (),
                on_checkpoint=self.jobs_checkpoint if is_job else None,
            )
            p.writing_since = p.started_at if producing else None
            self.processes[pid] = p
            return p

    def _new_pid(self) -> int:
        while True:
            self._next_pid += self._random.randint(1, 40)
            if self._next_pid > 4_000_000:
                self._next_pid = 300
            existing = self.processes.get(self._next_pid)
            if existing is None:
                return self._next_pid
            if not existing.alive:
                # pids are recycled, as on Linux: the dead one is forgotten
                del self.processes[self._next_pid]
                return self._next_pid

    def _check_gpu(self, gpu: int) -> None:
        if not 0 <= gpu < len(self.gpus):
            raise ValueError(f"{self.node_id} has no GPU {gpu}")

    def _record(self, gpu: int | None, fault: str, expect: frozenset[str] | None = None) -> None:
        entry = InjectedFault(datetime.now(UTC), self.node_id, gpu, fault, expected(fault) if expect is None else expect)
        self.injected.append(entry)
        for listener in self.fault_listeners:
            listener(entry)


def _devices(gpu: int) -> tuple[str, ...]:
    """What a CUDA process on `gpu` holds open."""
    return (f"/dev/nvidia{gpu}", "/dev/nvidiactl", "/dev/nvidia-uvm")


def _job_argv(gpu: int) -> tuple[str, ...]:
    return ("python", "-m", "selfplay", "--gpu", str(gpu), "--games", "100000")
