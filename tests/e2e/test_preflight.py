"""`gpumedic preflight` end to end, as a job launcher runs it: the CLI asks over the real bus, the
remediator service answers over real SSH against a simulated node. A GPU held by a process left
behind by a dead container is refused with the reason; `--clean` removes it through the gate, and
the GPU passes; the audit log shows who asked. `--wait` asks again until a job has ended."""

from __future__ import annotations

import asyncio
import json

from remediator.main import create_app as remediator_app
from tests.e2e.test_operator import _cli
from tests.e2e.test_thin_path import remediator_settings


async def test_preflight_refuses_a_leftover_cleans_it_then_passes(nats_settings, store_url, fleet, apps, monkeypatch, capsys):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    node = fleet.node("sim-node-01")

    # A busy job on the GPU: not ready, and --clean must not touch it.
    job = next(p for p in node.live_processes(0) if p.is_job)
    code, out, _ = await _cli(capsys, "preflight", "--node", "sim-node-01", "--clean")
    assert code == 1 and f"compute process(es) on it: {job.pid} (python)" in out
    assert "so what holds it may be a live job" in out and node.process(job.pid).alive

    # --wait: the launcher waits for the job to end, asking again until the GPU is free
    ending = asyncio.get_running_loop().call_later(2.5, node.finish_job, 0)
    code, out, err = await _cli(capsys, "preflight", "--node", "sim-node-01", "--wait", "30", "--every", "1")
    ending.cancel()
    assert code == 0, out + err
    assert out.splitlines()[1] == "  GPU 0: ready"
    assert f"not ready yet (GPU 0: compute process(es) on it: {job.pid} (python)" in err and "asking again in 1s" in err
    # a wait that ends first is not ready, with the reasons
    leftover = node.inject_orphan(0)
    code, out, err = await _cli(capsys, "preflight", "--node", "sim-node-01", "--gpus", "0", "--wait", "2", "--every", "1")
    assert code == 1 and "NOT READY" in out and "asking again in 1s" in err
    assert node.kill(leftover.pid)

    leftover = node.inject_orphan(0)
    code, out, _ = await _cli(capsys, "preflight", "--node", "sim-node-01", "--gpus", "0")
    assert code == 1
    assert "NOT READY" in out and f"compute process(es) on it: {leftover.pid} (python)" in out
    assert node.process(leftover.pid).alive

    code, out, _ = await _cli(capsys, "preflight", "--node", "sim-node-01", "--gpus", "0", "--clean", "--by", "slurm-prolog", "--json")
    report = json.loads(out)
    assert code == 0 and report["ready"], out
    assert node.process(leftover.pid) is None and leftover.killed_by == "TERM"
    assert report["cleaned"][0].startswith(f"GPU 0: cleaned: sent TERM to {leftover.pid}; verified gone: {leftover.pid}")

    code, out, _ = await _cli(capsys, "actions", "--node", "sim-node-01", "--store", store_url)
    assert code == 0 and f"kill pid {leftover.pid} on GPU 0" in out
    action_id = report["cleaned"][0].rsplit("[action ", 1)[1].rstrip("]")
    code, out, _ = await _cli(capsys, "actions", action_id, "--store", store_url)
    assert "asked by remediator: pre-flight --clean by slurm-prolog: leftovers on idle GPU 0" in out

    # Bad input is refused before the bus, with the reason and exit 2.
    code, _, err = await _cli(capsys, "preflight", "--node", "sim-node-01", "--gpus", "0;reboot")
    assert code == 2 and "--gpus '0;reboot'" in err
    code, _, err = await _cli(capsys, "preflight", "--node", "$(reboot)")
    assert code == 2 and "node_id" in err
