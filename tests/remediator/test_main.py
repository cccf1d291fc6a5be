"""The console script: fails fast with one clear line, runs, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

pytestmark = pytest.mark.sshd

SCRIPT = os.path.join(os.path.dirname(sys.executable), "gpumedic-remediator")


def _env(**values: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEDIC_", "OTEL_"))}
    env.update(values)
    return env


def test_missing_inventory_exits_with_a_clear_message(tmp_path):
    missing = tmp_path / "inventory.yaml"
    done = subprocess.run(
        [SCRIPT], env=_env(GPUMEDIC_REMEDIATOR_INVENTORY=str(missing)), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"gpumedic-remediator: inventory file {missing} does not exist (set GPUMEDIC_REMEDIATOR_INVENTORY)"
    )


def test_runs_until_sigterm_and_exits_cleanly(nats_url, sshd, store_url, tmp_path):
    log = tmp_path / "stderr.log"
    env = _env(
        GPUMEDIC_NATS_URL=nats_url,
        GPUMEDIC_STORE_URL=store_url,
        GPUMEDIC_REMEDIATOR_INVENTORY=str(sshd.inventory),
        GPUMEDIC_REMEDIATOR_KNOWN_HOSTS=str(sshd.known_hosts),
        GPUMEDIC_REMEDIATOR_CLIENT_KEY=str(sshd.client_key),
    )
    with log.open("w") as err:
        proc = subprocess.Popen([SCRIPT], env=env, stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 30
        while "remediator ready" not in log.read_text():
            assert proc.poll() is None, log.read_text()
            assert time.monotonic() < deadline, log.read_text()
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=30) == 0, log.read_text()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    text = log.read_text()
    assert "remediator: mode observe" in text
    assert "Traceback" not in text
    assert str(sshd.client_key) not in text
