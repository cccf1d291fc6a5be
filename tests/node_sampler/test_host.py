"""The host reader on a proc root written by the test, on the real /proc, and on real disks."""

from __future__ import annotations

import os
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
from gpumedic_bus.lateness import parse_pressure
from gpumedic_events import CpuPressure

from node_sampler.host import DOCKER_ROOT, HostReader, parse_loadavg, parse_meminfo, watched_disks
from node_sampler.readings import RawDisk

MEMINFO = """\
MemTotal:       2113431552 kB
MemFree:        101234567 kB
MemAvailable:   1587654321 kB
Buffers:          123456 kB
Cached:         987654321 kB
SwapCached:            0 kB
SwapTotal:       8388604 kB
SwapFree:        8000000 kB
HugePages_Total:       0
Hugepagesize:       2048 kB
"""


def proc_root(tmp_path: Path, meminfo: str = MEMINFO, loadavg: str = "12.50 10.25 8.00 3/2345 99999\n") -> Path:
    root = tmp_path / "proc"
    root.mkdir()
    (root / "meminfo").write_text(meminfo)
    (root / "loadavg").write_text(loadavg)
    return root


def test_memory_swap_load_and_cpus(tmp_path):
    reading = HostReader(proc_root(tmp_path)).read()

    assert reading.memory_total_kib == 2_113_431_552
    assert reading.memory_available_kib == 1_587_654_321
    assert (reading.swap_total_kib, reading.swap_free_kib) == (8_388_604, 8_000_000)
    assert reading.load == (12.5, 10.25, 8.0)
    assert reading.cpus == os.cpu_count()
    assert reading.disks == () and reading.errors == ()


def test_cpu_pressure_from_the_kernels_psi_file(tmp_path):
    root = proc_root(tmp_path)
    assert HostReader(root).read().cpu_pressure is None  # a kernel without PSI (or psi=0): no figure, no error
    (root / "pressure").mkdir()
    (root / "pressure" / "cpu").write_text("some avg10=61.20 avg60=58.01 avg300=40.00 total=123456789\n"
                                          "full avg10=3.50 avg60=1.00 avg300=0.50 total=456789\n")
    assert HostReader(root).read().cpu_pressure == CpuPressure(some_avg10_pct=61.2, full_avg10_pct=3.5)


@pytest.mark.parametrize("text, expected", [
    ("some avg10=0.13 avg60=5.51 avg300=11.95 total=2390925178\n", CpuPressure(some_avg10_pct=0.13)),  # before 5.13: no full line
    ("full avg10=3.50 avg60=1 avg300=0 total=1\n", None),  # no some line: nothing to say
    ("some avg10=nan avg60=1 avg300=0 total=1\n", None),
    ("some avg10=250.0 avg60=1 avg300=0 total=1\n", None),  # not a share
    ("some avg10=lots\n", None),
    ("", None),
])
def test_malformed_pressure_is_no_figure(text, expected):
    assert parse_pressure(text) == expected


def test_the_real_kernels_pressure_where_it_has_psi():
    if not Path("/proc/pressure/cpu").exists():
        pytest.skip("this kernel has no PSI")
    pressure = HostReader("/proc").read().cpu_pressure
    assert pressure is not None and 0.0 <= pressure.some_avg10_pct <= 100.0


def test_a_malformed_meminfo_line_is_skipped_with_a_note(tmp_path):
    text = MEMINFO.replace("SwapFree:        8000000 kB", "SwapFree:        lots kB") + "garbage line\n"
    reading = HostReader(proc_root(tmp_path, meminfo=text)).read()

    assert reading.memory_total_kib == 2_113_431_552 and reading.swap_total_kib == 8_388_604
    assert reading.swap_free_kib is None
    assert reading.errors == (
        "meminfo: malformed line 'SwapFree:        lots kB' skipped",
        "meminfo: malformed line 'garbage line' skipped",
        "meminfo: no SwapFree",
    )


def test_an_old_kernel_without_memavailable(tmp_path):
    text = "".join(line + "\n" for line in MEMINFO.splitlines() if not line.startswith("MemAvailable"))
    reading = HostReader(proc_root(tmp_path, meminfo=text)).read()

    assert reading.memory_available_kib is None and reading.memory_total_kib == 2_113_431_552
    assert reading.errors == ("meminfo: no MemAvailable",)


@pytest.mark.parametrize("loadavg", ["", "0.5 0.4\n", "a b c 1/2 3\n", "-1 0 0 1/2 3\n", "nan 1 1 1/2 3\n"])
def test_a_malformed_loadavg_costs_the_load_only(tmp_path, loadavg):
    reading = HostReader(proc_root(tmp_path, loadavg=loadavg)).read()

    assert reading.load is None
    assert reading.memory_total_kib == 2_113_431_552
    assert len(reading.errors) == 1 and reading.errors[0].startswith("loadavg: malformed")


def test_missing_proc_files_cost_their_fields(tmp_path):
    root = tmp_path / "empty"
    root.mkdir()
    reading = HostReader(root, [str(tmp_path)]).read()

    assert reading.memory_total_kib is None and reading.load is None
    assert reading.errors == (
        f"{root}/meminfo: unreadable (FileNotFoundError)",
        f"{root}/loadavg: unreadable (FileNotFoundError)",
    )
    assert [d.path for d in reading.disks] == [str(tmp_path)]  # the disks are still read


def test_disks_by_statvfs_arithmetic(tmp_path):
    def statvfs(path: str):
        # 4 KiB fragments; 5 % reserved for root: available < total - used
        return SimpleNamespace(f_bsize=4096, f_frsize=4096, f_blocks=1000, f_bfree=300, f_bavail=250)

    reading = HostReader(proc_root(tmp_path), ["/data"], statvfs=statvfs).read()

    assert reading.disks == (RawDisk("/data", total_bytes=4_096_000, used_bytes=2_867_200, available_bytes=1_024_000),)


def test_a_missing_disk_is_noted_and_the_others_still_read(tmp_path):
    missing = tmp_path / "not-mounted"
    reading = HostReader(proc_root(tmp_path), [str(missing), str(tmp_path)]).read()

    st = os.statvfs(tmp_path)
    assert len(reading.disks) == 1
    disk = reading.disks[0]
    assert disk.path == str(tmp_path)
    assert disk.total_bytes == st.f_blocks * st.f_frsize
    assert 0 < disk.used_bytes <= disk.total_bytes
    assert 0 <= disk.available_bytes <= disk.total_bytes
    assert reading.errors == (f"disk {missing}: FileNotFoundError (No such file or directory)",)


def test_the_real_proc():
    reading = HostReader("/proc", ["/"]).read()

    assert reading.errors == ()
    assert 0 < reading.memory_available_kib <= reading.memory_total_kib
    assert 0 <= reading.swap_free_kib <= reading.swap_total_kib
    assert all(v >= 0 for v in reading.load)
    assert reading.disks[0].path == "/" and reading.disks[0].total_bytes > 0


def test_a_read_is_cheap():
    reader = HostReader("/proc", ["/"])
    reader.read()
    start = time.perf_counter()
    for _ in range(200):
        reader.read()
    per_read = (time.perf_counter() - start) / 200
    # it runs every second on every node; a millisecond would already be a lot
    assert per_read < 0.005, f"{per_read * 1e6:.0f} µs per read"


def test_parsers_alone():
    errors: list[str] = []
    assert parse_meminfo("MemTotal: 10 kB\nOther: 5 kB\n\n", errors) == {"MemTotal": 10}
    assert errors == []
    assert parse_loadavg("1.00 2.00 3.00 1/100 4242") == (1.0, 2.0, 3.0)


async def test_the_sample_names_the_busiest_processes_from_two_looks():
    """CPU use is the CPU time between two looks over the time between them; memory is the second
    look's; a secret on a command line stays on the node; the samples between looks carry none."""
    from datetime import UTC, datetime

    from node_sampler.procs import ProcessInfo, ProcessUsage
    from node_sampler.sampler import Sampler
    from tests.node_sampler.fakes import FakeProcessTable, two_gpus

    class Clock:
        now = 100.0

        def __call__(self) -> float:
            return self.now

    def info(pid: int, command: str) -> ProcessInfo:
        return ProcessInfo(pid=pid, start_ticks=pid, command=command, user="ml", started_at=datetime.now(UTC))

    table = FakeProcessTable({1: info(1, "dataloader"), 2: info(2, "python serve.py --api-key=sk-abcdef0123456789"), 3: info(3, "idle")})
    table.usages = {pid: ProcessUsage(pid=pid, start_ticks=pid, cpu_s=10.0, rss_kib=kib) for pid, kib in ((1, 4096), (2, 8 << 20), (3, 1024))}
    clock = Clock()
    host = SimpleNamespace(read=lambda: __import__("node_sampler.readings", fromlist=["HostReading"]).HostReading())
    sampler = Sampler("n1", two_gpus(), table, [], 5.0, host=host, top_interval_s=30.0, holder_scan_interval_s=0, clock=clock)

    first = await sampler.sample()
    assert [p.pid for p in first.host.top_processes] == [2, 1, 3]  # no CPU figure yet: by memory
    assert all(p.cpu_pct == 0 for p in first.host.top_processes)

    clock.now += 30.0
    table.usages[1] = ProcessUsage(pid=1, start_ticks=1, cpu_s=10.0 + 60.0, rss_kib=4096)  # two CPUs for 30 s
    table.usages[3] = ProcessUsage(pid=3, start_ticks=99, cpu_s=50.0, rss_kib=1024)  # pid recycled: no CPU figure
    second = await sampler.sample()
    top = {p.pid: p for p in second.host.top_processes}
    assert top[1].cpu_pct == 200.0
    assert top[3].cpu_pct == 0.0
    assert top[2].memory_rss_mib == 8192
    assert "sk-abcdef0123456789" not in top[2].command
    assert second.host.top_processes[0].pid == 1  # the busy one first

    clock.now += 5.0
    third = await sampler.sample()
    assert third.host.top_processes == ()


def test_dockers_data_directory_is_watched_when_it_is_a_file_system_of_its_own():
    """Images, container layers and logs fill /var/lib/docker; on its own disk it needs its own figure."""
    devices = {"/": 1, DOCKER_ROOT: 2}
    assert watched_disks(None, device_of=devices.__getitem__) == ["/", DOCKER_ROOT]
    devices[DOCKER_ROOT] = 1  # on /: the same figure twice would be two incidents for one disk
    assert watched_disks(None, device_of=devices.__getitem__) == ["/"]

    def no_docker(path: str) -> int:
        if path == DOCKER_ROOT:
            raise FileNotFoundError(path)
        return 1

    assert watched_disks(None, device_of=no_docker) == ["/"]
    assert watched_disks(["/data"], device_of=devices.__getitem__) == ["/data"]  # what the operator named, as named
    assert watched_disks(None) in (["/"], ["/", DOCKER_ROOT])  # this machine, by its real devices
