"""The embedded stack supervises what it starts: with the demo's stack up, its nats-server and one
service are killed with SIGKILL; both come back (the server on its own port and data, the service
with its own environment), each with one line saying so, and the zombie injected afterwards goes
from detection to verified fix. The services' logs show the outage as a line per change of state,
not a traceback per reconnect try."""

from __future__ import annotations

import asyncio
import os
import signal

import pytest

from gpumedic_sim.runs.demo import run_demo


# Slow: a whole-stack run of half a minute; `make test-slow` runs it with the machine to itself.
@pytest.mark.slow
async def test_a_killed_nats_server_and_service_come_back_and_the_next_incident_is_fixed(tmp_path):
    lines: list[str] = []
    seen: dict[str, object] = {}

    async def kill_both(stack) -> None:
        port, victim = stack.nats.port, stack.processes["zombie-detector"]
        os.killpg(stack.nats.pid, signal.SIGKILL)
        victim.send_signal(signal.SIGKILL)
        for _ in range(300):  # the supervisor looks every second
            await asyncio.sleep(0.1)
            if {"nats-server", "zombie-detector"} <= set(stack.restarts) and stack.nats.exited is None:
                break
        seen["port"] = (port, stack.nats.port)
        seen["new pid"] = stack.processes["zombie-detector"].pid != victim.pid
        await stack.wait_ready(timeout_s=60)  # every service answers again on the restarted server

    code = await run_demo(tmp_path / "var", nodes=2, gpus=1, duration_s=150, say=lines.append, on_ready=kill_both)
    text = "\n".join(lines)
    assert code == 0, text
    assert seen["port"][0] == seen["port"][1] and seen["new pid"]
    restarted = [line for line in lines if "restarted it" in line]
    assert any(line.strip().startswith("nats-server exited with") and "same data" in line for line in restarted), text
    assert any(line.strip().startswith("zombie-detector exited with -9") for line in restarted), text
    assert "RESOLVED" in text and "(fixed)" in text
    log = (tmp_path / "var" / "logs" / "remediator.log").read_text()
    assert "Traceback" not in log, log[-3000:]
    outage = [line for line in log.splitlines() if "remediator.bus: bus:" in line]
    assert any("(reconnecting)" in line for line in outage) and any("reconnected to NATS" in line for line in outage), log[-3000:]
    assert len(outage) <= 6, "\n".join(outage)  # a line per change of state, not one per reconnect try
