"""What a simulated node is made of: its GPUs, processes and containers, and the figures and names
they are built with (a GPU's memory, the node's units, the XIDs that mean something)."""

from __future__ import annotations

import os
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from node_sampler.jobenv import JobEnv

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
    """The job across nodes it is a rank of, as its launcher's environment says (`gpumedic_sim.fleet.nodes.FleetJob`)."""
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

    def proc_stat(self) -> str:
        """/proc/PID/stat as Linux writes it: 52 fields, starttime (field 22) = the start ticks."""
        fields = [
            str(self.pid),  # 1 pid
            f"({self.comm})",  # 2 comm
            "R" if self.producing else "S",  # 3 state
            "1",  # 4 ppid
            str(self.pid),  # 5 pgrp
            str(self.pid),  # 6 session
            "0",  # 7 tty_nr
            "-1",  # 8 tpgid
            "4194560",  # 9 flags
            "81234",  # 10 minflt
            "0",  # 11 cminflt
            "12",  # 12 majflt
            "0",  # 13 cmajflt
            "52310",  # 14 utime
            "8712",  # 15 stime
            "0",  # 16 cutime
            "0",  # 17 cstime
            "20",  # 18 priority
            "0",  # 19 nice
            "24",  # 20 num_threads
            "0",  # 21 itrealvalue
            str(self.start_ticks),  # 22 starttime
            "38105403392",  # 23 vsize
            "1048576",  # 24 rss
            "18446744073709551615",  # 25 rsslim
        ]
        # 26..52: addresses, signals and accounting nobody here reads
        fields += ["0"] * (52 - len(fields))
        return " ".join(fields) + "\n"

    def proc_cmdline(self) -> str:
        """/proc/PID/cmdline: each argument NUL-terminated."""
        return "".join(f"{arg}\0" for arg in self.argv)


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



def devices_of(gpu: int) -> tuple[str, ...]:
    """What a CUDA process on `gpu` holds open."""
    return (f"/dev/nvidia{gpu}", "/dev/nvidiactl", "/dev/nvidia-uvm")


def job_argv(gpu: int) -> tuple[str, ...]:
    return ("python", "-m", "selfplay", "--gpu", str(gpu), "--games", "100000")
