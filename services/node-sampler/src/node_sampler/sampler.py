"""The sampling loop: read everything once per interval, assemble one `NodeSampled`, publish it;
and, between samples, the node's immediate events (XID, GPU lost, OOM kill, container exit).

The loop keeps to a fixed grid on the monotonic clock (tick k at start + k*interval) so samples
do not drift later with every interval's own run time, and it skips ticks it missed instead of
bursting to catch up. NVML, /proc and the host are read in a worker thread; the job probes run
meanwhile on the event loop. A failed sample publish is logged and the next tick comes anyway: a
sampler that stops on a NATS hiccup would look exactly like a dead node. Immediate events are
rarer and matter more: they wait in a bounded queue and are retried until the stream takes them.

The watchers feeding those events are optional and each one is off with one log line where its
source is missing (no NVML events, no /dev/kmsg access, no Docker engine).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any, Protocol

from gpumedic_bus.tasks import stop_tasks
from gpumedic_events import ContainerUsage, CpuPressure, Event, GpuHealth, NodeSampled

from node_sampler.cgroups import ContainerCgroups
from node_sampler.checks import CheckScripts
from node_sampler.containers import MAX_LOG_LINES, DockerWatcher
from node_sampler.files import ExpectedFiles
from node_sampler.immediate import (
    ContainerExitReading,
    OomKillReading,
    XidReading,
    container_event,
    gpu_lost_event,
    lost_gpus,
    oom_event,
    xid_event,
)
from node_sampler.jobs import JobProbe
from node_sampler.kernel import KernelLogWatcher
from node_sampler.listen import ListenQueue
from node_sampler.logwatch import LogPatterns
from node_sampler.nvml import NvmlReader, XidWatcher
from node_sampler.procs import ProcessInfo, ProcessTable, ProcessUsage
from node_sampler.ras import RasWatch
from node_sampler.readings import HostReading, JobsReading, NvmlReading, TopReading, assemble_sample, next_tick, top_processes

log = logging.getLogger(__name__)

Publish = Callable[[Event], Awaitable[None]]

PUBLISH_WAIT_MIN_S = 1.0
"""The least a sample waits for its acknowledgement, however short the interval."""

MAX_PENDING_EVENTS = 1000
"""Immediate events held while NATS is unreachable; beyond this the oldest are dropped (logged)."""
EVENT_RETRY_S = 1.0


class HostSource(Protocol):
    def read(self) -> HostReading: ...


class Sampler:
    """Samples one node. `nvml` is a pynvml-like module (or an `NvmlReader` over one)."""

    def __init__(
        self,
        node_id: str,
        nvml: Any,
        processes: ProcessTable,
        probes: Sequence[JobProbe] = (),
        interval_s: float = 5.0,
        *,
        host: HostSource | None = None,
        holder_scan_interval_s: float = 30.0,
        top_interval_s: float = 30.0,
        health_interval_s: float = 30.0,
        health_refresh_s: float = 600.0,
        xid_events: bool = False,
        kernel_log: Path | str | None = None,
        docker_socket: Path | str | None = None,
        container_log_lines: int = MAX_LOG_LINES,
        ras: RasWatch | None = None,
        files: ExpectedFiles | None = None,
        checks: CheckScripts | None = None,
        logs: LogPatterns | None = None,
        listen: ListenQueue | None = None,
        cgroups: ContainerCgroups | None = None,
        own_pressure: Callable[[], CpuPressure | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        """`host` reads memory, load and disks; `holder_scan_interval_s` is how often /proc is
        scanned for /dev/nvidia* holders (0: never), `top_interval_s` how often every process's CPU
        and memory are read for the busiest ones (0: never); `xid_events`, `kernel_log` (/dev/kmsg) and
        `docker_socket` turn on the watchers for the immediate events; a container's exit carries its
        last `container_log_lines` log lines; `ras` asks NCCL's RAS while a job's ranks here idle;
        `files` are the files the node must have, `checks` the operator's own check scripts, `logs`
        their log patterns; `listen` the accept queue of the node's own daemon; `cgroups` each
        container's CPU and memory, looked at with the busiest processes; `own_pressure` reads the CPU
        pressure of the sampler's own cgroup."""
        if interval_s <= 0:
            raise ValueError("interval_s must be positive")
        self.node_id = node_id
        self.nvml = nvml if isinstance(nvml, NvmlReader) else NvmlReader(nvml)
        self.processes = processes
        self.probes = list(probes)
        self.interval_s = interval_s
        self.host = host
        self.holder_scan_interval_s = holder_scan_interval_s
        self.top_interval_s = top_interval_s
        self._usage: dict[int, ProcessUsage] = {}
        self._usage_read_at: float | None = None
        self.health_interval_s = health_interval_s
        self.health_refresh_s = health_refresh_s
        self._health_read_at: float | None = None
        self._health_sent: dict[int, tuple[GpuHealth, float]] = {}
        """Per GPU index, the health figures it last sent, and when (monotonic)."""
        self._clock = clock
        self._sleep = sleep
        self.own_pressure = own_pressure
        self.skipped_ticks = 0
        self.dropped_events = 0
        self.ras = ras
        self.files = files
        self.checks = checks
        self.logs = logs
        self.listen = listen
        self.cgroups = cgroups
        self._cgroups_read_at: float | None = None
        self.xid_watcher = XidWatcher(self.nvml, self._xid_from_thread) if xid_events else None
        self.kernel_watcher = KernelLogWatcher(kernel_log, self._oom) if kernel_log else None
        self.containers = (DockerWatcher(docker_socket, self._container_exit, log_lines=container_log_lines)
                           if docker_socket else None)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._pending: asyncio.Queue[Event] = asyncio.Queue()
        self._holders: dict[int, tuple[str, ...]] = {}
        self._holders_scanned_at: float | None = None
        self._lost: set[int] = set()
        self._uuids: dict[int, str] = {}
        self._gpu_count: int | None = None
        self.last: NodeSampled | None = None
        """The latest sample: what `/metrics` serves per GPU (no second NVML pass)."""
        self.last_health: dict[int, GpuHealth] = {}
        """Per GPU index, its last health figures (the samples between health reads have none)."""
        self.last_xid: dict[int, int] = {}
        """Per GPU index, the last XID the driver reported (dcgm-exporter's DCGM_FI_DEV_XID_ERRORS)."""
        self.unacknowledged = 0
        """Samples the bus did not acknowledge since the start: each sample says how many."""

    async def sample(self, due: float | None = None, missed_ticks: int = 0) -> NodeSampled:
        """One sample of the node now, due at `due` (on the monotonic clock; None: now), `missed_ticks`
        skipped since the last; GPUs newly lost also go out as `GpuLost` events."""
        occurred_at = datetime.now(UTC)
        due_at = occurred_at - timedelta(seconds=max(0.0, self._clock() - due)) if due is not None else occurred_at
        (reading, processes, host, holders, notes), jobs = await asyncio.gather(
            asyncio.to_thread(self._read_host), self._observe_jobs()
        )
        self._note_lost_gpus(reading, occurred_at)
        self.last = assemble_sample(
            node_id=self.node_id,
            interval_s=self.interval_s,
            occurred_at=occurred_at,
            nvml=reading,
            processes=processes,
            jobs=jobs,
            errors=notes,
            host=host,
            holders=holders,
            container_exists=self.containers.exists if self.containers else None,
            unacknowledged=self.unacknowledged,
            due_at=due_at,
            missed_ticks=missed_ticks,
            sampler_cpu_pressure=self.own_pressure() if self.own_pressure is not None else None,
        )
        if any(gpu.health is not None for gpu in self.last.gpus):
            self.last = self._unchanged_health_left_out(self.last)
        if self.ras is not None:
            ports = {pid: info.job.ras_port for pid, info in processes.items() if info.job is not None and info.job.ras_port}
            self.last = self.ras.observe(self.last, ports)
        operators = {name: watch.observe() for name, watch in (("files", self.files), ("checks", self.checks), ("logs", self.logs))
                     if watch is not None}
        if operators:  # what the operator asked to watch: files, their own checks, their log patterns
            self.last = self.last.model_copy(update=operators)
        if self.listen is not None and (backlog := self.listen.report(self.node_id, self.listen.read(), occurred_at)) is not None:
            self.emit(backlog)
        return self.last

    def _unchanged_health_left_out(self, sample: NodeSampled) -> NodeSampled:
        """The health figures travel when they changed, or to refresh a consumer that started since:
        unchanged ones would cost every consumer a parse of 20 figures per GPU for nothing."""
        now = self._clock()
        gpus, thinned = [], False
        for gpu in sample.gpus:
            health = gpu.health
            if health is not None:
                self.last_health[gpu.index] = health
                sent = self._health_sent.get(gpu.index)
                if sent is not None and sent[0] == health and now - sent[1] < self.health_refresh_s:
                    gpu, thinned = gpu.model_copy(update={"health": None}), True
                else:
                    self._health_sent[gpu.index] = (health, now)
            gpus.append(gpu)
        return sample.model_copy(update={"gpus": tuple(gpus)}) if thinned else sample

    async def run(self, publish: Publish) -> None:
        """Sample and publish every `interval_s`, and publish the immediate events, until cancelled."""
        self._loop = asyncio.get_running_loop()
        helpers = [asyncio.create_task(self._publish_events(publish), name=f"{self.node_id}-events")]
        for watcher in (self.kernel_watcher, self.containers):
            if watcher is not None:
                helpers.append(asyncio.create_task(watcher.run(), name=f"{self.node_id}-{type(watcher).__name__}"))
        if self.xid_watcher is not None:
            self.xid_watcher.start()
        try:
            await self._sample_loop(publish)
        finally:
            await stop_tasks(helpers)
            if self.ras is not None:
                await self.ras.close()
            for watch in (self.files, self.checks, self.logs):
                if watch is not None:
                    await watch.close()
            if self.xid_watcher is not None:
                await asyncio.to_thread(self.xid_watcher.stop)

    async def _sample_loop(self, publish: Publish) -> None:
        start = self._clock()
        tick, missed = 0, 0
        while True:
            try:
                event = await self.sample(start + tick * self.interval_s, missed)
            except Exception:
                # sample() guards every source; reaching here is a bug, but the node stays visible
                log.exception("%s: sample failed", self.node_id)
            else:
                try:
                    # A sample is superseded by the next one: waiting longer than an interval for a
                    # lost acknowledgement (its server killed mid-publish) would stall the loop
                    # until the detector calls this node silent while every other node samples.
                    # (asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancellation)
                    async with asyncio.timeout(max(self.interval_s, PUBLISH_WAIT_MIN_S)):
                        await publish(event)
                except Exception as exc:
                    self.unacknowledged += 1  # the next sample says so
                    log.warning("%s: sample not published (%r); next try in %.1fs", self.node_id, exc, self.interval_s)
            following = next_tick(start, self._clock(), self.interval_s, tick)
            missed = following - tick - 1  # the next sample says so: the gap is lateness, not silence
            if missed:
                self.skipped_ticks += missed
                log.warning("%s: sampling fell behind, skipped %d tick(s)", self.node_id, missed)
            tick = following
            await self._sleep(max(0.0, start + tick * self.interval_s - self._clock()))

    def close(self) -> None:
        """Give NVML back: the XID watcher's session too, since a second cancellation can cut short
        the wait for it at the end of `run` (stopping it twice is harmless)."""
        if self.xid_watcher is not None:
            self.xid_watcher.stop()
        self.nvml.shutdown()

    # --- immediate events ---------------------------------------------------------------------

    def emit(self, event: Event) -> None:
        """Queue an immediate event for publishing (call on the event loop)."""
        if self._pending.qsize() >= MAX_PENDING_EVENTS:
            dropped = self._pending.get_nowait()
            self.dropped_events += 1
            log.error("%s: %d events wait for NATS; dropped the oldest (%s)", self.node_id, MAX_PENDING_EVENTS, dropped.subject)
        self._pending.put_nowait(event)

    def _xid_from_thread(self, reading: XidReading) -> None:
        # called on the XID watcher's own thread
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(self._xid, reading)

    def _xid(self, reading: XidReading) -> None:
        log.warning("%s: XID %d on gpu %s", self.node_id, reading.xid, reading.gpu_index)
        if reading.gpu_index is not None:
            self.last_xid[reading.gpu_index] = reading.xid
        self.emit(xid_event(self.node_id, reading, datetime.now(UTC)))

    def _oom(self, reading: OomKillReading) -> None:
        event = oom_event(self.node_id, reading, datetime.now(UTC))
        if event is None:
            log.warning("%s: OOM kill with impossible pid %d in the kernel log, not reported", self.node_id, reading.pid)
            return
        gpu = next(((g.index, p.command) for g in (self.last.gpus if self.last else ()) for p in g.processes if p.pid == event.pid), None)
        if gpu is not None:  # a job's process: which GPU it computed on (a job outside any container has no other trace)
            event = event.model_copy(update={"gpu_index": gpu[0], "command": gpu[1]})
        log.warning("%s: OOM killer ended pid %d (%s)", self.node_id, event.pid, event.process_name)
        self.emit(event)

    def _container_exit(self, reading: ContainerExitReading) -> None:
        event = container_event(self.node_id, reading, datetime.now(UTC))
        if event is None:
            log.warning("%s: container exit without a container id, not reported", self.node_id)
            return
        self.emit(event)

    def _note_lost_gpus(self, reading: NvmlReading, at: datetime) -> None:
        for gpu in reading.gpus:
            if gpu.uuid:
                self._uuids[gpu.index] = gpu.uuid
        lost = lost_gpus(self._uuids, reading)
        # a GPU gone from the device list is lost too (the driver dropped it)
        if reading.gpus and self._gpu_count is not None and len(reading.gpus) < self._gpu_count:
            for index in range(len(reading.gpus), self._gpu_count):
                lost.setdefault(index, self._uuids.get(index, ""))
        if reading.gpus:
            self._gpu_count = max(self._gpu_count or 0, len(reading.gpus))
        for index, uuid in sorted(lost.items()):
            if index not in self._lost:
                present = index < len(reading.gpus)
                reason = "NVMLError_GpuIsLost" if present else "gone from NVML's device list"
                log.error("%s: gpu %d lost (%s)", self.node_id, index, reason)
                self.emit(gpu_lost_event(self.node_id, index, uuid, reason, at))
        if not reading.gpus:
            return  # NVML itself unreadable: nothing new is known about any GPU
        for index in sorted(self._lost - lost.keys()):
            log.warning("%s: gpu %d answers again", self.node_id, index)
        self._lost = set(lost)

    async def _publish_events(self, publish: Publish) -> None:
        """Publish queued immediate events in order; retry one that fails until it goes out."""
        while True:
            event = await self._pending.get()
            while True:
                try:
                    await publish(event)
                    break
                except Exception as exc:
                    log.warning("%s: %s not published (%r); retrying", self.node_id, event.subject, exc)
                    await asyncio.sleep(EVENT_RETRY_S)

    # --- the blocking part of a sample ---------------------------------------------------------

    def _read_host(
        self,
    ) -> tuple[NvmlReading, dict[int, ProcessInfo], HostReading | None, dict[int, tuple[str, ...]], list[str]]:
        """NVML, /proc for the pids NVML named and the device holders, and the host. Blocking:
        runs in a worker thread."""
        now = self._clock()
        health = self._health_read_at is None or now - self._health_read_at >= self.health_interval_s
        if health:
            self._health_read_at = now
        reading = self.nvml.read(health=health)
        notes: list[str] = []
        holders = self._device_holders(notes)
        processes: dict[int, ProcessInfo] = {}
        for pid in (p.pid for gpu in reading.gpus for p in gpu.processes or ()):
            if pid not in processes and (info := self.processes.describe(pid, notes)) is not None:
                processes[pid] = info
        # holders come from the last scan: one that has exited since is dropped, not noted
        for pid in list(holders):
            if pid not in processes:
                info = self.processes.describe(pid)
                if info is None:
                    holders = {k: v for k, v in holders.items() if k != pid}
                else:
                    processes[pid] = info
        host = None
        if self.host is not None:
            try:
                host = self.host.read()
            except Exception as exc:  # a reader bug must cost the host part, not the sample
                log.exception("%s: host read failed", self.node_id)
                notes.append(f"host: {type(exc).__name__}")
            else:
                host = replace(host, top=self._top_processes(notes), containers=self._container_usage(notes))
        return reading, processes, host, holders, notes

    def _container_usage(self, notes: list[str]) -> tuple[ContainerUsage, ...]:
        """Each container's CPU and memory, at the busiest processes' pace and in the same samples."""
        if self.cgroups is None or self.top_interval_s <= 0:
            return ()
        now = self._clock()
        if self._cgroups_read_at is not None and now - self._cgroups_read_at < self.top_interval_s:
            return ()
        elapsed = now - self._cgroups_read_at if self._cgroups_read_at is not None else 0.0
        self._cgroups_read_at = now
        return self.cgroups.read(elapsed, notes)

    def _top_processes(self, notes: list[str]) -> tuple[TopReading, ...]:
        """The busiest processes, from two looks at every process `top_interval_s` apart (a look
        reads one /proc file per process). They travel in the sample after each look only: every
        consumer would parse them again in every sample between, for an answer that has not changed."""
        if self.top_interval_s <= 0:
            return ()
        now = self._clock()
        if self._usage_read_at is not None and now - self._usage_read_at < self.top_interval_s:
            return ()
        usage = self.processes.usage(notes)
        elapsed = now - self._usage_read_at if self._usage_read_at is not None else 0.0
        top = top_processes(self._usage, usage, elapsed, self.processes.describe)
        self._usage, self._usage_read_at = usage, now
        return top

    def _device_holders(self, notes: list[str]) -> dict[int, tuple[str, ...]]:
        """The /dev/nvidia* holders as of the last scan; scanning every fd of every process is
        the costliest read here, so it runs every `holder_scan_interval_s`, not every sample."""
        if self.holder_scan_interval_s <= 0:
            return {}
        now = self._clock()
        if self._holders_scanned_at is None or now - self._holders_scanned_at >= self.holder_scan_interval_s:
            self._holders = self.processes.device_holders(notes)
            self._holders_scanned_at = now
        return self._holders

    async def _observe_jobs(self) -> list[JobsReading]:
        results = await asyncio.gather(*(p.observe() for p in self.probes), return_exceptions=True)
        readings = []
        for probe, result in zip(self.probes, results, strict=True):
            if isinstance(result, BaseException):
                if isinstance(result, asyncio.CancelledError):
                    raise result
                readings.append(JobsReading(errors=(f"{type(probe).__name__}: {type(result).__name__}",)))
            else:
                readings.append(result)
        return readings
