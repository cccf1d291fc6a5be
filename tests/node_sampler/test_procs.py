"""The /proc process table, on this test's own process and on a proc root written by the test."""

from __future__ import annotations

import json
import os
import pwd
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from node_sampler.procs import (
    ProcFsTable,
    container_id_from_cgroup,
    is_nvidia_device,
    parse_btime,
    parse_cgroup,
    parse_cmdline,
    parse_start_ticks,
    parse_uid,
    parse_usage,
)

ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="needs root (to run processes as other users)")
DOCKER_ID = "3f4e8c2a9b1d7e6f5a4b3c2d1e0f9a8b7c6d5e4f3a2b1c0d9e8f7a6b5c4d3e2f"
BTIME = 1_790_000_000


def stat_text(pid: int, comm: str, start_ticks: int) -> str:
    fields = ["S", "1", str(pid), str(pid), "0", "-1", "4194560"] + ["0"] * 12 + [str(start_ticks), "1000", "10"]
    return f"{pid} ({comm}) " + " ".join(fields) + "\n"


def status_text(name: str, uid: int) -> str:
    ids = f"{uid}\t{uid}\t{uid}\t{uid}"
    return f"Name:\t{name}\nUmask:\t0022\nState:\tS (sleeping)\nTgid:\t1\nUid:\t{ids}\nGid:\t0\t0\t0\t0\n"


def fake_proc(
    root: Path,
    pid: int,
    *,
    comm: str = "python",
    start_ticks: int = 5555,
    argv: tuple[str, ...] = ("python", "-m", "selfplay"),
    uid: int | None = 0,
    cgroup: str | None = "0::/\n",
    fds: dict[int, str] | None = None,
    io: str | None = None,
) -> Path:
    """One process's directory in a proc root of the test's own; None leaves that file out."""
    entry = root / str(pid)
    entry.mkdir(parents=True)
    (entry / "stat").write_text(stat_text(pid, comm, start_ticks))
    (entry / "cmdline").write_bytes(b"".join(a.encode() + b"\0" for a in argv))
    if uid is not None:
        (entry / "status").write_text(status_text(comm, uid))
    if cgroup is not None:
        (entry / "cgroup").write_text(cgroup)
    if io is not None:
        (entry / "io").write_text(io)
    if fds is not None:
        (entry / "fd").mkdir()
        for fd, target in fds.items():
            (entry / "fd" / str(fd)).symlink_to(target)
    return entry


def fake_root(root: Path, btime: int | None = BTIME) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    lines = ["cpu  1 2 3 4", "intr 12345", "ctxt 67890"] + ([f"btime {btime}"] if btime is not None else [])
    (root / "stat").write_text("\n".join([*lines, "processes 4242", "procs_running 2"]) + "\n")
    return root


def test_own_process_from_the_real_proc():
    pid = os.getpid()
    with open(f"/proc/{pid}/stat") as f:
        expected_ticks = int(f.read().rsplit(")", 1)[1].split()[19])
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        expected_args = f.read().rstrip(b"\0").decode().split("\0")

    info = ProcFsTable().describe(pid)

    assert info is not None
    assert info.pid == pid
    assert info.start_ticks == expected_ticks
    assert info.command == " ".join(expected_args)


def test_vanished_pid_is_none_with_a_note():
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    errors: list[str] = []

    assert ProcFsTable().describe(child.pid, errors) is None
    assert errors == [f"pid {child.pid}: not in /proc (exited, or another pid namespace)"]


def test_comm_with_spaces_and_parens():
    line = "4242 (evil ) (name) S 1 4242 4242 0 -1 4194560 1 0 0 0 5 1 0 0 20 0 1 0 987654 1000 10 18446744073709551615 0 0"
    assert parse_start_ticks(line) == 987654


def test_malformed_stat_lines():
    assert parse_start_ticks("") is None
    assert parse_start_ticks("4242 (short) S 1 2 3") is None
    assert parse_start_ticks("4242 (x) S " + " ".join(["1"] * 18) + " notanumber") is None


def test_cmdline_joined_by_spaces():
    assert parse_cmdline(b"python\0train.py\0--epochs\090\0") == "python train.py --epochs 90"
    assert parse_cmdline(b"") == ""
    assert parse_cmdline(b"sh\0-c\0echo a b\0") == "sh -c echo a b"


def test_a_proc_root_of_ones_own(tmp_path):
    fake_root(tmp_path)
    entry = tmp_path / "77"
    entry.mkdir()
    (entry / "stat").write_text("77 (a) (b) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5555 0 0\n")
    (entry / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0selfplay\0")
    (tmp_path / "self").mkdir()
    broken = tmp_path / "78"
    broken.mkdir()
    (broken / "stat").write_text("garbage")
    (broken / "cmdline").write_bytes(b"x\0")
    for e in (entry, broken):
        (e / "status").write_text(status_text("a", 0))
        (e / "cgroup").write_text("0::/\n")
    table = ProcFsTable(tmp_path)
    errors: list[str] = []

    assert table.pids() == [77, 78]
    info = table.describe(77, errors)
    assert (info.start_ticks, info.command) == (5555, "/usr/bin/python3 -m selfplay")
    partial = table.describe(78, errors)
    assert partial.start_ticks is None and partial.command == "x"
    assert errors == ["pid 78: malformed stat line"]


def test_unreadable_proc_root_lists_nothing(tmp_path):
    errors: list[str] = []
    assert ProcFsTable(tmp_path / "absent").pids(errors) == []
    assert len(errors) == 1


# --- identity: user, cgroup, container, start time -------------------------------------------


def test_identity_of_a_containerised_process(tmp_path):
    root = fake_root(tmp_path)
    fake_proc(
        root,
        4242,
        start_ticks=123_456,
        uid=0,
        cgroup=f"0::/system.slice/docker-{DOCKER_ID}.scope\n",
    )
    fake_proc(root, 4243, uid=4_242_424, cgroup="0::/user.slice/user-4242424.slice/session-3.scope\n")
    table = ProcFsTable(root)
    errors: list[str] = []

    info = table.describe(4242, errors)
    other = table.describe(4243, errors)

    assert errors == []
    assert info.user == pwd.getpwuid(0).pw_name
    assert info.cgroup == f"/system.slice/docker-{DOCKER_ID}.scope"
    assert info.container_id == DOCKER_ID
    ticks = os.sysconf("SC_CLK_TCK")
    assert info.started_at == datetime.fromtimestamp(BTIME + 123_456 / ticks, UTC)
    assert info.started_at.tzinfo is not None
    # a uid without a name is shown as its number; a host process has no container
    assert (other.user, other.container_id) == ("4242424", "")


def test_a_process_that_exits_between_files_costs_notes_not_the_reading(tmp_path):
    root = fake_root(tmp_path)
    # stat and cmdline were read, then the process exited: status and cgroup are gone
    fake_proc(root, 900, start_ticks=777, argv=("sleep", "9"), uid=None, cgroup=None)
    errors: list[str] = []

    info = ProcFsTable(root).describe(900, errors)

    assert (info.pid, info.start_ticks, info.command) == (900, 777, "sleep 9")
    assert (info.user, info.cgroup, info.container_id) == ("", "", "")
    assert errors == [
        "pid 900: exited while being read (status gone)",
        "pid 900: exited while being read (cgroup gone)",
    ]


def test_malformed_status_cgroup_and_stat(tmp_path):
    root = fake_root(tmp_path)
    entry = fake_proc(root, 31, cgroup="nonsense\n")
    (entry / "status").write_text("Name:\tx\nUid:\tnobody\n")
    (entry / "stat").write_text("31 no parenthesis at all")
    errors: list[str] = []

    info = ProcFsTable(root).describe(31, errors)

    assert info.start_ticks is None and info.started_at is None and info.user == "" and info.cgroup == ""
    assert errors == [
        "pid 31: malformed stat line",
        "pid 31: malformed status (no Uid line)",
        "pid 31: malformed cgroup file",
    ]


def test_boot_time_is_read_once_and_its_absence_noted_once(tmp_path):
    root = fake_root(tmp_path, btime=None)
    fake_proc(root, 5)
    table = ProcFsTable(root)
    first: list[str] = []
    second: list[str] = []

    assert table.describe(5, first).started_at is None
    # a btime appearing later is not read: the boot time is read once
    fake_root(root, btime=BTIME)
    assert table.describe(5, second).started_at is None
    assert first == [f"{root}/stat: no btime line: start times left out"]
    assert second == []
    # given outright, it is used with the given tick rate
    assert ProcFsTable(root, boot_time=1000.0, clk_tck=50).describe(5).started_at == datetime.fromtimestamp(
        1000.0 + 5555 / 50, UTC
    )


def test_own_identity_from_the_real_proc():
    info = ProcFsTable().describe(os.getpid())

    assert info.user == pwd.getpwuid(os.getuid()).pw_name
    with open(f"/proc/{os.getpid()}/cgroup") as f:
        assert info.cgroup == parse_cgroup(f.read()) and info.cgroup.startswith("/")


@ROOT_ONLY
@pytest.mark.parametrize(("uid", "user"), [(65534, "nobody"), (54321, "54321")])
def test_a_fresh_process_of_another_user_from_the_real_proc(uid, user):
    if uid == 65534 and pwd.getpwuid(65534).pw_name != "nobody":
        pytest.skip("uid 65534 has another name here")
    before = datetime.now(UTC)
    child = subprocess.Popen(["sleep", "30"], user=uid)
    try:
        time.sleep(0.05)
        info = ProcFsTable().describe(child.pid)
    finally:
        child.kill()
        child.wait()
    after = datetime.now(UTC)

    assert info.user == user
    assert info.command == "sleep 30"
    # btime has whole seconds, so the start time may read up to a second early
    assert before - timedelta(seconds=1.5) <= info.started_at <= after + timedelta(seconds=0.5)


def test_parse_uid():
    assert parse_uid(status_text("x", 1000).replace("Uid:\t1000\t1000", "Uid:\t1000\t0")) == 1000
    assert parse_uid("Name:\tx\n") is None
    assert parse_uid("Uid:\n") is None
    assert parse_uid("Uid:\t-1\t0\t0\t0\n") is None


@pytest.mark.parametrize(
    ("text", "path"),
    [
        # cgroup v2 only
        ("0::/system.slice/docker-abc.scope\n", "/system.slice/docker-abc.scope"),
        # v1: the memory controller's line, wherever it is
        ("12:pids:/docker/p\n4:cpu,cpuacct:/docker/c\n3:memory:/docker/m\n1:name=systemd:/docker/s\n", "/docker/m"),
        # hybrid with the process placed in v2: the v2 line
        ("4:memory:/user.slice\n0::/system.slice/x.scope\n", "/system.slice/x.scope"),
        # hybrid whose v2 line is just the root: the memory line names the container
        ("9:name=systemd:/\n4:memory:/process_api/abc\n0::/\n", "/process_api/abc"),
        # a kernel thread: everything at the root
        ("0::/\n", "/"),
        # no v2 and no memory line: the first
        ("5:cpuset:/k8s/first\n2:cpu:/k8s/second\n", "/k8s/first"),
        ("", ""),
        ("not a cgroup line\n", ""),
    ],
)
def test_parse_cgroup(text, path):
    assert parse_cgroup(text) == path


HEX64 = "0123456789abcdef" * 4


@pytest.mark.parametrize(
    ("cgroup", "container_id"),
    [
        (f"/docker/{HEX64}", HEX64),  # docker, cgroupfs driver
        (f"/system.slice/docker-{HEX64}.scope", HEX64),  # docker, systemd driver
        (
            f"/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod1f2e_3d4c.slice/cri-containerd-{HEX64}.scope",
            HEX64,
        ),
        (f"/kubepods/besteffort/pod6b0a9f0e-1c2d-4e5f-8a9b-0c1d2e3f4a5b/{HEX64}", HEX64),  # k8s, cgroupfs driver
        (f"/kubepods.slice/kubepods-pod1.slice/crio-{HEX64}.scope", HEX64),  # cri-o
        (f"/machine.slice/libpod-{HEX64}.scope", HEX64),  # podman
        (f"/machine.slice/libpod-{HEX64}.scope/container", HEX64),  # podman, nested cgroup
        # systemd in a docker container on a v2 host: the container's id
        (f"/system.slice/docker-{HEX64}.scope/init.scope", HEX64),
        # the monitors beside the container are not in it
        (f"/machine.slice/libpod-conmon-{HEX64}.scope", ""),
        (f"/kubepods.slice/crio-conmon-{HEX64}.scope", ""),
        ("/system.slice/docker.service", ""),
        ("/user.slice/user-1000.slice/session-3.scope", ""),
        ("/process_api/02bd70f088fa45b44a4af91eb475a7c7", ""),  # 32 hex digits: not a container id
        (f"/docker/{HEX64}x", ""),
        ("/", ""),
        ("", ""),
    ],
)
def test_container_id_from_cgroup(cgroup, container_id):
    assert container_id_from_cgroup(cgroup) == container_id


def test_parse_btime():
    assert parse_btime("cpu  1 2 3\nbtime 1790000000\nprocesses 3\n") == 1_790_000_000
    assert parse_btime("cpu  1 2 3\n") is None
    assert parse_btime("btime soon\n") is None


# --- /dev/nvidia* holders ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("target", "held"),
    [
        ("/dev/nvidia0", True),
        ("/dev/nvidia17", True),
        ("/dev/nvidiactl", True),
        ("/dev/nvidia-uvm", True),
        ("/dev/nvidia-uvm-tools", True),
        ("/dev/nvidia-modeset", True),
        ("/dev/nvidia-caps/nvidia-cap2", True),
        ("/dev/nvidia-caps/", False),
        ("/dev/nvidia", False),
        ("/dev/nvidiactl2", False),
        ("/dev/nvidia0x", False),
        ("/dev/null", False),
        ("socket:[123456]", False),
        ("/home/u/dev/nvidia0", False),
    ],
)
def test_is_nvidia_device(target, held):
    assert is_nvidia_device(target) is held


def test_device_holders_in_a_proc_root_of_ones_own(tmp_path):
    root = fake_root(tmp_path)
    fake_proc(
        root,
        100,
        fds={
            0: "/dev/null",
            1: "pipe:[4242]",
            3: "/dev/nvidiactl",
            4: "/dev/nvidia-uvm",
            5: "/dev/nvidia3",
            6: "/dev/nvidia3",  # opened twice: listed once
            7: "socket:[99]",
        },
    )
    fake_proc(root, 101, fds={9: "/dev/nvidia-caps/nvidia-cap1", 10: "/dev/nvidia-modeset", 11: "/dev/nvidia0"})
    fake_proc(root, 102, fds={0: "/dev/null", 1: "/dev/nvidiafoo", 2: "/tmp/nvidia0"})  # holds none
    fake_proc(root, 103)  # exited after the listing: its fd directory is gone
    fake_proc(root, 104, fds={})
    (root / "self").symlink_to("100")
    (root / "sys").mkdir()
    errors: list[str] = []

    holders = ProcFsTable(root).device_holders(errors)

    assert holders == {
        100: ("/dev/nvidia-uvm", "/dev/nvidia3", "/dev/nvidiactl"),
        101: ("/dev/nvidia-caps/nvidia-cap1", "/dev/nvidia-modeset", "/dev/nvidia0"),
    }
    assert errors == []


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads every directory: see the test below")
def test_unreadable_fd_directories_cost_one_summary_note(tmp_path):
    root = fake_root(tmp_path)
    fake_proc(root, 100, fds={3: "/dev/nvidia0"})
    for pid in (200, 201, 202):
        fake_proc(root, pid, fds={3: "/dev/nvidia1"})
        (root / str(pid) / "fd").chmod(0)
    errors: list[str] = []
    try:
        holders = ProcFsTable(root).device_holders(errors)
    finally:
        for pid in (200, 201, 202):
            (root / str(pid) / "fd").chmod(0o755)

    assert holders == {100: ("/dev/nvidia0",)}
    assert errors == ["3 processes' open files unreadable (pid 200, 201, 202): run as root to see every /dev/nvidia* holder"]


_SCAN_AS_NOBODY = """
import json, os, sys
from node_sampler.procs import ProcFsTable
table = ProcFsTable()
os.setgroups([]); os.setgid(65534); os.setuid(65534)
errors = []
holders = table.device_holders(errors)
print(json.dumps({"holders": {str(k): v for k, v in holders.items()}, "errors": errors}))
"""


@ROOT_ONLY
def test_an_unprivileged_scan_of_the_real_proc_says_once_what_it_could_not_see():
    # pid 1 and the other root processes' open files are not nobody's to read
    out = subprocess.run(
        [sys.executable, "-c", _SCAN_AS_NOBODY], capture_output=True, text=True, check=True, timeout=60
    )
    result = json.loads(out.stdout)

    assert len(result["errors"]) == 1
    count, _, rest = result["errors"][0].partition(" ")
    assert int(count) >= 1
    assert "open files unreadable (pid 1" in rest and rest.endswith("): run as root to see every /dev/nvidia* holder")


def test_as_root_a_refused_directory_is_not_blamed_on_the_user(tmp_path, monkeypatch):
    # in a Firecracker VM a process's fd directory refused root itself (docs/real-nvml.md)
    root = fake_root(tmp_path)
    fake_proc(root, 100, fds={3: "/dev/nvidia0"})
    fake_proc(root, 7, fds={3: "/dev/nvidia1"})
    real_open = os.open

    def refuse_seven(path, *args, **kwargs):
        if str(path).endswith("/7/fd"):
            raise PermissionError(13, "Permission denied")
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse_seven)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    errors: list[str] = []

    assert ProcFsTable(root).device_holders(errors) == {100: ("/dev/nvidia0",)}
    assert errors == ["1 process's open files unreadable (pid 7): refused even to root"]


IO = "rchar: 9120\nwchar: 4410\nsyscr: 12\nsyscw: 7\nread_bytes: 4096\nwrite_bytes: 1048576\ncancelled_write_bytes: 0\n"


def test_write_bytes_from_the_io_file_and_none_when_it_cannot_be_read(tmp_path):
    root = fake_root(tmp_path)
    fake_proc(root, 4242, io=IO)
    fake_proc(root, 4243)  # another user's io file is unreadable without root: here, absent
    fake_proc(root, 4244, io="rchar: 1\nwrite_bytes: lots\n")
    table = ProcFsTable(root)
    errors: list[str] = []
    assert [table.describe(pid, errors).write_bytes for pid in (4242, 4243, 4244)] == [1_048_576, None, None]
    assert errors == []  # "cannot tell" is the value, not a note per process and sample


def test_write_bytes_of_ones_own_process_from_the_real_proc(tmp_path):
    table = ProcFsTable()
    before = table.describe(os.getpid()).write_bytes
    with open(tmp_path / "out", "wb") as f:
        f.write(b"x" * 65536)
    after = table.describe(os.getpid()).write_bytes
    assert before is not None and after >= before


def test_a_process_user_and_cgroup_are_read_again_only_after_a_while_its_command_every_time(tmp_path, monkeypatch):
    from node_sampler import procs

    root = fake_root(tmp_path)
    entry = fake_proc(root, 77, argv=("sh", "-c", "python train.py"), cgroup="0::/user.slice/session-1.scope\n")
    table = ProcFsTable(root)
    first = table.describe(77)
    assert (first.command, first.cgroup) == ("sh -c python train.py", "/user.slice/session-1.scope")
    # the shell execs python (same pid, same start) and the process is moved to a container's cgroup
    (entry / "cmdline").write_bytes(b"python\0train.py\0")
    (entry / "cgroup").write_text(f"0::/system.slice/docker-{DOCKER_ID}.scope\n")
    second = table.describe(77)
    assert (second.command, second.cgroup) == ("python train.py", "/user.slice/session-1.scope")  # the command at once
    clock = time.monotonic()
    monkeypatch.setattr(procs.time, "monotonic", lambda: clock + procs.OWNER_TTL_S)
    assert table.describe(77).container_id == DOCKER_ID  # the cgroup after the while
    # a new process under a reused pid is read afresh
    (entry / "stat").write_text(stat_text(77, "python", 9999))
    (entry / "cgroup").write_text("0::/user.slice/session-2.scope\n")
    assert table.describe(77).cgroup == "/user.slice/session-2.scope"


def test_usage_of_a_busy_process_from_the_real_proc():
    """A child that spins for 0.3 s of CPU time has used that much, and holds resident memory."""
    child = subprocess.Popen([sys.executable, "-c", "import time\nwhile time.process_time() < 0.3: pass\ntime.sleep(30)"])
    try:
        deadline = time.monotonic() + 20  # however loaded the machine, it gets its 0.3 s
        while (mine := ProcFsTable().usage()[child.pid]).cpu_s < 0.25 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert mine.cpu_s >= 0.25  # utime and stime are each counted in whole ticks
        assert mine.rss_kib > 1024
        assert mine.start_ticks == parse_start_ticks(Path(f"/proc/{child.pid}/stat").read_text())
    finally:
        child.kill()
        child.wait()


def test_usage_line_parsing():
    # utime 500, stime 100 (ticks), starttime 987654, rss 2560 pages
    line = "4242 (evil ) (name) S 1 4242 4242 0 -1 4194560 1 0 0 0 500 100 0 0 20 0 1 0 987654 1000 2560 18446744073709551615"
    usage = parse_usage(4242, line, page_kib=4, clk_tck=100)
    assert usage is not None
    assert (usage.cpu_s, usage.rss_kib, usage.start_ticks) == (6.0, 10240, 987654)
    assert parse_usage(1, "4242 (x) S 1 2 3", page_kib=4, clk_tck=100) is None
    assert parse_usage(1, line.replace(" 500 ", " x "), page_kib=4, clk_tck=100) is None
