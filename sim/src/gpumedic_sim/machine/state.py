"""The simulated node's in-memory truth: its GPUs, processes, jobs and containers, and what the
node's own software and its operators do to them (signals, unit restarts, checkpoints, resets).

Everything a real node would show through NVML, /proc, its status endpoint and its shell is
derived from this one state, so a kill sent over SSH is seen by the next sample exactly as on a
real node. The sampler reads it from a worker thread while SSH commands change it on the event
loop, hence the lock. The faults scripted into it are `gpumedic_sim.machine.scripted`'s.
"""

from __future__ import annotations

import json
import queue
import random
import threading
import time
import uuid
import zlib
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from gpumedic_sim.faults import InjectedFault, expected
from gpumedic_sim.machine.cluster import PeerCluster
from gpumedic_sim.machine.host import SimHost
from gpumedic_sim.machine.kernel import SimKernelLog
from gpumedic_sim.machine.parts import (
    ADMIN_PATHS, BOOTED_AGO_S, CHECKPOINT_SIGNALS, CLK_TCK, JOB_MEMORY_MIB, JOB_UNIT, PEER_UNIT, SAMPLER_UNIT, SIGNAL_NUMBERS, UNITS,
    SimContainer, SimGpu, SimProcess,
    devices_of, job_argv,
)


class NodeState:
    """One simulated node's GPUs, processes and containers, and what its software and operators do to them."""

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
                argv or job_argv(gpu), gpu, used_mib, is_job=True, producing=True, ago_s=started_ago_s, container=container
            )

    def restart_pod(self) -> None:
        """The provider restarts the whole pod: every process ends, stuck ones too, and with them what
        held the GPUs; the containers go (the pod's own start brings its work back, not modelled)."""
        with self._lock:
            for p in self.live_processes():
                p.ignores_term = p.ignores_kill = False
                self.kill(p.pid, "KILL")
            for container in list(self.containers.values()):
                self._destroy_container(container)

    @property
    def leader(self) -> str | None:
        """The leader its peer daemon names."""
        return self.cluster.leader_of(self.node_id)

    def record(self, fault: str) -> None:
        """Record what the fleet did to the peer cluster with this node in mind (the fleet
        changes the cluster; the ground truth is kept per node)."""
        self._record(None, fault)

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
                devices=devices_of(gpu) if gpu is not None else (),
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
