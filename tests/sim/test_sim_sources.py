"""The simulated node's process table, host and kernel log, read as the real sampler reads them."""

from __future__ import annotations

import asyncio
import os
import re
import time
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_sim.machine.host import SimHost
from gpumedic_sim.machine.kernel import SimKernelLog
from gpumedic_sim.machine.procs import SimProcessTable
from gpumedic_sim.machine.parts import CLK_TCK
from gpumedic_sim.machine.state import NodeState
from node_sampler.kernel import KernelLogWatcher, OomParser, split_kmsg_record
from node_sampler.immediate import OomKillReading
from node_sampler.readings import HostReading
from node_sampler.procs import container_id_from_cgroup

CID = "c0ffee" + "0123456789abcdef" * 3 + "0123456789"


# --- processes ------------------------------------------------------------------------------------


def test_describe_gives_the_identity_the_real_table_would():
    node = NodeState("sim-node-01", 2, seed=7)
    job = node.start_job(0, started_ago_s=3600)
    job.user, job.container_id = "ml", CID
    shell = node.start_job(1)
    shell.user, shell.container_id = "root", ""
    table = SimProcessTable(node)

    info = table.describe(job.pid)
    host = table.describe(shell.pid)

    assert (info.pid, info.start_ticks, info.command) == (job.pid, job.start_ticks, job.command)
    assert (info.user, info.container_id) == ("ml", CID)
    # the cgroup path is one the real parser reads the same container id from
    assert container_id_from_cgroup(info.cgroup) == CID
    assert (host.user, host.container_id, container_id_from_cgroup(host.cgroup)) == ("root", "", "")
    # boot + ticks / CLK_TCK: an hour ago, and consistent with the start ticks to the tick
    assert abs(info.started_at - (datetime.now(UTC) - timedelta(hours=1))) < timedelta(seconds=1)
    assert host.started_at - info.started_at == timedelta(seconds=(shell.start_ticks - job.start_ticks) / CLK_TCK)
    assert info.started_at.tzinfo is not None


def test_a_dead_process_is_not_described():
    node = NodeState("sim-node-01", 1, seed=7)
    job = node.start_job(0)
    node.kill(job.pid)
    errors: list[str] = []

    assert SimProcessTable(node).describe(job.pid, errors) is None
    assert errors == [f"pid {job.pid}: not in /proc (exited, or another pid namespace)"]


def test_device_holders_are_the_live_processes_holding_devices():
    node = NodeState("sim-node-01", 2, seed=7)
    a = node.start_job(0)
    b = node.start_job(1)
    c = node.start_job(1)
    a.devices = ("/dev/nvidiactl", "/dev/nvidia0", "/dev/nvidia-uvm")
    b.devices = ("/dev/nvidia1", "/dev/nvidiactl")
    c.devices = ()
    table = SimProcessTable(node)

    assert table.device_holders() == {
        a.pid: ("/dev/nvidia-uvm", "/dev/nvidia0", "/dev/nvidiactl"),
        b.pid: ("/dev/nvidia1", "/dev/nvidiactl"),
    }
    node.kill(b.pid)
    assert set(table.device_holders()) == {a.pid}


# --- host -----------------------------------------------------------------------------------------


def test_a_big_gpu_host_by_default():
    reading = SimHost().read()

    assert isinstance(reading, HostReading) and reading.errors == ()
    assert reading.memory_total_kib == 2 * 1024**3  # 2 TiB in KiB
    assert 0 < reading.memory_available_kib <= reading.memory_total_kib
    assert [d.path for d in reading.disks] == ["/", "/var/lib/docker", "/data"]
    for d in reading.disks:
        assert 0 < d.used_bytes < d.total_bytes and d.available_bytes == d.total_bytes - d.used_bytes
    assert reading.cpus >= 64 and len(reading.load) == 3


def test_fill_disk():
    host = SimHost()
    host.fill_disk("/var/lib/docker")
    host.fill_disk("/data", pct=50.0)
    disks = {d.path: d for d in host.read().disks}

    assert disks["/var/lib/docker"].available_bytes == 0
    assert disks["/var/lib/docker"].used_bytes == disks["/var/lib/docker"].total_bytes
    assert disks["/data"].used_bytes == disks["/data"].total_bytes // 2
    assert disks["/"].available_bytes > 0
    with pytest.raises(ValueError, match="no disk at /scratch"):
        host.fill_disk("/scratch")
    with pytest.raises(ValueError):
        host.fill_disk("/", pct=101)


def test_attributes_are_what_is_read():
    host = SimHost(disks={"/": (1000, 10)})
    host.memory_available_kib = 1234
    host.load = (99.0, 50.0, 10.0)

    reading = host.read()

    assert (reading.memory_available_kib, reading.load) == (1234, (99.0, 50.0, 10.0))
    assert [(d.path, d.total_bytes, d.used_bytes, d.available_bytes) for d in reading.disks] == [("/", 1000, 10, 990)]


# --- kernel log -----------------------------------------------------------------------------------


def drain(path) -> list[str]:
    """Every record waiting in the FIFO, read by a second reader end."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    data = b""
    try:
        while True:
            try:
                chunk = os.read(fd, 65536)
            except BlockingIOError:
                break
            if not chunk:
                break
            data += chunk
    finally:
        os.close(fd)
    return [line for line in data.decode().split("\n") if line and not line.startswith(" ")]


def test_records_in_kmsg_format_with_increasing_seq_and_time(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg", boot=time.monotonic() - 100)
    try:
        log.write("first", prio=6, fields={"SUBSYSTEM": "pci"})
        log.write("second\nthird")
        records = drain(log.path)
    finally:
        log.close()

    parsed = [split_kmsg_record(r) for r in records]
    assert [m for _, m in parsed] == ["first", "second", "third"]
    assert [s for s, _ in parsed] == [0, 1, 2]
    usecs = [int(r.split(",")[2]) for r in records]
    assert usecs == sorted(usecs) and 100_000_000 <= usecs[0] < 110_000_000  # since the node's boot
    assert records[0].startswith("6,") and records[1].startswith("3,")


def test_an_oom_kill_as_the_kernel_logs_it(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    try:
        lines = log.oom_kill(4321, "python-selfplay-worker", 1000, CID, 31_457_280)
        messages = [split_kmsg_record(r)[1] for r in drain(log.path)]
    finally:
        log.close()

    assert messages == list(lines)
    assert lines[0].startswith("python-selfplay invoked oom-killer: ")  # comm: 15 characters
    parser = OomParser()
    readings = [r for r in (parser.feed(m) for m in messages) if r is not None]
    assert readings == [
        OomKillReading(
            pid=4321,
            process_name="python-selfplay",
            uid=1000,
            constraint="CONSTRAINT_MEMCG",
            cgroup=f"/system.slice/docker-{CID}.scope",
            container_id=CID,
            anon_rss_kib=31_457_280,
            kernel_lines=lines[1:],
        )
    ]


def test_a_host_oom_kill_is_global(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    try:
        lines = log.oom_kill(77, "python", uid=0)
    finally:
        log.close()
    parser = OomParser()
    reading = next(r for r in map(parser.feed, lines) if r is not None)

    assert lines[2].startswith("Out of memory: Killed process 77 (python)")
    assert (reading.constraint, reading.container_id, reading.uid) == ("CONSTRAINT_NONE", "", 0)


def test_a_segfault_line(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    try:
        line = log.segfault(4321, "python")
        (record,) = drain(log.path)
    finally:
        log.close()

    assert split_kmsg_record(record)[1] == line
    assert re.fullmatch(
        r"python\[4321\]: segfault at 0 ip [0-9a-f]{16} sp [0-9a-f]{16} error 4"
        r" in libcuda\.so\.1\[[0-9a-f]+\+[0-9a-f]+\] likely on CPU \d+ \(core \d+, socket 0\)",
        line,
    )
    assert OomParser().feed(line) is None


def test_a_full_fifo_drops_records_instead_of_blocking(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    try:
        start = time.monotonic()
        results = [log.write("x" * 200) for _ in range(2000)]  # ~460 KB into a 64 KiB pipe
        elapsed = time.monotonic() - start
        assert elapsed < 2.0
        assert log.dropped > 0 and log.written > 0 and log.written + log.dropped == 2000
        assert results.count(False) == log.dropped
        # what did get in is whole records, none torn
        records = drain(log.path)
        assert len(records) == log.written and all(split_kmsg_record(r)[1] == "x" * 200 for r in records)
    finally:
        log.close()
    assert not log.path.exists()
    assert log.write("after close") is False


def test_write_record_passes_a_formatted_record_through(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    try:
        assert log.write_record("6,41,123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module")
        (record,) = drain(log.path)
    finally:
        log.close()
    assert record == "6,41,123456,-;NVRM: loading NVIDIA UNIX x86_64 Kernel Module"


async def test_the_real_watcher_sees_a_simulated_oom_kill(tmp_path):
    log = SimKernelLog(tmp_path / "kmsg")
    readings: list[OomKillReading] = []
    watcher = KernelLogWatcher(log.path, readings.append)
    task = asyncio.create_task(watcher.run())
    try:
        deadline = time.monotonic() + 3
        while not watcher.active and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
        log.write("usb 1-1: new high-speed USB device number 2 using xhci_hcd", prio=6)
        log.segfault(111, "python")
        lines = log.oom_kill(4321, "python", 1000, CID, 123_456)
        while not readings and time.monotonic() < deadline:
            await asyncio.sleep(0.01)
    finally:
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        log.close()

    assert len(readings) == 1
    reading = readings[0]
    assert (reading.pid, reading.container_id, reading.anon_rss_kib) == (4321, CID, 123_456)
    assert reading.kernel_lines == lines[1:]
    assert watcher.records == 5 and watcher.malformed_records == 0
