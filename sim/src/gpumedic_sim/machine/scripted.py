"""The faults and benign behaviour scripted into one node's GPUs and processes: the stand-ins that
`gpumedic_sim.faults` names for them (the node's network and files are `SimNode`'s own).

`ScriptedFaults` is mixed in over `NodeState` (`gpumedic_sim.machine.node.ScriptedNode`): each
stand-in changes the node's truth through NodeState's own members, under its lock, so what a
fault does is seen through every interface of the node at once."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from typing import Literal

from gpumedic_sim.faults import Benign, Fault
from gpumedic_sim.machine.parts import (
    APPLICATION_XIDS, CLK_TCK, CUDA_OOM, DEVICE_BUSY, JOB_MEMORY_MIB, ORPHAN_MEMORY_MIB, REMAP_XIDS, STATUS_LAG_S, STUCK_AGE_S,
    SimGpu, SimProcess, job_argv,
)


class ScriptedFaults:
    """The stand-ins, over a `NodeState`: `ScriptedNode("sim-node-01", 8).inject_zombie(3)`."""

    def inject_zombie(self, gpu: int, *, ignore_term: bool = False) -> SimProcess:
        """The job on `gpu` hangs: it keeps its GPU memory and counts as running, but its GPU
        sits at 0 % and its output stops growing. Without a job there, a hung one starts."""
        self._check_gpu(gpu)
        with self._lock:
            job = next((p for p in self.live_processes(gpu) if p.is_job), None)
            if job is None:
                job = self._spawn(job_argv(gpu), gpu, JOB_MEMORY_MIB, is_job=True, producing=False)
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
                job = self._spawn(job_argv(gpu), gpu, JOB_MEMORY_MIB, is_job=True, producing=False, ago_s=age_s,
                                  container=self._new_container(f"selfplay-gpu{gpu}"))
            job.set_activity(time.monotonic(), producing=False)
        self._record(gpu, Fault.STUCK_PROCESS)
        return job

    def inject_status_slow(self, lag_s: float = STATUS_LAG_S) -> None:
        """The daemon's event loop lags: every /status answer comes `lag_s` late (it stays a member)."""
        self.status_lag_s = lag_s
        self._record(None, Fault.STATUS_SLOW)

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
