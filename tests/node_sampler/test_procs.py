"""The /proc process table, on this test's own process and on a proc root written by the test."""

from __future__ import annotations

import os
import subprocess
import sys

from node_sampler.procs import ProcFsTable, parse_cmdline, parse_start_ticks


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
    assert "pytest" in info.command


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
    entry = tmp_path / "77"
    entry.mkdir()
    (entry / "stat").write_text("77 (a) (b) R 1 77 77 0 -1 0 0 0 0 0 0 0 0 0 20 0 1 0 5555 0 0\n")
    (entry / "cmdline").write_bytes(b"/usr/bin/python3\0-m\0selfplay\0")
    (tmp_path / "self").mkdir()
    broken = tmp_path / "78"
    broken.mkdir()
    (broken / "stat").write_text("garbage")
    (broken / "cmdline").write_bytes(b"x\0")
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
