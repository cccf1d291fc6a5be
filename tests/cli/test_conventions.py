"""One convention for every command that reads: the stack is found the same way (--store, else
GPUMEDIC_STORE_URL, else the embedded stack under --var), reading never creates a store, exit 1 is
"not found" and 2 "could not check", ids have one name in every JSON, cut text ends in an
ellipsis, tables fit a terminal, and a trace's status reads in an operator's words."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic.cli import main
from gpumedic.output import clip, table
from gpumedic_events import PreflightReport
from gpumedic_store import create_engine, session_factory, upgrade
from gpumedic_store.models import Incident, SpanRow

NOW = datetime(2026, 11, 26, 9, 0, tzinfo=UTC)
LONG = "GPU 0 idle for 30 min while the job reports progress; " * 4


@pytest.fixture
async def stack_var(tmp_path):
    """A directory an embedded stack ran under: its store holds one incident with a trace."""
    var = tmp_path / "elsewhere"
    var.mkdir()
    url = f"sqlite+aiosqlite:///{var}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    async with session_factory(engine)() as session:
        session.add(Incident(id=str(uuid.uuid4()), node_id="gpu-node-07", kind="zombie_job", gpu_index=0, fingerprint="f", status="open",
                             summary=LONG, opened_at=NOW, updated_at=NOW, evidence={}, detector="zombie-detector", severity="warning",
                             occurrences=1, trace_id="ab" * 16))
        session.add(SpanRow(span_id="cd" * 8, trace_id="ab" * 16, parent_span_id=None, name="detect", service="zombie-detector",
                         started_at=NOW, ended_at=NOW + timedelta(milliseconds=12), status="UNSET", attributes={}))
        await session.commit()
    await engine.dispose()
    return var


def _run(capsys, *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


@pytest.mark.parametrize("command", [["incidents"], ["actions"], ["cluster", "log"], ["drained"], ["breaker"], ["silence", "list"]])
def test_every_reading_command_reads_the_stack_under_var(stack_var, capsys, monkeypatch, command):
    monkeypatch.delenv("GPUMEDIC_STORE_URL", raising=False)
    code, out, err = _run(capsys, *command, "--var", str(stack_var), "--json")
    assert code == 0, err
    if command == ["incidents"]:
        assert [i["node_id"] for i in json.loads(out)] == ["gpu-node-07"]


@pytest.mark.parametrize("command", [["incidents"], ["actions"], ["cluster", "log"], ["drained"], ["report"]])
def test_reading_where_no_store_is_creates_none_and_says_so(tmp_path, capsys, monkeypatch, command):
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("GPUMEDIC_STORE_URL", raising=False)
    code, out, err = _run(capsys, *command)
    assert code == 2 and out == ""
    assert "no store at sqlite+aiosqlite:///var/gpumedic.db (no stack has run under var/)" in err and "gpumedic up --var" in err
    code, _, err = _run(capsys, *command, "--store", f"sqlite:///{tmp_path}/typo.db")
    assert code == 2 and "(the store --store names)" in err
    assert list(tmp_path.iterdir()) == []  # nothing created, ./var included


def test_an_incident_not_found_is_exit_1_on_stderr_also_as_json(stack_var, capsys):
    for extra in ([], ["--json"]):
        code, out, err = _run(capsys, "incidents", "ffffffff", "--var", str(stack_var), *extra)
        assert (code, out) == (1, "") and "no incident whose id starts with 'ffffffff'" in err


def test_every_json_names_an_incident_incident_id(stack_var, capsys):
    code, out, _ = _run(capsys, "incidents", "--var", str(stack_var), "--json")
    [row] = json.loads(out)
    assert "id" not in row and len(row["incident_id"]) == 36
    code, out, _ = _run(capsys, "incidents", row["incident_id"][:8], "--var", str(stack_var), "--json")
    assert json.loads(out)["incident"]["incident_id"] == row["incident_id"]


def test_cut_text_ends_in_an_ellipsis_and_a_trace_reads_ok_not_unset(stack_var, capsys):
    code, out, _ = _run(capsys, "incidents", "--var", str(stack_var))
    assert clip(LONG, 80) in out and clip(LONG, 80).endswith("…") and len(clip(LONG, 80)) == 80
    incident_id = out.splitlines()[2].split()[0]
    code, out, _ = _run(capsys, "incidents", incident_id, "--var", str(stack_var))
    [span_line] = [line for line in out.splitlines() if "detect" in line and "zombie-detector" in line and " ms " in line]
    assert span_line.endswith("12.0 ms  ok") and "UNSET" not in out


def test_a_table_fits_the_terminal_it_is_printed_on_and_is_whole_in_a_pipe():
    rows = [["a" * 8, LONG]]
    narrow = table(["ID", "SUMMARY"], rows, width=60)
    assert all(len(line) <= 60 for line in narrow.splitlines()) and "…" in narrow
    assert LONG.strip() in table(["ID", "SUMMARY"], rows)  # not a terminal: whole, for grep


def test_a_preflight_that_could_not_check_says_so_rather_than_not_ready():
    report = PreflightReport(check_id=uuid.uuid4(), node_id="nosuch", ready=False, error="unknown node 'nosuch': not in inventory",
                             took_ms=3.0)
    assert report.summary() == "nosuch: could not check: unknown node 'nosuch': not in inventory"


def test_status_words_in_colour_on_a_terminal_unless_no_color_or_a_pipe(stack_var, tmp_path):
    """Run as a person would, under a pseudo-terminal: the open incident's status is painted; with
    NO_COLOR set, or into a pipe, the same table is plain text."""
    import os
    import pty
    import subprocess
    import sys

    def under_a_terminal(env: dict[str, str]) -> str:
        leader, follower = pty.openpty()
        child = subprocess.Popen([sys.executable, "-m", "gpumedic.cli", "incidents", "--var", str(stack_var)],
                                 stdin=follower, stdout=follower, stderr=follower, env=env, close_fds=True)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed with the child
                break
            if not chunk:
                break
            chunks.append(chunk)
        child.wait(timeout=60)
        os.close(leader)
        return b"".join(chunks).decode(errors="replace")

    env = {k: v for k, v in os.environ.items() if k not in ("NO_COLOR", "GPUMEDIC_STORE_URL")} | {"TERM": "xterm", "COLUMNS": "200"}
    painted = under_a_terminal(env)
    assert "\x1b[33mopen" in painted and "gpu-node-07" in painted, painted
    plain = under_a_terminal(env | {"NO_COLOR": "1"})
    assert "\x1b[" not in plain and "open" in plain and "gpu-node-07" in plain
    piped = subprocess.run([sys.executable, "-m", "gpumedic.cli", "incidents", "--var", str(stack_var)], env=env, capture_output=True, text=True)
    assert piped.returncode == 0 and "\x1b[" not in piped.stdout and "gpu-node-07" in piped.stdout
