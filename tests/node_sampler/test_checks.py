"""The operator's own check scripts, run for real on this machine: node-problem-detector's exit
codes, the first line as the message, a timeout that kills the script's whole process group,
bounded output, and no script run that someone else could have changed."""

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import node_sampler
import pytest

from node_sampler.checks import MAX_MESSAGE, CheckScripts

EXAMPLES = Path(node_sampler.__file__).with_name("example_checks")


def script(directory: Path, name: str, body: str, mode: int = 0o755) -> Path:
    path = directory / name
    path.write_text("#!/bin/sh\n" + body + "\n")
    path.chmod(mode)
    return path


@pytest.fixture
def checks_dir(tmp_path: Path) -> Path:
    directory = tmp_path / "checks.d"
    directory.mkdir(mode=0o755)
    return directory


def results(checks: CheckScripts) -> dict[str, tuple[str, str]]:
    return {name: (fact.status, fact.message) for name, fact in checks.results.items()}


async def test_exit_codes_are_ok_problem_and_unknown_with_the_first_line_as_the_message(checks_dir):
    script(checks_dir, "fabric.sh", 'echo "4 NVSwitches"; exit 0')
    script(checks_dir, "nfs-mounted", 'echo; echo "  /data is not mounted  "; echo "second line"; exit 1')
    script(checks_dir, "smart", "echo 'no smartctl: cannot tell'; exit 2")
    script(checks_dir, "crashes", "kill -SEGV $$")
    script(checks_dir, "exit-3", "exit 3")
    (checks_dir / "no-shebang").write_text("echo hi\n")
    (checks_dir / "no-shebang").chmod(0o755)
    script(checks_dir, "README.md", "not a check", mode=0o644)  # not executable
    script(checks_dir, "old.sh.bak", "exit 1")  # a backup, not a check
    script(checks_dir, ".hidden", "exit 1")
    checks = CheckScripts(checks_dir)
    await checks.run_once()
    assert results(checks) == {
        "fabric": ("ok", "4 NVSwitches"),
        "nfs-mounted": ("problem", "/data is not mounted"),
        "smart": ("unknown", "exit 2: no smartctl: cannot tell"),
        "crashes": ("unknown", "killed by signal 11"),
        "exit-3": ("unknown", "exit 3"),
        "no-shebang": ("unknown", "cannot run: Exec format error"),
    }
    assert [f.name for f in checks.observe()] == sorted(results(checks))  # in name order
    await checks.close()


async def test_a_check_past_its_timeout_is_unknown_and_its_whole_process_group_is_killed(checks_dir, tmp_path):
    marker = tmp_path / "child.pid"
    script(checks_dir, "hangs", f"sleep 300 & echo $! > {marker}; wait")
    checks = CheckScripts(checks_dir, timeout_s=0.5)
    started = time.monotonic()
    await checks.run_once()
    assert results(checks) == {"hangs": ("unknown", "timed out after 0.5s")}
    assert time.monotonic() - started < 10
    child = int(marker.read_text())
    for _ in range(100):  # the kill is sent; the reaping is its parent's (init's) business
        if not Path(f"/proc/{child}").exists() or "Z" in Path(f"/proc/{child}/stat").read_text().split()[2]:
            break
        await asyncio.sleep(0.05)
    else:
        pytest.fail(f"the check's child {child} still runs after its timeout")


async def test_output_is_bounded_cleaned_and_masked_and_a_flood_does_not_block_the_script(checks_dir):
    script(checks_dir, "floods", "printf 'token=s3cr3tvalue \\033[31mred\\033[0m %0300d\\n' 0; yes | head -c 5000000; exit 1")
    checks = CheckScripts(checks_dir, timeout_s=20)
    await checks.run_once()
    status, message = results(checks)["floods"]
    assert status == "problem" and len(message) <= MAX_MESSAGE
    assert "s3cr3tvalue" not in message and "\x1b" not in message and message.startswith("token=***")


async def test_a_script_or_directory_others_may_change_is_not_run(checks_dir, tmp_path):
    marker = tmp_path / "ran"
    script(checks_dir, "writable", f"touch {marker}; exit 0", mode=0o777)
    checks = CheckScripts(checks_dir)
    await checks.run_once()
    assert results(checks) == {"writable": ("unknown", "not run: the script is writable by others (mode 777)")}
    assert not marker.exists()
    os.chmod(checks_dir / "writable", 0o755)
    checks_dir.chmod(0o775)
    await checks.run_once()
    assert results(checks) == {"writable": ("unknown", "not run: the checks directory is writable by others (mode 775)")}
    checks_dir.chmod(0o755)
    await checks.run_once()
    assert results(checks) == {"writable": ("ok", "")} and marker.exists()
    (checks_dir / "writable").unlink()
    await checks.run_once()
    assert results(checks) == {}  # a check removed is forgotten


async def test_the_runbooks_checkpoint_check_reads_under_the_nodes_root(checks_dir, tmp_path):
    shutil.copy(EXAMPLES / "nn-checkpoint", checks_dir / "nn-checkpoint")
    root = tmp_path / "node"
    checks = CheckScripts(checks_dir, root=root)
    await checks.run_once()
    assert results(checks) == {"nn-checkpoint": ("unknown", "exit 2: /data/checkpoints does not exist here: cannot tell")}
    (root / "data" / "checkpoints").mkdir(parents=True)
    await checks.run_once()
    assert results(checks)["nn-checkpoint"][0] == "problem"
    assert "no model checkpoint" in results(checks)["nn-checkpoint"][1]
    (root / "data" / "checkpoints" / "gumbel-v3.pt").write_bytes(b"weights")
    await checks.run_once()
    assert results(checks) == {"nn-checkpoint": ("ok", "checkpoint gumbel-v3.pt in /data/checkpoints")}


async def test_the_sampler_carries_each_checks_last_result_and_runs_them_in_the_background(checks_dir):
    script(checks_dir, "slow", "sleep 0.3; echo done; exit 1")
    checks = CheckScripts(checks_dir, interval_s=0.1)
    assert checks.observe() == ()  # the first look starts them and does not wait
    for _ in range(100):
        if checks.observe():
            break
        await asyncio.sleep(0.05)
    (fact,) = checks.observe()
    assert (fact.name, fact.status, fact.message) == ("slow", "problem", "done")
    await checks.close()
