"""Kernel OOM kills: the record and line parsers on real kernel formats, and the watcher over
FIFOs, regular files, an unreadable path and (read-only) the real /dev/kmsg."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from node_sampler.kernel import KernelLogWatcher, OomParser, parse_kmsg_record, split_kmsg_record
from node_sampler.immediate import OomKillReading
from tests.fixtures.real import missing

CID = "9d3c1f0e8b7a6c5d4e3f2a1b0c9d8e7f6a5b4c3d2e1f0a9b8c7d6e5f4a3b2c1d"
POD = "/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod7c1e2a3b_4d5e_6f70_8192_a3b4c5d6e7f8.slice"
MEMCG_SUMMARY = (
    f"oom-kill:constraint=CONSTRAINT_MEMCG,nodemask=(null),cpuset=cri-containerd-{CID}.scope,mems_allowed=0-1,"
    f"oom_memcg={POD},task_memcg={POD}/cri-containerd-{CID}.scope,task=python3,pid=2771813,uid=1000"
)
MEMCG_KILLED = (
    "Memory cgroup out of memory: Killed process 2771813 (python3) total-vm:98765432kB, anon-rss:83886080kB, "
    "file-rss:102400kB, shmem-rss:0kB, UID:1000 pgtables:170000kB oom_score_adj:985"
)
GLOBAL_SUMMARY = (
    "oom-kill:constraint=CONSTRAINT_NONE,nodemask=(null),cpuset=/,mems_allowed=0,global_oom,"
    "task_memcg=/user.slice/user-0.slice/session-4.scope,task=stress-ng-vm,pid=4242,uid=0"
)
GLOBAL_KILLED = (
    "Out of memory: Killed process 4242 (stress-ng-vm) total-vm:4366844kB, anon-rss:3930112kB, file-rss:1024kB, "
    "shmem-rss:32kB, UID:0 pgtables:7724kB oom_score_adj:1000"
)


def kmsg(seq: int, message: str, prio: int = 3, dictionary: str = "") -> str:
    return f"{prio},{seq},{1000 + seq * 17},-;{message}\n{dictionary}"


# --- records --------------------------------------------------------------------------------------


def test_kmsg_records():
    assert (
        parse_kmsg_record("6,1234,5678901,-;usb 1-1: new high-speed USB device\n")
        == "usb 1-1: new high-speed USB device"
    )
    # a record with its dictionary: the continuation lines are not the message
    record = (
        "3,99,123,-;NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.\n"
        " SUBSYSTEM=pci\n"
        " DEVICE=+pci:0000:18:00.0\n"
    )
    assert split_kmsg_record(record) == (99, "NVRM: Xid (PCI:0000:18:00): 79, GPU has fallen off the bus.")
    # newer kernels may add header fields (the caller id); a ';' inside the message stays in it
    assert parse_kmsg_record("4,7,8,-,caller=T123;a; b\n") == "a; b"
    # non-printable bytes come escaped
    assert parse_kmsg_record("6,1,2,-;tab\\x09here \\x5c\n") == "tab\there \\"


@pytest.mark.parametrize("record", ["no header at all", "", "6,1;short header", "x,1,2,-;letters", " SUBSYSTEM=pci"])
def test_records_without_a_header(record):
    assert parse_kmsg_record(record) is None


# --- OOM lines ------------------------------------------------------------------------------------


def test_a_memcg_oom_kill_in_a_kubernetes_container():
    parser = OomParser()
    assert parser.feed("python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=985") is None
    assert parser.feed(MEMCG_SUMMARY) is None

    reading = parser.feed(MEMCG_KILLED)

    assert reading == OomKillReading(
        pid=2771813,
        process_name="python3",
        uid=1000,
        constraint="CONSTRAINT_MEMCG",
        cgroup=f"{POD}/cri-containerd-{CID}.scope",  # the task's cgroup, not the pod's (oom_memcg)
        container_id=CID,
        anon_rss_kib=83886080,
        kernel_lines=(MEMCG_SUMMARY, MEMCG_KILLED),
    )
    # the summary was used up: a later kill of the same pid without one carries none
    assert parser.feed(MEMCG_KILLED).constraint == ""


def test_a_global_oom_kill_of_a_host_process():
    parser = OomParser()
    parser.feed(GLOBAL_SUMMARY)
    # other CPUs' lines may come between the summary and the kill
    assert parser.feed("oom_reaper: reaped process 4100 (x), now anon-rss:0kB, file-rss:0kB, shmem-rss:0kB") is None

    reading = parser.feed(GLOBAL_KILLED)

    assert (reading.pid, reading.process_name, reading.uid, reading.constraint) == (
        4242,
        "stress-ng-vm",
        0,
        "CONSTRAINT_NONE",
    )
    assert (reading.cgroup, reading.container_id) == ("/user.slice/user-0.slice/session-4.scope", "")
    assert reading.anon_rss_kib == 3930112
    assert reading.kernel_lines == (GLOBAL_SUMMARY, GLOBAL_KILLED)


@pytest.mark.parametrize(
    ("line", "pid", "name", "uid", "anon"),
    [
        # 4.x: no oom-kill: line, no prefix, no UID
        (
            "Killed process 1234 (python) total-vm:1234567kB, anon-rss:1000000kB, file-rss:4321kB, shmem-rss:0kB",
            1234,
            "python",
            None,
            1000000,
        ),
        # 3.x: not even shmem-rss
        ("Killed process 99 (java) total-vm:2000kB, anon-rss:1500kB, file-rss:12kB", 99, "java", None, 1500),
        # RHEL 7
        (
            "Killed process 31337 (java), UID 1001, total-vm:9000kB, anon-rss:8000kB, file-rss:0kB, shmem-rss:0kB",
            31337,
            "java",
            1001,
            8000,
        ),
        # a comm with spaces and parentheses
        (
            "Out of memory: Killed process 77 (my (odd) job) total-vm:10kB, anon-rss:5kB, file-rss:0kB, "
            "shmem-rss:0kB, UID:7 pgtables:4kB oom_score_adj:0",
            77,
            "my (odd) job",
            7,
            5,
        ),
    ],
)
def test_older_and_odd_killed_lines(line, pid, name, uid, anon):
    reading = OomParser().feed(line)

    assert (reading.pid, reading.process_name, reading.uid, reading.anon_rss_kib) == (pid, name, uid, anon)
    assert (reading.cgroup, reading.constraint, reading.kernel_lines) == ("", "", (line,))


def test_a_summary_of_another_pid_is_not_merged():
    parser = OomParser()
    parser.feed(GLOBAL_SUMMARY)  # pid 4242

    reading = parser.feed(MEMCG_KILLED)  # pid 2771813

    assert reading.pid == 2771813 and reading.cgroup == "" and reading.kernel_lines == (MEMCG_KILLED,)
    assert reading.uid == 1000  # from the Killed line itself


def test_an_unparsable_killed_line_is_warned_about_and_counted(caplog):
    parser = OomParser()
    line = "Out of memory: Killed process python total-vm:lots " + "x" * 300
    with caplog.at_level(logging.WARNING, logger="node_sampler.kernel"):
        assert parser.feed(line) is None
        assert parser.feed("usb 1-1: new high-speed USB device number 2 using xhci_hcd") is None

    assert parser.malformed == 1
    assert len(caplog.records) == 1
    message = caplog.records[0].getMessage()
    assert line[:200] in message and line[:201] not in message


# --- the watcher ----------------------------------------------------------------------------------


class Watch:
    """A watcher running in the background; `stop()` cancels it and says it ended cleanly."""

    def __init__(self, path: Path, **kwargs) -> None:
        self.readings: list[OomKillReading] = []
        self.watcher = KernelLogWatcher(path, self.readings.append, **kwargs)
        self.task = asyncio.create_task(self.watcher.run())

    async def until(self, predicate, timeout: float = 3.0) -> None:
        deadline = time.monotonic() + timeout
        while not predicate():
            if self.task.done():
                self.task.result()
                raise AssertionError("the watcher ended")
            if time.monotonic() > deadline:
                raise AssertionError("timed out")
            await asyncio.sleep(0.01)

    async def stop(self) -> None:
        self.task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await self.task


def open_fds_to(path: Path) -> int:
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        with contextlib.suppress(OSError):
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
    return count


async def test_a_fifo_in_arbitrary_chunks(tmp_path):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    writer = os.open(fifo, os.O_RDWR | os.O_NONBLOCK)
    try:
        watch = Watch(fifo, retry_s=0.05)
        await watch.until(lambda: watch.watcher.active)
        assert open_fds_to(fifo) == 2
        data = (
            kmsg(1, "python3 invoked oom-killer: gfp_mask=0xcc0(GFP_KERNEL), order=0, oom_score_adj=0", 4)
            + kmsg(2, MEMCG_SUMMARY, 6, dictionary=" SUBSYSTEM=memory\n")
            + "a line without a header\n"
            + kmsg(3, MEMCG_KILLED)
        ).encode()
        # a record split across writes (and reads) is put back together
        for part in (data[:50], data[50:400], data[400:]):
            os.write(writer, part)
            await asyncio.sleep(0.02)
        await watch.until(lambda: watch.readings)

        assert [r.pid for r in watch.readings] == [2771813]
        assert watch.readings[0].container_id == CID
        assert watch.readings[0].kernel_lines == (MEMCG_SUMMARY, MEMCG_KILLED)
        assert watch.watcher.records == 3 and watch.watcher.malformed_records == 1
        await watch.stop()
        # cancelled: its fd is closed, only the test's writer is left
        assert open_fds_to(fifo) == 1
        assert not watch.watcher.active
    finally:
        os.close(writer)


async def test_a_fifo_without_writer_is_waited_on_quietly(tmp_path, caplog):
    fifo = tmp_path / "kmsg"
    os.mkfifo(fifo)
    with caplog.at_level(logging.DEBUG, logger="node_sampler.kernel"):
        watch = Watch(fifo, retry_s=0.05)
        await watch.until(lambda: watch.watcher.active)
        cpu = time.process_time()
        await asyncio.sleep(0.5)
        spent = time.process_time() - cpu
        # end of file over and over: a loop that spun on it would burn the whole half second
        assert spent < 0.2
        writer = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        try:
            os.write(writer, (kmsg(10, GLOBAL_SUMMARY, 6) + kmsg(11, GLOBAL_KILLED)).encode())
            await watch.until(lambda: watch.readings)
        finally:
            os.close(writer)
        await watch.stop()

    assert watch.readings[0].pid == 4242
    assert [r for r in caplog.records if r.levelno >= logging.WARNING] == []


async def test_a_regular_file_read_from_its_start_and_followed(tmp_path):
    log_file = tmp_path / "kmsg.log"
    log_file.write_text(kmsg(1, GLOBAL_SUMMARY, 6) + kmsg(2, GLOBAL_KILLED))
    watch = Watch(log_file, skip_backlog=False, retry_s=0.05)
    await watch.until(lambda: len(watch.readings) == 1)
    # appended later: picked up by polling (epoll refuses regular files)
    with log_file.open("a") as f:
        f.write(kmsg(3, MEMCG_SUMMARY, 6) + kmsg(4, MEMCG_KILLED))
    await watch.until(lambda: len(watch.readings) == 2)
    await watch.stop()

    assert [r.pid for r in watch.readings] == [4242, 2771813]


async def test_the_backlog_is_skipped_by_default(tmp_path):
    log_file = tmp_path / "kmsg.log"
    log_file.write_text(kmsg(1, GLOBAL_KILLED))
    watch = Watch(log_file, retry_s=0.05)
    await watch.until(lambda: watch.watcher.active)
    with log_file.open("a") as f:
        f.write(kmsg(2, MEMCG_KILLED))
    await watch.until(lambda: watch.readings)
    await asyncio.sleep(0.1)
    await watch.stop()

    assert [r.pid for r in watch.readings] == [2771813]
    assert watch.watcher.records == 1


async def test_a_failing_callback_does_not_stop_the_watcher(tmp_path, caplog):
    log_file = tmp_path / "kmsg.log"
    log_file.write_text(kmsg(1, GLOBAL_KILLED) + kmsg(2, MEMCG_KILLED))
    seen: list[int] = []

    def on_oom(reading: OomKillReading) -> None:
        seen.append(reading.pid)
        if len(seen) == 1:
            raise RuntimeError("publisher down")

    watcher = KernelLogWatcher(log_file, on_oom, skip_backlog=False, retry_s=0.05)
    task = asyncio.create_task(watcher.run())
    deadline = time.monotonic() + 3
    while len(seen) < 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.01)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task

    assert seen == [4242, 2771813]
    assert any("on_oom failed" in r.getMessage() for r in caplog.records)


async def test_an_unreadable_kernel_log_turns_the_events_off_with_one_line(tmp_path, caplog):
    missing = tmp_path / "no-kmsg"
    with caplog.at_level(logging.DEBUG, logger="node_sampler.kernel"):
        watcher = KernelLogWatcher(missing, lambda r: None)
        await asyncio.wait_for(watcher.run(), 2)  # returns instead of watching

    assert [r.getMessage() for r in caplog.records] == [
        f"OOM-kill events off: cannot read {missing} (FileNotFoundError)"
    ]
    assert not watcher.active


_WATCH_AS_NOBODY = """
import asyncio, logging, os, sys
from node_sampler.kernel import KernelLogWatcher
logging.basicConfig(level=logging.DEBUG, format="%(name)s %(levelname)s %(message)s", stream=sys.stdout)
os.setgroups([]); os.setgid(65534); os.setuid(65534)
asyncio.run(asyncio.wait_for(KernelLogWatcher(sys.argv[1], print).run(), 5))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to become another user")
def test_without_permission_it_says_what_is_needed(tmp_path):
    secret = tmp_path / "kmsg"
    secret.write_text("")
    secret.chmod(0o600)
    out = subprocess.run(
        [sys.executable, "-c", _WATCH_AS_NOBODY, str(secret)], capture_output=True, text=True, timeout=30
    )

    assert out.returncode == 0, out.stderr
    lines = [line for line in out.stdout.splitlines() if line.startswith("node_sampler.")]
    assert lines == [
        f"node_sampler.kernel WARNING OOM-kill events off: cannot read {secret} (PermissionError); "
        "the sampler needs CAP_SYSLOG or root for them"
    ]


async def test_an_overrun_is_warned_once_with_the_records_lost(tmp_path, caplog):
    # EPIPE cannot be made on a FIFO; this drives the watcher's own reaction to it
    watcher = KernelLogWatcher(tmp_path / "unused", lambda r: None)
    watcher._take(kmsg(5, "before").encode())
    with caplog.at_level(logging.WARNING, logger="node_sampler.kernel"):
        watcher._overran = True  # what reading /dev/kmsg after it wrapped (EPIPE) sets
        watcher._take((kmsg(9, "after") + kmsg(10, "next")).encode())

    assert [r.getMessage() for r in caplog.records] == ["kernel log overran: 3 records lost"]
    assert watcher.lost_records == 3 and watcher.records == 3


async def test_the_real_kmsg_reads_record_by_record():
    """A marker written to the real /dev/kmsg comes back through the watcher, whole. Where it cannot
    be written (not root, a container without the device) the test is skipped, but never under CI."""
    marker = f"gpumedic-test-marker-{uuid.uuid4().hex}"
    try:
        os.close(os.open("/dev/kmsg", os.O_RDONLY | os.O_NONBLOCK))
        writer = os.open("/dev/kmsg", os.O_WRONLY)
    except OSError as exc:
        missing(f"a /dev/kmsg this test can read and write ({type(exc).__name__}: {exc})")
    watch = Watch(Path("/dev/kmsg"), skip_backlog=True)
    messages: list[str] = []
    feed = watch.watcher.parser.feed
    watch.watcher.parser.feed = lambda message: (messages.append(message), feed(message))[1]
    try:
        await asyncio.sleep(0.2)  # the watcher is at the end of the log
        os.write(writer, f"<6>{marker}\n".encode())
        await watch.until(lambda: marker in messages, timeout=5.0)
    finally:
        os.close(writer)
        await watch.stop()
    assert watch.watcher.bad_records == 0


async def test_an_oom_kill_of_a_gpu_process_names_its_gpu_and_command(tmp_path):
    """Through the real sampler and its kernel-log watcher: the killed pid computed on GPU 0 in the
    last sample (a job outside any container, killed by the host's OOM killer)."""
    from gpumedic_events import ProcessOomKilled

    from node_sampler.sampler import Sampler
    from tests.node_sampler.fakes import table_for_two_gpus, two_gpus

    log_file = tmp_path / "kmsg.log"
    log_file.write_text("")
    published: list = []

    async def publish(event) -> None:
        published.append(event)

    sampler = Sampler("n1", two_gpus(), table_for_two_gpus(), [], 0.2, kernel_log=log_file)
    task = asyncio.create_task(sampler.run(publish))
    try:
        deadline = time.monotonic() + 5
        while not published and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        with log_file.open("a") as f:  # pid 41230 is the job on GPU 0 of two_gpus()
            f.write(kmsg(1, GLOBAL_SUMMARY.replace("pid=4242", "pid=41230")) + kmsg(2, GLOBAL_KILLED.replace("process 4242", "process 41230")))
        while not any(isinstance(e, ProcessOomKilled) for e in published) and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sampler.close()
    (oom,) = [e for e in published if isinstance(e, ProcessOomKilled)]
    assert (oom.pid, oom.gpu_index, oom.command, oom.container_id) == (41230, 0, "python train.py --epochs 90", "")
