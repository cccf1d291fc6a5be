"""`gpumedic demo`, the main job, run as a user runs it: it must tell the story from detection
to fix with a trace id, exit 0, and leave no process behind."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from gpumedic.stack import nvml_problem

pytestmark = pytest.mark.long  # each runs the whole embedded stack for half a minute or more


def _processes_mentioning(text: str) -> list[str]:
    """Live processes whose command line or environment names `text` (our var dir)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            blob = (proc / "cmdline").read_bytes() + (proc / "environ").read_bytes()
        except OSError:
            continue
        if text.encode() in blob:
            command = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            found.append(f"{proc.name}: {command[:120]}")
    return found


def _demo(var: Path) -> subprocess.CompletedProcess:
    gpumedic = Path(sys.executable).parent / "gpumedic"
    return subprocess.run(
        [str(gpumedic), "demo", "--var", str(var), "--nodes", "3", "--duration", "90"],
        capture_output=True, text=True, timeout=150, env={k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")},
    )


def _story(out: str) -> list[str]:
    """The story's steps as printed, without times and ids."""
    return [line.split("s  ", 1)[1].split()[0] + " " + line.split(" on ")[-1].split(":")[0].split()[0]
            for line in out.splitlines() if line.startswith("      +") and " on " in line]


@pytest.mark.timeout(330)  # two demos, each given 150 s
def test_demo_fixes_the_injected_zombie_and_stops_cleanly_and_tells_the_same_story_again(tmp_path):
    var = tmp_path / "var"
    gpumedic = Path(sys.executable).parent / "gpumedic"
    first = _demo(var)
    out = first.stdout
    assert first.returncode == 0, out + first.stderr
    for step in ("DETECTED", "DECIDED", "ACTED     succeeded", "RESOLVED  (fixed)", "trace id: ", "timeline:"):
        assert step in out, step
    trace_lines = out.split("trace ")[-1]
    for span in ("detect", "decide", "act", "verify", "record"):
        assert f" {span} " in trace_lines, span
    assert "stopped; no process left behind" in out
    assert _processes_mentioning(str(var)) == []
    # Run again in the same directory: what the first run left (the node's incident, its action)
    # would make the node a repeat offender by the third run and spend its action budget by the
    # fourth; it is cleared, said out loud, and the story is the same.
    again = _demo(var)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"a fresh start: what the last run left under {var}/ is cleared" in again.stdout
    assert _story(again.stdout) == _story(out) and _story(out), (_story(out), _story(again.stdout))
    assert (var / "gpumedic.db").exists() and (var / "logs" / "remediator.log").exists()
    # On a machine without an NVIDIA driver (this one) its own sampler is left out and the demo
    # says why: no incident about this machine is left behind unexplained.
    incidents = subprocess.run([str(gpumedic), "incidents", "--var", str(var), "--json"], capture_output=True, text=True, timeout=60)
    kinds = {(i["node_id"], i["kind"]) for i in json.loads(incidents.stdout)}
    if nvml_problem():
        assert "not this machine's node-sampler: it has no usable NVIDIA driver" in out
        assert kinds == {("sim-node-02", "zombie_job")}, kinds
    else:
        assert "this machine's GPUs are sampled too" in out


def test_a_demo_empties_only_a_directory_a_demo_made(tmp_path):
    var = tmp_path / "mine"
    var.mkdir()
    (var / "gpumedic.db").write_text("someone's store")
    gpumedic = Path(sys.executable).parent / "gpumedic"
    for command in (["demo"], ["sim"], ["up", "--demo"]):
        where = var / "demo" if "up" in command else var
        if "up" in command:
            where.mkdir()
            (where / "notes.txt").write_text("mine")
        result = subprocess.run([str(gpumedic), *command, "--var", str(var)], capture_output=True, text=True, timeout=60)
        assert result.returncode == 2, result.stdout + result.stderr
        assert f"{where}/ holds files no demo or simulation made" in result.stderr and "--var" in result.stderr
    assert (var / "gpumedic.db").read_text() == "someone's store" and (var / "demo" / "notes.txt").exists()


def _as_a_terminal_starts_it() -> None:
    """Ctrl-C's signal as a terminal leaves it: tests run as a shell's background job (`make
    test-long &`) inherit SIGINT ignored, and Python keeps an inherited SIGINT ignored, as every
    program run in the background should, so `up` would rightly never see it."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


@pytest.mark.parametrize(
    ("options", "running"),
    [((), "running; logs in"), (("--demo", "--nodes", "2"), "the stack keeps running")],
    ids=["up", "up --demo"],
)
def test_up_runs_until_ctrl_c_then_stops_everything(tmp_path, options, running):
    var = tmp_path / "var"
    gpumedic = Path(sys.executable).parent / "gpumedic"
    proc = subprocess.Popen(
        [str(gpumedic), "up", "--var", str(var), *options], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={k: v for k, v in os.environ.items() if not k.startswith("GPUMEDIC_")}, preexec_fn=_as_a_terminal_starts_it,
    )
    lines = []
    try:
        for line in proc.stdout:
            lines.append(line)
            if running in line:
                break
        services = 6 if "--demo" not in options or not nvml_problem() else 5  # the demo leaves out a sampler with no GPU
        assert len(_processes_mentioning(str(var))) >= 1 + services, "".join(lines)
        # Every service logs in as its own NATS user over TLS, with secrets only their owner reads.
        stack = var / "demo" if "--demo" in options else var  # the demo's story runs in a directory of its own
        assert (stack / "secrets" / "nats-passwords.json").stat().st_mode & 0o077 == 0
        assert "Violation" not in (stack / "logs" / "nats-server.log").read_text()
        proc.send_signal(signal.SIGINT)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, "".join(lines) + rest
    assert "stopped; no process left behind" in rest
    assert _processes_mentioning(str(var)) == []
