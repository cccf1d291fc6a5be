"""The fourth attack's third and fourth holes: `gpumedic logs` ran `tail -c N -- PATH`, so a job
that could write its own log directory made `worker.log` a symlink to a file with a shadow line and
an OpenSSH private key, and got the hash and the key's body back in clear (masking was per line);
and 1,000 lines of `"` made a reply twice the bus's limit (JSON escapes each), which the CLI
never got. Against Debian's sshd, with real symlinks, a real FIFO and a real shell."""

from __future__ import annotations

import os
import uuid

import pytest

from gpumedic_events import LogReport, LogRequest
from gpumedic_events.base import MAX_EVENT_BYTES
from gpumedic_incidents.policy import LogFile, LogsPolicy, Policy
from gpumedic_nodes.ssh import SshExecutor
from remediator.logs import LogReader

KEY = ("-----BEGIN OPENSSH PRIVATE KEY-----\n"
       "b3BlbnNzaC1rZXktdjEAAAAABG5vbmUAAAAEbm9uZQAAAAAAAAABAAAAMwAAAAtzc2gtZW\n"
       "QyNTUxOQAAACDd0q0wHm5zQ2l2ZXJ5c2VjcmV0a2V5Ym9keWxpbmUyAAAAkHNlY3JldA==\n"
       "-----END OPENSSH PRIVATE KEY-----\n")
SHADOW = "root:$6$Zq9x1Lm2$Yk0rVbQy3nP1x4uJc8sW2eT6gH9dF5aB7nM3kL1pO0iU.zX/cV4bN6mQ8wE2rT1yU3iO5pA7sD9fG0hJ2kL4:19700:0:99999:7:::\n"
SECRETS = ("Zq9x1Lm2", "Yk0rVbQy3nP1", "b3BlbnNzaC1rZXkt", "QyNTUxOQAAACDd0q0")


@pytest.fixture
def logs(sshd, tmp_path):
    """A reader for `worker` at a path in a directory a job could write, over the real sshd."""
    directory = tmp_path / "job" / "logs"
    directory.mkdir(parents=True)
    policy = Policy(logs=LogsPolicy(files={"worker": LogFile(path=str(directory / "worker.log"))}))
    executor = SshExecutor(inventory=sshd.inventory, known_hosts=sshd.known_hosts, client_key=sshd.client_key,
                           connect_timeout_s=5.0, command_timeout_s=5.0)
    reader = LogReader(policy=policy, executor=executor, inventory=sshd.inventory)

    async def read(lines: int = 200) -> LogReport:
        answer = await reader.handle(LogRequest(node_id=sshd.node_id, log="worker", lines=lines).to_json())
        assert len(answer) <= MAX_EVENT_BYTES  # always a reply the CLI takes
        return LogReport.from_json(answer)

    return directory, read


def _loot(tmp_path):
    loot = tmp_path / "loot"
    loot.write_text(SHADOW + KEY)
    return loot


async def test_a_log_that_is_a_symlink_is_not_read(logs, tmp_path):
    directory, read = logs
    (directory / "worker.log").symlink_to(_loot(tmp_path))
    report = await read()
    assert report.lines == () and "a symlink or no regular file: not read" in report.error
    assert not any(secret in report.to_json().decode() for secret in SECRETS)


async def test_a_log_reached_through_a_linked_directory_is_not_read(logs, tmp_path):
    directory, read = logs
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "worker.log").write_text(SHADOW + KEY)
    directory.rmdir()
    directory.symlink_to(elsewhere)  # the log's own name is a regular file; a directory on the way is a link
    report = await read()
    assert report.lines == () and "a link on its way leads to another file: not read" in report.error
    assert not any(secret in report.to_json().decode() for secret in SECRETS)


async def test_a_fifo_or_a_directory_in_the_logs_place_is_refused_without_waiting(logs):
    directory, read = logs
    os.mkfifo(directory / "worker.log")
    report = await read()
    assert report.lines == () and "no regular file" in report.error
    os.unlink(directory / "worker.log")
    (directory / "worker.log").mkdir()
    assert "no regular file" in (await read()).error


async def test_a_private_key_and_a_password_hash_in_a_real_log_are_masked_whole(logs):
    directory, read = logs
    (directory / "worker.log").write_text("INFO starting\n" + SHADOW + KEY + "INFO done\n")
    report = await read()
    assert report.error == "" and report.lines[0] == "INFO starting" and report.lines[-1] == "INFO done"
    assert report.lines[1].startswith("root:***:19700")
    assert report.lines[2] == "-----BEGIN OPENSSH PRIVATE KEY----- *** -----END OPENSSH PRIVATE KEY-----"
    assert not any(secret in line for line in report.lines for secret in SECRETS)


async def test_a_log_of_escaped_characters_comes_back_within_a_message_saying_how_much_was_left_out(logs):
    directory, read = logs
    (directory / "worker.log").write_text(('"' * 1000 + "\n") * 1000)  # 1 MB that JSON doubles
    report = await read(lines=1000)
    assert report.error == "" and 0 < len(report.lines) < 1000
    assert report.left_out == 1000 - len(report.lines)
    assert all(line == '"' * 1000 for line in report.lines)
    assert uuid.UUID(str(report.read_id))


async def test_the_cli_says_how_many_lines_were_left_out(nats_settings, store_url, fleet, apps, monkeypatch, capsys, tmp_path):
    from gpumedic_incidents.policy import dump_policy
    from gpumedic_sim.machine.node import WORKER_LOG
    from remediator.main import create_app as remediator_app
    from tests.e2e.test_operator import _cli
    from tests.e2e.test_thin_path import remediator_settings

    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    dump_policy(Policy(logs=LogsPolicy(files={"worker": LogFile(path=str(WORKER_LOG))})), tmp_path / "policy.yaml")
    base = remediator_settings(nats_settings, store_url, fleet)
    await apps.start(remediator_app(type(base)(**{**base.model_dump(exclude={"policy"}), "policy": {"file": tmp_path / "policy.yaml"}})))
    fleet.node("sim-node-01").worker_log.write_text(('"' * 1000 + "\n") * 400)  # 800 KB of JSON for 400 lines

    code, out, err = await _cli(capsys, "logs", "sim-node-01", "worker", "--lines", "400")
    assert code == 0, err
    shown = len(out.splitlines())
    assert 0 < shown < 400 and f"({400 - shown} earlier line(s) left out to fit one message" in err
