"""Replicas in the embedded stack (`gpumedic up --replicas SERVICE=N`): the demo's stack with two
zombie-detectors and two remediators. One detector acts and the other stands by; the active one
SIGKILLed, one acts again within the lease's TTL (the supervisor restarts the killed one under its
own id, which takes its key back at once; else the standby takes over) and the zombie injected
afterwards goes from detection to verified fix. The two remediators
share the SSH round: each holds its share of the nodes' partitions, none held twice."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
from collections import Counter

import pytest
from nats.js.errors import KeyNotFoundError

from gpumedic_bus.streams import LEASES, PARTITIONS
from gpumedic_bus.topology import ADMIN
from gpumedic_sim.runs.demo import run_demo
from tests.e2e.test_metrics import scrape, value


def _active(stack, name: str) -> bool:
    return value(scrape(stack.metrics_ports[name]), "gpumedic_active") == 1.0


def _answers_active(stack, name: str) -> bool:
    """Active, as its endpoint says; one that does not answer (killed, starting) is not."""
    try:
        return _active(stack, name)
    except OSError:
        return False


# Slow: a whole-stack run of a minute or two; `make test-slow` runs it with the machine to itself.
@pytest.mark.slow
async def test_two_detectors_take_over_from_each_other_and_two_remediators_share_the_ssh_round(tmp_path):
    lines: list[str] = []
    seen: dict[str, object] = {}

    async def kill_the_active_detector(stack) -> None:
        names = ["zombie-detector", "zombie-detector-2"]
        assert set(names) <= set(stack.processes) and {"remediator", "remediator-2"} <= set(stack.processes)
        states = {name: _active(stack, name) for name in names}
        assert sorted(states.values()) == [False, True], states  # one acts, one stands by
        active = next(name for name, acts in states.items() if acts)
        victim = stack.processes[active]
        victim.send_signal(signal.SIGKILL)
        loop = asyncio.get_running_loop()
        killed_at = loop.time()
        for _ in range(300):  # the standby after the lease's TTL, or the killed one, restarted, at once (its own key)
            await asyncio.sleep(0.1)
            if sum(_answers_active(stack, name) for name in names) == 1:
                break
        seen["acting_again_s"] = loop.time() - killed_at
        seen["restarted"] = stack.processes[active].pid != victim.pid
        # The remediators' shares: the one that came up first took every partition; the other
        # gets its half within a few of their rounds (a quarter TTL each) of joining.
        nc = await stack.connect(ADMIN)
        try:
            kv = await nc.jetstream().key_value(LEASES.bucket)
            for _ in range(60):
                holders = {}
                for p in range(PARTITIONS):
                    with contextlib.suppress(KeyNotFoundError):  # between a give-back and the take
                        holders[p] = json.loads((await kv.get(f"remediator.ssh-health.p{p:02d}")).value)["instance"]
                if sorted(Counter(holders.values()).values()) == [8, 8]:
                    break
                await asyncio.sleep(0.5)
            seen["ssh_holders"], seen["shared_after_s"] = holders, loop.time() - killed_at
        finally:
            await nc.close()

    code = await run_demo(tmp_path / "var", nodes=2, gpus=1, duration_s=150, say=lines.append, on_ready=kill_the_active_detector,
                          replicas={"zombie-detector": 2, "remediator": 2})
    text = "\n".join(lines)
    assert code == 0, text
    assert "replicas: zombie-detector x2, remediator x2" in text
    assert seen["acting_again_s"] < 15, seen  # within the lease's TTL (10 s) and a round
    assert seen["restarted"], seen
    holders = seen["ssh_holders"]
    assert len(holders) == PARTITIONS and len(set(holders.values())) == 2, seen  # every partition held, by both
    assert sorted(Counter(holders.values()).values()) == [8, 8], seen
    assert "RESOLVED" in text and "(fixed)" in text
    for name in ("zombie-detector-2", "remediator-2"):
        assert (tmp_path / "var" / "logs" / f"{name}.log").stat().st_size > 0
