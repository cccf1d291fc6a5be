"""The operator's log patterns, counted over this machine's real files (followed as `tail -F`:
rotation, truncation, a file that is not there yet) and over journalctl's output."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from node_sampler.logwatch import MAX_READ, LogPattern, LogPatterns

RUNBOOK_001 = "Authentication failed|Failed to reset orphaned tasks|SSH connection failed"


def counts(logs: LogPatterns) -> dict[str, tuple[int, str, str | None]]:
    return {m.name: (m.count, m.last_line, m.error) for m in logs.observe()}


async def test_lines_written_since_the_start_are_counted_across_rotation_and_truncation(tmp_path):
    log = tmp_path / "worker.log"
    log.write_text("SSH connection failed: old news, before the sampler\n")
    logs = LogPatterns([LogPattern(name="worker-errors", regex=RUNBOOK_001, sources=(str(log),))], root=Path("/"))
    state = logs._files[str(log)]
    assert logs._read_new(str(log), state) == []  # history does not count
    with log.open("a") as f:
        f.write("INFO claimed task 17\nERROR Authentication failed for worker gpu-3 token=abcdef123456\nERROR Failed to reset")
    logs.feed(str(log), logs._read_new(str(log), state))
    assert counts(logs)["worker-errors"][0] == 1  # the half-written line waits for its end
    with log.open("a") as f:
        f.write(" orphaned tasks\n")
    logs.feed(str(log), logs._read_new(str(log), state))
    assert counts(logs)["worker-errors"][:2] == (2, "ERROR Failed to reset orphaned tasks")
    os.rename(log, tmp_path / "worker.log.1")  # logrotate: a new file under the name
    log.write_text("SSH connection failed to 10.0.0.7\n")
    logs.feed(str(log), logs._read_new(str(log), state))
    assert counts(logs)["worker-errors"][:2] == (3, "SSH connection failed to 10.0.0.7")
    log.write_text("")  # copytruncate
    with log.open("a") as f:
        f.write("Authentication failed\n")
    logs.feed(str(log), logs._read_new(str(log), state))
    assert counts(logs)["worker-errors"][0] == 4


async def test_a_match_is_masked_and_a_flood_is_read_a_bounded_part_at_a_time(tmp_path):
    log = tmp_path / "app.log"
    log.write_text("")
    logs = LogPatterns([LogPattern(name="auth", regex="Authentication failed", sources=(str(log),))])
    state = logs._files[str(log)]
    logs._read_new(str(log), state)
    line = b"Authentication failed password=hunter2hunter2 \x1b[31m\n"
    log.write_bytes(line * (3 * MAX_READ // len(line)))
    reads = []
    while lines := logs._read_new(str(log), state):
        reads.append(len(lines))
        logs.feed(str(log), lines)
    assert len(reads) >= 3 and max(reads) <= MAX_READ // len(line) + 1
    count, last, _ = counts(logs)["auth"]
    assert count == 3 * MAX_READ // len(line) and "hunter2" not in last and "\x1b" not in last


async def test_a_missing_file_says_so_and_is_read_from_its_start_once_it_appears(tmp_path):
    log = tmp_path / "later.log"
    logs = LogPatterns([LogPattern(name="auth", regex="Authentication failed", sources=(str(log),))], interval_s=0.05)
    logs.observe()
    for _ in range(100):
        if counts(logs)["auth"][2]:
            break
        await asyncio.sleep(0.02)
    assert counts(logs)["auth"][2] == f"{log}: No such file or directory"
    log.write_text("Authentication failed\n")
    for _ in range(100):
        if counts(logs)["auth"][0]:
            break
        await asyncio.sleep(0.02)
    assert counts(logs)["auth"] == (1, "Authentication failed", None)
    await logs.close()


async def test_the_journal_is_followed_with_journalctl_for_its_unit(tmp_path, monkeypatch):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv = tmp_path / "argv"
    fake = bin_dir / "journalctl"  # this machine runs no journald: journalctl's output as its manual gives it (-o cat)
    fake.write_text(f"#!/bin/sh\necho \"$@\" > {argv}\necho 'docker: Error response from daemon: OCI runtime create failed'\n"
                    "echo 'level=info msg=ok'\nsleep 30\n")
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:{os.environ['PATH']}")
    logs = LogPatterns([LogPattern(name="docker-errors", regex=r"Error response from daemon", sources=("journal:docker.service",))])
    logs.observe()
    for _ in range(200):
        if counts(logs)["docker-errors"][0]:
            break
        await asyncio.sleep(0.02)
    assert counts(logs)["docker-errors"] == (1, "docker: Error response from daemon: OCI runtime create failed", None)
    assert argv.read_text().split() == ["--follow", "--lines=0", "--output=cat", "--quiet", "--unit=docker.service"]
    await logs.close()


def test_a_pattern_names_its_sources_plainly():
    with pytest.raises(ValidationError, match="not a regular expression"):
        LogPattern(name="x", regex="(", sources=("/var/log/x.log",))
    with pytest.raises(ValidationError, match="give an absolute file path, journal, journal:UNIT.service or container:NAME"):
        LogPattern(name="x", regex="x", sources=("journal:docker; rm -rf /",))
    with pytest.raises(ValidationError, match="container:NAME"):
        LogPattern(name="x", regex="x", sources=("container:../../etc",))
    with pytest.raises(ValidationError, match="give an absolute file path"):
        LogPattern(name="x", regex="x", sources=("var/log/x.log",))
    with pytest.raises(ValidationError):
        LogPattern(name="../x", regex="x", sources=("journal",))
    with pytest.raises(ValueError, match="two log patterns have one name"):
        LogPatterns([LogPattern(name="x", regex="a", sources=("journal",)), LogPattern(name="x", regex="b", sources=("journal",))])


async def test_a_containers_log_is_followed_by_name_through_the_engine_and_its_replacement_too(tmp_path):
    """Runbook 004's `docker logs`, as a pattern source: the lines a running container logs from now
    on (the simulated engine speaks the Engine API's multiplexed log stream), and after the container
    stops, those of the new one under its name."""
    from gpumedic_sim.machine.docker import SimDockerEngine
    from gpumedic_sim.machine.state import NodeState

    node = NodeState("gpu-node-07", 1, seed=3)
    node.start_job(0)  # its container: selfplay-gpu0
    engine = SimDockerEngine(node, tmp_path / "docker.sock")
    await engine.start()
    container = next(c for c in node.containers.values() if c.running)
    container.logs.append("CUDA out of memory. Tried to allocate 2.00 GiB (before the sampler: not counted)")
    logs = LogPatterns([LogPattern(name="gpu-oom", regex="CUDA out of memory", sources=(f"container:{container.name}",))],
                       interval_s=0.1, docker_socket=tmp_path / "docker.sock")

    async def until(count: int) -> tuple[int, str, str | None]:
        for _ in range(100):
            seen = counts(logs)["gpu-oom"]
            if seen[0] >= count:
                return seen
            await asyncio.sleep(0.05)
        return counts(logs)["gpu-oom"]

    try:
        assert counts(logs)["gpu-oom"][0] == 0
        await asyncio.sleep(0.3)  # the stream is open
        container.logs.extend(["step 100 loss 0.3", "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB"])
        assert (await until(1))[:2] == (1, "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 4.00 GiB")
        node._end(node._job_on(0), exit_code=1, logs=["RuntimeError: CUDA out of memory"])  # it dies saying so
        assert (await until(2))[0] == 2
        node.start_job(0)  # the next run, a new container under the same name
        replacement = next(c for c in node.containers.values() if c.running)
        assert replacement.name == container.name and replacement.id != container.id
        await asyncio.sleep(0.5)
        replacement.logs.append("CUDA out of memory again")
        assert (await until(3))[:2] == (3, "CUDA out of memory again")
    finally:
        await logs.close()
        await engine.stop()
    nowhere = LogPatterns([LogPattern(name="x", regex="x", sources=("container:trainer",))], interval_s=0.1, docker_socket=tmp_path / "none.sock")
    try:
        nowhere.observe()
        await asyncio.sleep(0.2)
        assert "container:trainer: " in (counts(nowhere)["x"][2] or "")
    finally:
        await nowhere.close()
