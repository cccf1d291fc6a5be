"""The example consumers in examples/, as a user runs them against the embedded stack with the
demo: each logs in as the observer, keeps its own stream and durable in the observer's account,
validates every message against proto/schemas (Python: jsonschema; Node: Ajv with its default,
strict options) and prints the demo incident from opened to resolved, whether started before it
(new events) or after it (START=all: the stack keeps the observers' stream from its start); Ctrl-C
stops each within a second. The same stack's services each serve their metrics on the port
`gpumedic up` gives them."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import shutil
import signal
import sys
import time
from pathlib import Path

import pytest

from gpumedic.natsd import NatsServer
from gpumedic.stack import SERVICES, Stack, nvml_problem
from gpumedic_bus.topology import OBSERVER
from gpumedic_sim.runs.demo import run_demo
from tests.e2e.test_metrics import scrape

ROOT = Path(__file__).resolve().parents[2]
NODE_EXAMPLE = ROOT / "examples" / "node"


def _consumers() -> dict[str, list[str]]:
    node = shutil.which("node")
    assert node, "Node.js is needed for examples/node (Debian's nodejs)"
    assert (NODE_EXAMPLE / "node_modules" / "ajv").is_dir(), "run `make examples` (npm ci in examples/node) first"
    return {"python": [sys.executable, str(ROOT / "examples" / "python" / "consumer.py")],
            "node": [node, str(NODE_EXAMPLE / "consumer.mjs")]}


async def _ready(proc: asyncio.subprocess.Process, lines: list[dict]) -> None:
    while True:
        raw = await proc.stdout.readline()
        assert raw, f"the consumer exited before it was ready: {(await proc.stderr.read()).decode()[-2000:]}"
        line = json.loads(raw)
        lines.append(line)
        if line.get("ready"):
            return


@pytest.mark.long
@pytest.mark.timeout(300)
async def test_both_example_consumers_receive_and_validate_the_demo_incident(tmp_path):
    commands = _consumers()
    procs: dict[str, asyncio.subprocess.Process] = {}
    output: dict[str, list[dict]] = {name: [] for name in commands}

    served: dict[str, set[str]] = {}

    async def start_consumers(stack: Stack) -> None:
        # The stack is up: each of its six services answers on its metrics port (as `gpumedic up` prints).
        targets = json.loads((stack.var_dir / "prometheus-targets.json").read_text())
        for target in targets:
            served[target["labels"]["service"]] = {n for n, _ in scrape(int(target["targets"][0].rsplit(":", 1)[1]))}
        settings = stack.nats_settings(OBSERVER)
        env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEDIC_", "NATS_"))} | {
            "NATS_URL": settings.url, "NATS_USER": OBSERVER, "NATS_PASSWORD": settings.password.get_secret_value(),
            "NATS_CA": str(settings.tls_ca_file),
        }
        for name, command in commands.items():
            procs[name] = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE,
                                                               stderr=asyncio.subprocess.PIPE)
        for name, proc in procs.items():
            await asyncio.wait_for(_ready(proc, output[name]), 30)

    async def start_late_consumers(stack: Stack) -> None:
        """After the incident: from the start of the observers' stream, each on a durable of its own."""
        settings = stack.nats_settings(OBSERVER)
        for name, command in commands.items():
            env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEDIC_", "NATS_"))} | {
                "NATS_URL": settings.url, "NATS_USER": OBSERVER, "NATS_PASSWORD": settings.password.get_secret_value(),
                "NATS_CA": str(settings.tls_ca_file), "START": "all", "DURABLE": f"{name}-late",
            }
            late = f"{name}-late"
            output[late] = []
            procs[late] = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE,
                                                               stderr=asyncio.subprocess.PIPE)
            await asyncio.wait_for(_ready(procs[late], output[late]), 30)
            await asyncio.sleep(3)  # time to read what the stream holds

    lines: list[str] = []
    stopped_within: dict[str, float] = {}
    try:
        code = await run_demo(tmp_path / "var", nodes=2, gpus=1, duration_s=120, say=lines.append, on_ready=start_consumers,
                              on_done=start_late_consumers)
        assert code == 0, "\n".join(lines)
    finally:
        interrupted = time.monotonic()
        for proc in procs.values():  # Ctrl-C, as a person stops them
            with contextlib.suppress(ProcessLookupError):
                proc.send_signal(signal.SIGINT)

    async def stopped(name: str, proc: asyncio.subprocess.Process) -> tuple[bytes, bytes]:
        out = await proc.communicate()  # reads both pipes while it waits for the exit
        stopped_within[name] = time.monotonic() - interrupted
        return out

    done = await asyncio.wait_for(asyncio.gather(*(stopped(name, proc) for name, proc in procs.items())), 30)
    errors = {}
    for (name, proc), (out, err) in zip(procs.items(), done):
        output[name] += [json.loads(line) for line in out.decode().splitlines() if line.strip()]
        errors[name] = err.decode()
    # within a second on a quiet machine; make test runs six workers on two cores (the fault was 30 s)
    assert max(stopped_within.values()) < 5.0, stopped_within
    assert all(proc.returncode == 0 for proc in procs.values()), ({n: p.returncode for n, p in procs.items()}, errors)
    for name, got in output.items():
        events = [line for line in got if "event" in line]
        opened = [e for e in events if e["event"] == "IncidentOpened" and e["kind"] == "zombie_job"]
        assert opened, (name, got, errors[name], output)
        resolved = [e for e in events if e["event"] == "IncidentResolved" and e["incident_id"] == opened[0]["incident_id"]]
        assert resolved, (name, got, errors[name])
        assert "invalid" not in errors[name], (name, errors[name])
    assert output["python"][1:] == output["node"][1:], "both saw the same incident events, in the same order"
    assert output["python-late"][1:] == output["python"][1:], "started after the incident, with START=all: the same events"
    assert output["node-late"][1:] == output["node"][1:]
    # the demo leaves out this machine's sampler when it has no GPU
    assert set(served) == {s for s in SERVICES if s != "node-sampler" or not nvml_problem()}, served
    assert all("gpumedic_service_info" in names and "process_resident_memory_bytes" in names for names in served.values()), served


@pytest.mark.timeout(60)
@pytest.mark.parametrize("name", ["python", "node"])
async def test_a_consumer_whose_server_went_first_still_stops_cleanly_on_ctrl_c(tmp_path, name):
    """At the end of `gpumedic demo` the NATS server stops before a person stops their consumer.
    Meanwhile the consumer asks for more each second and its client buffers those requests while it
    reconnects; Ctrl-C then ends it with status 0, not a traceback from flushing them to a dead socket."""
    command = _consumers()[name]
    server = NatsServer(tmp_path / "nats", log_file=None)
    server.start()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("GPUMEDIC_", "NATS_"))} | {
        "NATS_URL": server.url, "NATS_USER": OBSERVER, "NATS_PASSWORD": "unused: this server has no logins"}
    proc = await asyncio.create_subprocess_exec(*command, env=env, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    try:
        await asyncio.wait_for(_ready(proc, []), 30)
    finally:
        server.stop()
    await asyncio.sleep(2.5)  # two or three requests for more wait in the client's buffer
    assert proc.returncode is None, "the consumer should wait for its server to come back"
    proc.send_signal(signal.SIGINT)
    _, err = await asyncio.wait_for(proc.communicate(), 10)
    assert proc.returncode == 0, err.decode()[-3000:]
