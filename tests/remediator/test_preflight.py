"""Pre-flight against Debian's sshd with stand-in nvidia-smi and fuser, and a real leftover process:
read-only until asked to clean, a clean only through the gate, and only on an idle GPU."""

from __future__ import annotations

import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider

from gpumedic_events import PreflightReport, PreflightRequest
from gpumedic_incidents.policy import Policy
from gpumedic_nodes.ssh import SshExecutor
from gpumedic_store import create_engine, session_factory
from gpumedic_telemetry.metrics import ServiceMetrics
from remediator import repository
from remediator.handlers import ActionHandler
from remediator.main import gate_of
from remediator.preflight import Preflight

pytestmark = pytest.mark.sshd


@pytest.fixture
def gpu_files(sshd):
    """The stand-ins' per-GPU files, removed again after the test (the sshd serves the session)."""
    written = []

    def write(name: str, text: str) -> None:
        path = sshd.directory / name
        path.write_text(text)
        written.append(path)

    yield write
    for path in written:
        path.unlink(missing_ok=True)


@pytest.fixture
async def preflight(make_settings):
    engines = []

    def _make(preflight_rules: dict | None = None, **changes) -> tuple[Preflight, object]:
        settings = make_settings(**changes)
        engine = create_engine(settings.store.url)
        engines.append(engine)
        executor = SshExecutor(
            inventory=settings.inventory,
            known_hosts=settings.known_hosts,
            client_key=settings.client_key,
            connect_timeout_s=5.0,
            command_timeout_s=5.0,
        )
        tracer = TracerProvider().get_tracer("test")
        actions = ActionHandler(
            settings=settings, gate=gate_of(settings, settings.policy.load()), runtime=SimpleNamespace(broker=None, metrics=ServiceMetrics("remediator")), sessions=session_factory(engine), executor=executor, tracer=tracer
        )
        # the node here is this machine: its real disk and memory count, so the headroom asked is
        # only that they can be read (the test below asks for more than any machine has)
        rules = {"min_free_disk_gib": 0.001, "min_available_memory_gib": 0.001} | (preflight_rules or {})
        policy = Policy.model_validate({"actions": {"kill_gpu_processes": {"grace_s": 1}}, "preflight": rules})
        return Preflight(policy=policy, executor=executor, actions=actions, tracer=tracer, verify_timeout_s=5.0), engine

    yield _make
    for engine in engines:
        await engine.dispose()


async def _ledger(engine, action_id: str):
    async with session_factory(engine)() as session:
        return await repository.get_action(session=session, action_id=action_id)


async def test_a_leftover_holding_a_gpu_is_reported_and_nothing_runs_but_reads(preflight, sshd, sleeper, gpu_files):
    gpu_files("holders0", f"{sleeper.pid}\n")
    check, _ = preflight()
    before = len(sshd.commands())
    report = await check.check(PreflightRequest(node_id=sshd.node_id))
    assert not report.ready and [g.index for g in report.gpus] == [0, 1]
    gpu0, gpu1 = report.gpus
    assert gpu0.problems == (f"/dev/nvidia0 held open by {sleeper.pid} (sleep) (a leftover NVML cannot see)",)
    assert gpu0.holder_pids == (sleeper.pid,) and gpu1.ready
    assert sleeper.alive()
    ran = sshd.commands()[before:]
    assert all(c.startswith(("nvidia-smi --query", "fuser ", "cat /proc/", "df --block-size=1 --output=avail", "grep MemAvailable:")) for c in ran), ran


async def test_clean_kills_the_leftover_through_the_gate_and_then_the_gpu_is_ready(preflight, sshd, sleeper, gpu_files):
    gpu_files("holders0", f"{sleeper.pid}\n")
    check, engine = preflight()
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,), clean=True, requested_by="ci-launcher"))
    assert report.ready, report.summary()
    assert not sleeper.alive()
    assert len(report.cleaned) == 1 and report.cleaned[0].startswith(f"GPU 0: cleaned: sent TERM to {sleeper.pid}")
    action_id = report.cleaned[0].rsplit("[action ", 1)[1].rstrip("]")
    record = await _ledger(engine, action_id)
    assert (record.status, record.incident_id, record.node_id) == ("succeeded", str(report.check_id), sshd.node_id)
    assert (record.requested_by, record.reason) == ("remediator", "pre-flight --clean by ci-launcher: leftovers on idle GPU 0")
    assert f"kill -s TERM {sleeper.pid}" in record.steps


async def test_clean_never_touches_a_busy_gpu(preflight, sshd, sleeper, gpu_files):
    gpu_files("holders0", f"{sleeper.pid}\n")
    gpu_files("gpu0.utilization", "87\n")
    check, _ = preflight()
    before = len(sshd.commands())
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,), clean=True))
    assert not report.ready and sleeper.alive()
    assert report.cleaned == ("GPU 0: not cleaned: it is 87% busy (> 5%), so what holds it may be a live job",)
    assert not any(c.startswith("kill ") for c in sshd.commands()[before:])


async def test_clean_in_observe_mode_or_on_a_protected_node_kills_nothing(preflight, sshd, sleeper, gpu_files):
    gpu_files("holders0", f"{sleeper.pid}\n")
    for changes, status in (({"mode": "observe"}, "observed"), ({"protected_nodes": {sshd.node_id}}, "blocked")):
        check, engine = preflight(**changes)
        report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,), clean=True))
        assert not report.ready and sleeper.alive(), changes
        assert report.cleaned[0].startswith(f"GPU 0: not cleaned ({status}): "), report.cleaned


async def test_an_exclusive_process_gpu_with_a_holder_names_the_cuda_error_it_causes(preflight, sshd, sleeper, gpu_files):
    """Runbook 003: in Exclusive_Process mode a leftover is why the next job dies with "CUDA-capable
    device is busy or unavailable"; the report says so. A free GPU in that mode is ready."""
    gpu_files("gpu0.mode", "Exclusive_Process\n")
    gpu_files("gpu1.mode", "Exclusive_Process\n")
    gpu_files("holders0", f"{sleeper.pid}\n")
    check, _ = preflight()
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0, 1)))
    (held, free) = report.gpus
    assert not held.ready and any("Exclusive_Process" in p and "CUDA-capable device is busy or unavailable" in p for p in held.problems)
    assert free.ready and free.compute_mode == "Exclusive_Process"


async def test_a_node_without_disk_or_memory_headroom_is_not_ready_and_says_how_much_it_has(preflight, sshd):
    """Runbook 004's "before a run": df -h /var/lib/docker (else /) and free -h, read on the node."""
    check, _ = preflight()
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,)))
    assert report.ready and report.host_problems == (), report.summary()
    check, _ = preflight({"min_free_disk_gib": 100_000, "min_available_memory_gib": 100_000})
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,)))
    disk, memory = report.host_problems
    assert not report.ready and report.gpus[0].ready
    assert "GiB free on /" in disk and "(min 100000 GiB)" in disk and "No space left on device" in disk
    assert "GiB of memory available (min 100000 GiB)" in memory
    assert "  host: not ready: " in report.summary()


async def test_a_gpu_that_admits_no_job_or_is_missing_is_not_ready(preflight, sshd, gpu_files):
    gpu_files("gpu1.mode", "Prohibited\n")
    check, _ = preflight()
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(1, 5)))
    assert [(g.index, g.problems) for g in report.gpus] == [
        (1, ("compute mode Prohibited: no job may create a context on it",)),
        (5, ("GPU 5 is not on this node (it has GPUs 0, 1)",)),
    ]


async def test_an_unknown_node_or_a_malformed_request_gets_a_report_that_says_why(preflight, sshd):
    check, _ = preflight()
    report = await check.check(PreflightRequest(node_id="gpu-node-99"))
    assert not report.ready and report.error == f"unknown node 'gpu-node-99': not in inventory {sshd.inventory}"
    for body, why in (
        (b'{"node_id": "a;reboot"}', "node_id: String should match pattern"),
        (b'{"node_id": "n", "gpus": [true]}', "gpus"),
        (b'{"node_id": "n", "gpus": []}', "name at least one GPU"),
        (b"not json", "Invalid JSON"),
    ):
        answer = PreflightReport.from_json(await check.handle(body))
        assert not answer.ready and answer.error.startswith("invalid pre-flight request: ") and why in answer.error, answer.error
        assert isinstance(answer.check_id, uuid.UUID)


async def test_deep_runs_dcgm_diagnostics_only_on_free_gpus_and_a_failed_test_is_not_ready(preflight, sshd, sleeper):
    """A stand-in dcgmi on the node's PATH prints a DCGM 4.x document (tests/fixtures/dcgm) for this test
    only; the sleeper holds GPU 0, so GPU 1 alone is free."""
    check, _ = preflight()
    none = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(1,), deep=True))
    assert none.ready and none.diagnostics == "DCGM diagnostics skipped: no dcgmi on the node", none.summary()  # Debian has no DCGM
    document = sshd.directory / "dcgm-diag.json"
    document.write_text((Path(__file__).parents[1] / "fixtures" / "dcgm" / "diag-4x-fail.json").read_text())
    dcgmi = sshd.directory / "bin" / "dcgmi"
    dcgmi.write_text(f"#!/bin/sh\n[ \"$*\" = 'diag -r 1 -j' ] || exit 2\ncat {document}\nexit 226\n")
    dcgmi.chmod(0o755)
    try:
        failed = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(1,), deep=True))
        assert not failed.ready and all(g.ready for g in failed.gpus)
        assert failed.diagnostics.startswith("DCGM diagnostics level 1 failed: memory fail on GPU 0: Pending page retirements")
        assert "diagnostics: DCGM diagnostics level 1 failed" in failed.summary()
        before = len(sshd.commands())
        busy = await check.check(PreflightRequest(node_id=sshd.node_id, deep=True))
        assert not busy.ready and busy.diagnostics.startswith("DCGM diagnostics not run: they load the GPUs")
        assert not any("dcgmi" in c for c in sshd.commands()[before:])
    finally:
        dcgmi.unlink()


async def test_memory_no_process_owns_is_offered_a_reset_and_reset_through_the_gate_when_asked(preflight, sshd, gpu_files):
    gpu_files("gpu0.memory", "6144\n")  # runbook 003: a restarted container left the driver's state behind
    (sshd.directory / "gpu0.resets").unlink(missing_ok=True)
    check, engine = preflight()
    offered = await check.check(PreflightRequest(node_id=sshd.node_id))
    assert not offered.ready and offered.resettable == (0,) and offered.reset == ()
    assert offered.gpus[0].problems == ("6144 MiB in use (max 1024)",)
    assert f"a reset through the gate may clear it (gpumedic preflight --node {sshd.node_id} --gpus 0 --reset)" in offered.summary()
    assert not (sshd.directory / "gpu0.resets").exists()  # offered, never done unasked

    report = await check.check(PreflightRequest(node_id=sshd.node_id, reset=True, requested_by="ci-launcher"))
    assert report.ready, report.summary()
    assert (sshd.directory / "gpu0.resets").read_text() == "reset\n" and report.resettable == ()
    (line,) = report.reset
    assert line.startswith("GPU 0: reset: ")
    record = await _ledger(engine, line.rsplit("[action ", 1)[1].rstrip("]"))
    assert (record.status, record.incident_id, record.operation) == ("succeeded", str(report.check_id), {"operation": "gpu_reset", "gpu_index": 0})
    assert record.reason == "pre-flight --reset by ci-launcher: 6144 MiB in use on GPU 0 with nothing using or holding it"


async def test_a_reset_never_touches_a_gpu_something_holds_nor_runs_in_observe_mode(preflight, sshd, sleeper, gpu_files):
    gpu_files("gpu0.memory", "6144\n")
    gpu_files("holders0", f"{sleeper.pid}\n")
    (sshd.directory / "gpu0.resets").unlink(missing_ok=True)
    check, _ = preflight()
    report = await check.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,), reset=True))
    assert not report.ready and report.resettable == ()
    assert report.reset == (f"GPU 0: not reset: {sleeper.pid} (sleep) use or hold it (clean first)",)
    (sshd.directory / "holders0").unlink()
    observing, _ = preflight(mode="observe")
    report = await observing.check(PreflightRequest(node_id=sshd.node_id, gpus=(0,), reset=True))
    assert not report.ready and report.reset[0].startswith("GPU 0: not reset (observed): ")
    assert not (sshd.directory / "gpu0.resets").exists() and sleeper.alive()
