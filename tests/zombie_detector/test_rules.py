"""Each node rule beyond the zombie one, driven directly through the node-incident logic with plain
events: the kinds, their fingerprints, evidence and recommended actions, and what must open nothing."""

from __future__ import annotations

import logging
import uuid
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_events import (
    ActionCompleted,
    DockerPrune,
    DrainNode,
    GpuReset,
    UndrainNode,
    ActionOutcome,
    ActionRequested,
    ConsumerLag,
    ContainerExited,
    DeviceHolder,
    DiskUsage,
    GpuLost,
    GpuProcess,
    GpuSample,
    GpuXidReported,
    HostSample,
    IncidentEscalated,
    IncidentKind,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    JobsObservation,
    NodeRetired,
    NodeSampled,
    NodeSshChecked,
    ServiceHeartbeat,
    ProcessOomKilled,
    RestartUnit,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, Kinds, RowRemapPolicy, ValidationPolicy
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules.container import ContainerRule

T0 = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
POLICY = Policy(fleet=FleetPolicy(hold_s=0))
CID = "3f9c2a7d4b1e8f6a0c5d2e9b7a4f1c8d3e6b9a2f5c8e1d4a7b0c3f6e9d2a5b8c"
JOB = GpuProcess(pid=4242, start_ticks=777, command="python -m selfplay", container_id=CID[:12], container_exists=True)


def at(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def sample(node="n1", *, gpus=None, jobs=1, disks=(), memory=(100_000, 50_000), holders=(), nvml_error=None, interval=5.0) -> NodeSampled:
    gpus = gpus if gpus is not None else (GpuSample(index=0, utilization_gpu_pct=90, processes=(JOB,)),)
    return NodeSampled(
        source="node-sampler", node_id=node, interval_s=interval, gpus=gpus, device_holders=holders,
        host=HostSample(memory_total_mib=memory[0], memory_available_mib=memory[1], disks=disks),
        jobs=JobsObservation(running=jobs, output_growing=True), nvml_error=nvml_error,
    )


class Detector:
    """The node-incident logic with every rule, committing what it decides; events by kind."""

    def __init__(self, policy: Policy = POLICY) -> None:
        self.logic = NodeIncidents(policy)
        self.events: list = []

    def feed(self, event, s: float) -> list:
        """An event made without a time of its own was taken as it is fed: the node's clock is the
        detector's here, as rules that order a node's facts by the node's clock assume."""
        if "occurred_at" not in event.model_fields_set:
            event = event.model_copy(update={"occurred_at": at(s)})
        return self._commit(self.logic.on_event(event, at(s)), at(s))

    def tick(self, s: float) -> list:
        return self._commit(self.logic.on_tick(at(s)), at(s))

    def _commit(self, transitions, now: datetime | None = None) -> list:
        out = []
        for t in transitions:
            self.logic.book.commit(t, now)
            out += t.events
        self.events += out
        return out

    def opened(self, kind: IncidentKind | None = None) -> list[IncidentOpened]:
        return [e for e in self.events if isinstance(e, IncidentOpened) and (kind is None or e.kind is kind)]


# --- orphan_gpu_holder ----------------------------------------------------------------------


def orphaned_gpu(util=0) -> GpuSample:
    leftover = JOB.model_copy(update={"container_exists": False})
    return GpuSample(index=0, utilization_gpu_pct=util, memory_used_mib=8192, processes=(leftover,))


def test_a_holder_whose_container_is_gone_is_an_orphan_after_it_stays_and_is_killed():
    d = Detector()
    for s in range(0, 30, 5):
        assert d.feed(sample(gpus=(orphaned_gpu(),)), s) == []  # a restart in place shows this briefly
    opened, request = d.feed(sample(gpus=(orphaned_gpu(),)), 30)
    assert opened.kind is IncidentKind.ORPHAN_GPU_HOLDER and opened.fingerprint == "n1/orphan_gpu_holder/0"
    assert "its container 3f9c2a7d4b1e is gone" in opened.summary
    assert [t.pid for t in request.operation.targets] == [4242] and request.operation.max_gpu_utilization_pct == 4
    assert d.opened(IncidentKind.ZOMBIE_JOB) == []  # a leftover is not a hung job


def test_a_device_file_holder_without_compute_context_is_an_orphan_of_its_gpu():
    holder = DeviceHolder(pid=5151, start_ticks=9, command="python leftover.py", container_id="dead", container_exists=False,
                          devices=("/dev/nvidia3", "/dev/nvidiactl"))
    d = Detector()
    idle = GpuSample(index=3, utilization_gpu_pct=0)
    for s in range(0, 35, 5):
        d.feed(sample(gpus=(idle,), holders=(holder,)), s)
    (opened,) = d.opened(IncidentKind.ORPHAN_GPU_HOLDER)
    assert opened.gpu_index == 3 and "without a compute context" in opened.summary


def test_an_orphan_that_goes_away_resolves_and_a_live_container_is_no_orphan():
    d = Detector()
    for s in range(0, 35, 5):
        d.feed(sample(gpus=(orphaned_gpu(),)), s)
    request = next(e for e in d.events if isinstance(e, ActionRequested))
    d._commit(d.logic.on_action_completed(
        ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id,
                        node_id="n1", attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="killed"),
        at(36), None,
    ))
    (resolved,) = d.feed(sample(), 40)
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"
    d = Detector()
    for s in range(0, 100, 5):
        d.feed(sample(gpus=(GpuSample(index=0, utilization_gpu_pct=0, processes=(JOB,)),)), s)
    assert d.opened(IncidentKind.ORPHAN_GPU_HOLDER) == []


def _answered_until_done(d: Detector, gpus: tuple[GpuSample, ...], until_s: float) -> list:
    """Samples every 5 s; each action requested 'succeeds' and the GPU stays held (runbook 003)."""
    asked = []
    for s in range(0, int(until_s), 5):
        for event in d.feed(sample(gpus=gpus), s):
            if isinstance(event, ActionRequested):
                asked.append(event.operation.operation)
                succeeded(d, event, s + 1)
    return asked


def test_a_gpu_that_kills_do_not_free_has_its_rented_pod_restarted_unless_other_work_runs_there():
    d = Detector()
    asked = _answered_until_done(d, (orphaned_gpu(),), 400)
    assert asked == ["kill_gpu_processes", "kill_gpu_processes", "restart_worker"]
    busy = GpuSample(index=1, utilization_gpu_pct=95, processes=(JOB.model_copy(update={"pid": 5000}),))
    d = Detector()
    asked = _answered_until_done(d, (orphaned_gpu(), busy), 400)
    assert asked == ["kill_gpu_processes", "kill_gpu_processes"]  # a restart would end the job on GPU 1
    (escalated,) = [e for e in d.events if isinstance(e, IncidentEscalated)]
    assert "no safe restart_worker" in escalated.reason


# --- XIDs ---------------------------------------------------------------------------------------


def xid(code: int, gpu: int | None = 2, node="n1") -> GpuXidReported:
    return GpuXidReported(source="node-sampler", node_id=node, gpu_index=gpu, xid=code)


def test_a_hardware_xid_drains_the_node_then_resets_the_gpu_and_a_storm_counts_on_it():
    d = Detector()
    opened, drain = d.feed(xid(48), 0)
    assert opened.kind is IncidentKind.GPU_XID and opened.severity == "critical"
    assert opened.evidence["bucket"] == "reset_gpu" and "reset" in opened.recommended_action
    assert drain.operation == DrainNode() and drain.fingerprint == "n1/gpu_xid/2"
    succeeded(d, drain, 1)
    reset = d.events[-1]
    assert reset.operation == GpuReset(gpu_index=2) and reset.attempt == 2 and "n1 GPU 2 is drained" in reset.reason
    for s in range(2, 13):
        d.feed(xid(48), s)
    assert len(d.opened()) == 1
    assert [e.occurrences for e in d.events if isinstance(e, IncidentUpdated)] == [2, 10]


def test_a_reset_is_verified_by_the_next_samples_and_the_node_returns_fixed():
    d = Detector()
    _, drain = d.feed(xid(48), 0)
    succeeded(d, drain, 1)
    reset = d.events[-1]
    succeeded(d, reset, 2)
    pending = sample(gpus=(healthy(2, remapped_rows_pending=True),))
    assert d.feed(pending, 5) == []  # not verified yet: the reset did not clear the remap
    (validating,) = d.feed(sample(gpus=(healthy(2),)), 10)  # verified: counts as the first ready sample
    assert isinstance(validating, IncidentUpdated) and d.logic.book.get("n1/gpu_xid/2").ready_samples == 1
    d.feed(sample(gpus=(healthy(2),)), 15)
    (undrain,) = d.feed(sample(gpus=(healthy(2),)), 20)
    assert undrain.operation == UndrainNode() and undrain.attempt == 3
    succeeded(d, undrain, 21)
    (resolved,) = [e for e in d.events if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "fixed"


def test_a_reset_the_samples_never_verify_goes_to_a_person_with_the_node_drained():
    d = Detector()
    _, drain = d.feed(xid(48), 0)
    succeeded(d, drain, 1)
    succeeded(d, d.events[-1], 2)
    for s in range(5, 130, 5):
        d.feed(sample(gpus=(healthy(2, remapped_rows_pending=True),)), s)
    (escalated,) = d.tick(130)  # not verified within verify_within_s (120 s), and the ladder is done
    assert isinstance(escalated, IncidentEscalated)
    assert "did not fix n1 GPU 2" in escalated.reason and d.logic.book.get("n1/gpu_xid/2").drained


def test_an_xid_that_needs_more_than_a_reset_drains_and_goes_to_a_person():
    d = Detector()
    _, drain = d.feed(xid(154), 0)  # the GPU's recovery action changed: NVIDIA's XID_154, a reboot
    succeeded(d, drain, 1)
    (escalated,) = [e for e in d.events if isinstance(e, IncidentEscalated)]
    assert escalated.reason == "no safe gpu_reset for n1 GPU 2 (the node is drained)"
    assert d.logic.book.get("n1/gpu_xid/2").drained


@pytest.mark.parametrize("code", [63, 92, 43, 14, 121])  # NVIDIA's catalogue: IGNORE
def test_an_xid_nvidia_says_to_ignore_opens_nothing(code):
    d = Detector()
    assert d.feed(xid(code), 0) == [] and d.opened() == []


def test_an_xid_nvidia_sends_to_support_goes_to_a_person_without_a_drain():
    d = Detector()
    opened, escalated = d.feed(xid(54), 0)  # auxiliary power not connected: CHECK_MECHANICALS
    assert opened.evidence["nvidia_action"] == "CHECK_MECHANICALS" and opened.evidence["bucket"] == "person"
    assert isinstance(escalated, IncidentEscalated) and "CHECK_MECHANICALS for XID 54" in escalated.reason
    assert not any(isinstance(e, ActionRequested) for e in d.events)


def test_every_code_of_nvidias_catalogue_is_known():
    from gpumedic_events.xid import XID_CATALOGUE

    assert sorted(XID_CATALOGUE) == list(range(1, 173))
    assert XID_CATALOGUE[48].mnemonic == "ROBUST_CHANNEL_GPU_ECC_DBE" and XID_CATALOGUE[48].bucket == "reset_gpu"
    assert XID_CATALOGUE[79].bucket == "reboot" and XID_CATALOGUE[13].bucket == "application"


def test_an_unknown_xid_is_never_drained_on_a_guess():
    d = Detector()
    opened, escalated = d.feed(xid(777), 0)
    assert isinstance(escalated, IncidentEscalated) and "not in gpumedic's catalogue" in escalated.reason
    assert not any(isinstance(e, ActionRequested) for e in d.events)


def test_xid_79_is_a_gpu_off_the_bus():
    d = Detector()
    d.feed(xid(79), 0)
    (opened,) = d.opened()
    assert opened.kind is IncidentKind.GPU_LOST and opened.fingerprint == "n1/gpu_lost/2"


def test_application_xids_are_the_jobs_fault_until_they_follow_the_gpu_across_jobs():
    d = Detector()
    on = lambda pid: sample(gpus=(GpuSample(index=2, utilization_gpu_pct=90, processes=(JOB.model_copy(update={"pid": pid}),)),))  # noqa: E731
    d.feed(xid(13), 0)  # the node's first XID: its job is not known yet
    d.feed(on(1001), 1)
    d.feed(xid(13), 2)
    assert d.opened() == []  # one job so far: the job's fault
    d.feed(on(1001), 3)
    d.feed(xid(31), 4)
    assert d.opened() == []  # the same job again
    d.feed(on(2002), 5)
    d.feed(xid(13), 6)  # a second job on the same GPU: the GPU is the common factor
    (opened,) = d.opened()
    assert opened.kind is IncidentKind.GPU_XID and "under 2 different jobs" in opened.summary


def test_xid_45_is_noise_and_an_unknown_code_is_recorded_for_a_person(caplog):
    d = Detector()
    d.feed(xid(45), 0)
    assert d.opened() == []
    d.feed(xid(777), 1)
    (opened,) = d.opened()
    assert opened.kind is IncidentKind.GPU_XID and "a code gpumedic does not know" in opened.summary
    d.feed(xid(4_000_000_000, gpu=None), 2)
    assert "far beyond known codes" in caplog.text
    assert d.opened()[-1].fingerprint == "n1/gpu_xid/node"


# --- gpu_lost -----------------------------------------------------------------------------------


def healthy(index: int, **changes) -> GpuSample:
    return GpuSample(**{"index": index, "utilization_gpu_pct": 0, "memory_used_mib": 0, "remapped_rows_pending": False, **changes})


def test_a_lost_gpu_drains_its_node_which_returns_only_after_healthy_samples():
    # the pending remap's own incident (row_remap, test_gpu_health) is left out here: validation's view only
    d = Detector(Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(row_remap=RowRemapPolicy(after_samples=1000))))
    d.feed(GpuLost(source="node-sampler", node_id="n1", gpu_index=1, reason="NVMLError_GpuIsLost"), 0)
    lost = GpuSample(index=1, lost=True)
    d.feed(sample(gpus=(GpuSample(index=0, utilization_gpu_pct=90, processes=(JOB,)), lost)), 1)
    (opened,) = d.opened()
    assert opened.kind is IncidentKind.GPU_LOST and opened.severity == "critical" and "reboot" in opened.recommended_action
    drain = next(e for e in d.events if isinstance(e, ActionRequested))
    succeeded(d, drain, 2)
    assert "n1 GPU 1 is drained" in d.events[-1].reason  # and the rest is a person's (a reboot)
    # After the reboot the GPU answers: the fault is gone, but the node is not given back yet.
    (validating,) = d.feed(sample(gpus=(healthy(0), healthy(1, remapped_rows_pending=True))), 10)
    assert isinstance(validating, IncidentUpdated) and "stays drained until 3 samples in a row" in validating.summary
    for s in (15, 20, 25):  # a row remap waits for a reset: not ready, however often
        assert d.feed(sample(gpus=(healthy(0), healthy(1, remapped_rows_pending=True))), s) == []
    d.feed(sample(gpus=(healthy(0), healthy(1))), 30)
    d.feed(sample(gpus=(healthy(0), healthy(1, memory_used_mib=30_000))), 35)  # someone started a job on it: start over
    d.feed(sample(gpus=(healthy(0), healthy(1))), 40)
    assert d.feed(sample(gpus=(healthy(0), healthy(1))), 45) == []
    (undrain,) = d.feed(sample(gpus=(healthy(0), healthy(1))), 50)
    assert undrain.operation == UndrainNode() and "validated: 3 samples in a row with GPU 1 free and healthy" in undrain.reason
    succeeded(d, undrain, 51)
    (resolved,) = [e for e in d.events if isinstance(e, IncidentResolved)]
    assert resolved.resolution == "cleared" and "validated" in resolved.summary
    assert d.logic.book.incidents == {}


def test_a_drained_node_that_never_validates_stays_drained_with_a_person():
    d = Detector(Policy(fleet=FleetPolicy(hold_s=0), validation=ValidationPolicy(ready_samples=2, within_s=60)))
    d.feed(GpuLost(source="node-sampler", node_id="n1", gpu_index=0, reason="lost"), 0)
    succeeded(d, next(e for e in d.events if isinstance(e, ActionRequested)), 1)
    d.feed(sample(gpus=(healthy(0, processes=(JOB,)),)), 10)  # the GPU answers, with a process on it
    for s in range(15, 70, 5):
        d.feed(sample(gpus=(healthy(0, processes=(JOB,)),)), s)
    (escalated,) = d.tick(75)
    assert isinstance(escalated, IncidentEscalated) and "the node stays drained" in escalated.reason
    assert d.logic.book.get("n1/gpu_lost/0").drained and not any(
        isinstance(e, ActionRequested) and e.operation == UndrainNode() for e in d.events
    )


def test_a_fault_that_comes_back_while_validating_goes_to_a_person():
    d = Detector()
    d.feed(GpuLost(source="node-sampler", node_id="n1", gpu_index=0, reason="lost"), 0)
    succeeded(d, next(e for e in d.events if isinstance(e, ActionRequested)), 1)
    d.feed(sample(gpus=(healthy(0),)), 10)
    (escalated,) = d.feed(sample(gpus=(GpuSample(index=0, lost=True),)), 15)
    assert "the fault came back while validating n1 GPU 0" in escalated.reason


# --- host ---------------------------------------------------------------------------------------


def disk(pct: float, path="/var/lib/docker") -> DiskUsage:
    total = 1000 * 2**30
    used = int(total * pct / 100)
    return DiskUsage(path=path, total_bytes=total, used_bytes=used, available_bytes=total - used, used_pct=pct)


def test_a_sample_taken_before_the_xid_79_does_not_clear_the_lost_gpu_into_a_second_incident():
    # The driver reports XID 79 while a sample taken just before it is on its way: that sample shows
    # GPU 1 answering. It must not clear the incident, or the next sample (GPU lost) would open the
    # same fault again, and two gpu_lost incidents make a repeat offender of the host.
    d = Detector(Policy())  # the default hold: the incident waits before its drain, when a clear would end it
    node_time = datetime.now(UTC)
    before = sample(gpus=(healthy(0), healthy(1))).model_copy(update={"occurred_at": node_time - timedelta(seconds=0.2)})
    xid = GpuXidReported(source="node-sampler", node_id="n1", gpu_index=1, xid=79, occurred_at=node_time)
    d.feed(xid, 0)
    (opened,) = d.opened()
    assert opened.kind is IncidentKind.GPU_LOST and opened.gpu_index == 1
    d.feed(before, 0.1)
    assert not [e for e in d.events if isinstance(e, IncidentResolved | IncidentUpdated)], d.events
    after = sample(gpus=(healthy(0), GpuSample(index=1, lost=True))).model_copy(update={"occurred_at": node_time + timedelta(seconds=1)})
    d.feed(after, 1)
    assert len(d.opened(IncidentKind.GPU_LOST)) == 1
    (drain,) = d.tick(16)
    assert isinstance(drain, ActionRequested) and drain.operation == DrainNode()
    succeeded(d, drain, 17)
    # After the reboot, a sample taken later than every report of the loss clears it (validation starts).
    rebooted = sample(gpus=(healthy(0), healthy(1))).model_copy(update={"occurred_at": node_time + timedelta(minutes=5)})
    (validating,) = d.feed(rebooted, 300)
    assert isinstance(validating, IncidentUpdated) and "stays drained until" in validating.summary


def succeeded(d: Detector, request: ActionRequested, s: float) -> None:
    """The remediator answers that `request` ran."""
    d._commit(d.logic.on_action_completed(
        ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id,
                        node_id=request.node_id, attempt=request.attempt, outcome=ActionOutcome.SUCCEEDED, detail="done"),
        at(s), None,
    ), at(s))


def test_a_full_docker_disk_is_pruned_and_resolves_fixed_once_under_the_clearing_line():
    d = Detector()
    opened, request = d.feed(sample(disks=(disk(96),)), 0)
    assert opened.kind is IncidentKind.DISK_PRESSURE and opened.fingerprint == "n1/disk_pressure/node/var-lib-docker"
    assert "docker system prune" in opened.recommended_action
    assert request.operation == DockerPrune()  # never volumes: the request does not even ask
    succeeded(d, request, 1)
    assert d.feed(sample(disks=(disk(92),)), 5) == []  # between the lines: still open, nothing new
    (resolved,) = d.feed(sample(disks=(disk(89),)), 10)
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"
    assert d.feed(sample(disks=(disk(94),)), 15) == []  # below the opening line


def test_a_full_data_disk_is_a_person_s_call_never_a_prune():
    d = Detector()
    opened, escalated = d.feed(sample(disks=(disk(97, "/data"),)), 0)
    assert opened.fingerprint == "n1/disk_pressure/node/data"
    assert isinstance(escalated, IncidentEscalated) and "docker_prune frees /var/lib/docker only" in escalated.reason
    assert not [e for e in d.events if isinstance(e, ActionRequested)]
    (resolved,) = d.feed(sample(disks=(disk(80, "/data"),)), 5)
    assert resolved.resolution == "cleared"


def test_host_memory_pressure_with_hysteresis():
    d = Detector()
    opened, _ = d.feed(sample(memory=(100_000, 3_000)), 0)
    assert opened.kind is IncidentKind.HOST_MEMORY_PRESSURE
    assert d.feed(sample(memory=(100_000, 8_000)), 5) == []
    assert isinstance(d.feed(sample(memory=(100_000, 20_000)), 10)[0], IncidentResolved)


# --- the node as a whole -------------------------------------------------------------------


def test_a_node_gone_quiet_gets_its_sampler_restarted_and_its_next_sample_verifies_it():
    d = Detector()
    d.feed(sample(), 0)
    d.feed(sample("n2"), 15)  # the bus delivers: n2 samples on
    assert d.tick(15) == []  # three intervals of 5 s
    d.feed(sample("n2"), 16)
    opened, request = d.tick(16)
    assert opened.kind is IncidentKind.NODE_SILENT and "no sample from the node for 16s" in opened.summary
    assert request.operation == RestartUnit(unit="gpumedic-node-sampler.service")
    succeeded(d, request, 17)
    d.feed(sample("n2"), 30)
    assert d.tick(30) == []  # still silent: nothing new
    (resolved,) = d.feed(sample(), 31)
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"


def test_the_tick_looks_again_at_every_node_when_one_joins_or_samples_faster_than_the_rest_were_due():
    """The tick passes over every node only once the freshest sample may have made one overdue;
    a node that joins, or whose interval shrinks, may be due before all the others."""
    d = Detector()
    d.feed(sample("slow", interval=60.0), 0)  # due after three minutes
    assert d.tick(1) == []  # looked at: nothing due before 180 s
    d.feed(sample("fast", interval=1.0), 2)  # joins later, due after three seconds
    for s in range(3, 6):
        d.feed(sample("slow", interval=60.0), s)
        assert d.tick(s) == []
    d.feed(sample("slow", interval=60.0), 6)
    (opened, _) = d.tick(6)
    assert (opened.kind, opened.node_id) == (IncidentKind.NODE_SILENT, "fast")

    d = Detector()
    d.feed(sample("a", interval=60.0), 0)
    d.feed(sample("b", interval=60.0), 0)
    assert d.tick(1) == []  # nothing due before 180 s
    d.feed(sample("b", interval=2.0), 2)  # b's interval shrinks: due after six seconds now
    for s in range(3, 9):
        d.feed(sample("a", interval=60.0), s)
        assert d.tick(s) == []
    d.feed(sample("a", interval=60.0), 9)
    (opened, _) = d.tick(9)
    assert (opened.kind, opened.node_id) == (IncidentKind.NODE_SILENT, "b")


def test_a_restarted_sampler_that_samples_before_the_restart_is_confirmed_is_still_verified_by_the_next_sample():
    d = Detector()
    d.feed(sample(), 0)
    d.feed(sample("n2"), 15)
    d.feed(sample("n2"), 16)
    _, request = d.tick(16)
    assert d.feed(sample(), 17) == []  # the sampler is back before the remediator has answered: not taken
    succeeded(d, request, 18)
    (resolved,) = d.feed(sample(), 22)  # the next sample verifies the restart
    assert isinstance(resolved, IncidentResolved) and resolved.resolution == "fixed"


def test_a_retired_worker_is_forgotten_and_what_was_open_on_it_closes_even_with_an_action_in_flight():
    d = Detector()
    d.feed(sample(), 0)
    d.feed(sample("n2"), 15)
    d.feed(sample("n2"), 16)
    opened, request = d.tick(16)  # n1 silent, its sampler's restart asked for
    retired = NodeRetired(source="remediator", node_id="n1", incident_id=uuid.uuid4(), action_id=uuid.uuid4(),
                          reason="terminate_worker: terminated n1")
    (resolved,) = d.feed(retired, 17)
    assert isinstance(resolved, IncidentResolved) and resolved.incident_id == opened.incident_id
    assert resolved.resolution == "cleared" and "retired: terminate_worker: terminated n1" in resolved.summary
    assert d.feed(ActionCompleted(source="remediator", action_id=request.action_id, incident_id=request.incident_id, node_id="n1",
                                  attempt=1, outcome=ActionOutcome.FAILED, detail="not in the inventory"), 18) == []
    for s in range(20, 120, 5):  # n2 samples on; n1 never again, and is never silent again
        d.feed(sample("n2"), s)
        assert d.tick(s) == []
    assert d.feed(retired, 121) == []  # a re-delivered retirement: nothing left to close
    late = sample().model_copy(update={"occurred_at": retired.occurred_at - timedelta(seconds=1)})
    assert d.feed(late, 122) == [] and d.tick(140) == []  # sent before it was ended, delivered after: no node back
    d.feed(sample("n1"), 141)  # a node of that id that samples now is a new node, watched as any
    for s in (145, 150, 155, 157):
        d.feed(sample("n2"), s)
    (opened, _) = d.tick(157)
    assert opened.kind is IncidentKind.NODE_SILENT and opened.node_id == "n1"


def test_when_every_node_stops_at_once_the_detector_lost_the_bus_and_no_node_is_silent():
    d = Detector()
    d.feed(sample("n1"), 0)
    d.feed(sample("n2"), 0)
    assert d.tick(60) == []  # nothing arrived from anyone: the detector's own bus, not the nodes
    d.feed(sample("n1"), 61)  # the bus is back; n1 samples, n2 does not
    assert d.tick(61) == []
    d.feed(sample("n1"), 76)
    assert d.tick(76) == []  # counted from when the bus came back: 15 s, not yet three intervals
    d.feed(sample("n1"), 77)
    (opened, _) = d.tick(77)
    assert opened.kind is IncidentKind.NODE_SILENT and opened.node_id == "n2"


DETECTOR_INSTANCE = uuid.uuid4()


def behind(s: float, service="zombie-detector", *, pending=5000, instance=DETECTOR_INSTANCE, state="ready") -> ServiceHeartbeat:
    """A service's heartbeat saying how far behind its samples it is."""
    lag = (ConsumerLag(durable=f"{service}-samples", pending=pending if s else 0, behind_s=s),)
    return ServiceHeartbeat(source=service, service=service, instance_id=instance, state=state, lag=lag)


def test_while_the_detector_is_behind_its_samples_no_node_is_silent_and_each_counts_afresh_once_caught_up():
    """At 10,000 nodes the detector fell behind and called thousands of healthy nodes silent: a
    sample still waiting in the stream is no silent node."""
    d = Detector()
    d.feed(sample("n1"), 0)
    d.feed(sample("n2"), 0)
    d.feed(behind(20), 1)  # 20 s behind: samples of both may wait unseen
    for s in range(5, 60, 5):
        d.feed(sample("n2"), s)  # what trickles in is n2's
        assert d.tick(s) == []
    assert not d.opened(IncidentKind.NODE_SILENT)
    d.feed(behind(0.2), 60)  # caught up: n1's count starts from here
    d.feed(sample("n2"), 70)
    assert d.tick(70) == [] and not d.opened(IncidentKind.NODE_SILENT)
    d.feed(sample("n2"), 76)
    (opened, _) = d.tick(76)  # three intervals after catching up, still nothing from n1: silent now
    assert opened.kind is IncidentKind.NODE_SILENT and opened.node_id == "n1"


def test_a_service_behind_its_samples_is_one_control_plane_incident_until_it_catches_up():
    d = Detector()
    assert d.feed(behind(4), 0) == []  # under control_plane_behind.after_s (10 s): keeping up
    opened, *_ = d.feed(behind(25, pending=38_000), 1)
    assert (opened.kind, opened.node_id) == (IncidentKind.CONTROL_PLANE_BEHIND, "control-plane")
    assert opened.summary.startswith("zombie-detector is 25s behind its samples (38,000 waiting on zombie-detector-samples) since ")
    assert "it judges no node silent meanwhile" in opened.summary
    d.feed(behind(40), 6)
    d.feed(behind(8), 11)  # below the limit, not yet below half of it: still behind
    assert len(d.opened(IncidentKind.CONTROL_PLANE_BEHIND)) == 1 and not [e for e in d.events if isinstance(e, IncidentResolved)]
    d.feed(behind(0.1, instance=uuid.uuid4()), 12)  # another instance that keeps up says nothing of this one
    d.feed(behind(0, instance=uuid.uuid4()).model_copy(update={"lag": ()}), 12)  # a standby consumes nothing
    assert not [e for e in d.events if isinstance(e, IncidentResolved)]
    (resolved,) = [e for e in d.feed(behind(0.3), 16) if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id and "caught up" in resolved.summary
    # the autoscaler behind, saying what it does not do meanwhile
    (autoscaler, *_) = d.feed(behind(30, "autoscaler"), 20)
    assert autoscaler.kind is IncidentKind.CONTROL_PLANE_BEHIND and "it scales on no sample meanwhile" in autoscaler.summary
    # a second service behind meanwhile is news to the same incident, not a second one: the
    # control plane says it is behind once
    (update,) = [e for e in d.feed(behind(22), 21) if isinstance(e, IncidentUpdated)]
    assert update.incident_id == autoscaler.incident_id
    assert "autoscaler is 30s behind" in update.summary and "zombie-detector is 22s behind" in update.summary
    assert update.evidence["services"] == "autoscaler, zombie-detector"
    assert len(d.opened(IncidentKind.CONTROL_PLANE_BEHIND)) == 2  # the first, resolved above, and this one
    assert not [e for e in d.feed(behind(0.1, "autoscaler"), 25) if isinstance(e, IncidentResolved)]  # one still behind
    (resolved,) = [e for e in d.feed(behind(0.1), 26) if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == autoscaler.incident_id and "every service has caught up" in resolved.summary


def late_loop(s: float, service="zombie-detector", *, instance=DETECTOR_INSTANCE) -> ServiceHeartbeat:
    """A service's heartbeat saying its own event loop ran `s` seconds late (and it keeps up with its samples)."""
    return behind(0.0, service, instance=instance).model_copy(update={"loop_lag_s": s})


def test_while_the_detectors_own_loop_lags_no_node_is_silent_and_each_counts_afresh_once_it_keeps_up():
    """A starved detector (its host's CPU taken, a long collection) handles samples late: a node it
    has not heard from meanwhile may have sampled on time. Nothing is silent while its loop lags past
    a second, and counts start again once it keeps up."""
    d = Detector()
    d.feed(sample("n1"), 0)
    d.feed(sample("n2"), 0)
    d.feed(late_loop(3.5), 1)
    for s in range(5, 60, 5):
        d.feed(sample("n2"), s)
        assert d.tick(s) == []
    d.feed(late_loop(0.05), 60)  # keeps up again: n1's count starts from here
    d.feed(sample("n2"), 70)
    assert d.tick(70) == [] and not d.opened(IncidentKind.NODE_SILENT)
    d.feed(sample("n2"), 76)
    (opened, _) = d.tick(76)
    assert opened.kind is IncidentKind.NODE_SILENT and opened.node_id == "n1"


def test_a_service_whose_loop_stays_late_is_behind_and_one_pause_is_not():
    d = Detector()
    assert d.feed(late_loop(3.0, "remediator"), 0) == []  # one collection pause, or the start of a starvation
    assert d.feed(late_loop(0.1, "remediator"), 5) == []  # a pause: over
    d.feed(late_loop(2.5, "remediator"), 10)
    opened, *_ = d.feed(late_loop(4.0, "remediator"), 15)  # late for 5 s: starved
    assert (opened.kind, opened.node_id) == (IncidentKind.CONTROL_PLANE_BEHIND, "control-plane")
    assert opened.summary.startswith("remediator's own event loop runs 4.0s late since ")
    assert "an SSH login that times out meanwhile counts neither way" in opened.summary
    assert opened.evidence["remediator.loop_lag_s"] == 4.0
    d.feed(late_loop(1.5, "remediator"), 20)  # below the limit, not yet below half of it: still behind
    assert not [e for e in d.events if isinstance(e, IncidentResolved)]
    (resolved,) = [e for e in d.feed(late_loop(0.2, "remediator"), 25) if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id


def test_nvml_that_cannot_be_used_is_an_incident_until_it_answers():
    d = Detector()
    opened, _ = d.feed(sample(gpus=(), nvml_error="NVMLError_LibraryNotFound"), 0)
    assert opened.kind is IncidentKind.NVML_UNAVAILABLE and opened.severity == "critical"
    assert isinstance(d.feed(sample(), 5)[0], IncidentResolved)


@pytest.mark.parametrize("cause", ["refused", "timeout", "auth_refused", "host_key_changed"])
def test_ssh_unreachable_after_checks_in_a_row_with_the_runbooks_next_step(cause):
    d = Detector()
    check = lambda ok, n: NodeSshChecked(source="remediator", node_id="n1", reachable=ok, cause="ok" if ok else cause, detail="x", failures=n)  # noqa: E731
    assert d.feed(check(False, 1), 0) == []
    opened, _ = d.feed(check(False, 2), 30)
    assert opened.kind is IncidentKind.SSH_UNREACHABLE and opened.diagnosis.cause == cause and opened.recommended_action
    assert isinstance(d.feed(check(True, 0), 60)[0], IncidentResolved)


# --- container_died: the post-mortem -----------------------------------------------------------


def exited(code: int, *, oom=False, lines=(), engine_signal=None, cid=CID, node="n1") -> ContainerExited:
    return ContainerExited(
        source="node-sampler", node_id=node, container_id=cid, name="selfplay-0", exit_code=code, oom_killed=oom,
        last_log_lines=lines, engine_signal=engine_signal,
    )


def oom_kill(constraint="CONSTRAINT_MEMCG", cid=CID) -> ProcessOomKilled:
    return ProcessOomKilled(
        source="node-sampler", node_id="n1", pid=4242, process_name="python", constraint=constraint,
        container_id=cid[:12], cgroup=f"/system.slice/docker-{cid}.scope",
        kernel_lines=("Memory cgroup out of memory: Killed process 4242 (python)",),
    )


def postmortem(*events, disks=()) -> IncidentOpened | None:
    d = Detector()
    d.feed(sample(disks=disks), 0)
    for event in events:
        d.feed(event, 1)
    assert d.tick(5) == []  # still settling
    d.tick(12)
    died = d.opened(IncidentKind.CONTAINER_DIED)
    assert len(died) <= 1
    return died[0] if died else None


@pytest.mark.parametrize(
    ("events", "cause"),
    [
        ((exited(137, oom=True), oom_kill()), "cgroup_oom"),
        ((oom_kill("CONSTRAINT_NONE"), exited(137)), "host_oom"),
        ((exited(137, oom=True),), "cgroup_oom"),
        ((exited(137),), "killed"),
        ((exited(139, lines=("Fatal Python error: Segmentation fault",)),), "segfault"),
        ((exited(143),), "sigterm"),
        ((exited(1, lines=("torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB",)),), "gpu_oom"),
        ((exited(1, lines=("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",)),), "device_busy"),
        ((exited(1, lines=("OSError: [Errno 28] No space left on device",)),), "disk_full"),
        ((exited(2, lines=()),), "exited_with_error"),
        ((exited(137, engine_signal="SIGKILL"),), "stopped_by_engine"),
    ],
)
def test_each_death_names_one_cause_with_its_evidence_and_remedies(events, cause):
    opened = postmortem(*events)
    assert opened is not None and opened.diagnosis.cause == cause
    assert opened.diagnosis.remedies and 0 < opened.diagnosis.confidence <= 1
    assert opened.fingerprint == f"n1/container_died/node/{CID[:12]}"
    assert opened.evidence["exit_code"] == events[-1].exit_code if isinstance(events[-1], ContainerExited) else True


def test_a_cgroup_oom_says_how_full_the_container_was_at_the_last_look_before_it_died():
    """Runbook 004's docker stats beside the death: the sampler's last look (every 30 s) at the
    dying container's memory against its limit, timed by the node's own clock."""
    from datetime import timedelta

    from gpumedic_events import ContainerUsage

    looked = sample().model_copy(update={"occurred_at": datetime(2026, 11, 23, 10, 0, tzinfo=UTC)})
    usage = (ContainerUsage(container_id=CID, cpu_pct=310.0, memory_mib=31_800, memory_limit_mib=32_768),
             ContainerUsage(container_id="f" * 64, cpu_pct=5.0, memory_mib=100))
    looked = looked.model_copy(update={"host": looked.host.model_copy(update={"containers": usage})})
    died = exited(137, oom=True).model_copy(update={"occurred_at": looked.occurred_at + timedelta(seconds=12)})
    d = Detector()
    d.feed(looked, 0)
    d.feed(died, 1)
    d.tick(12)
    (opened,) = d.opened(IncidentKind.CONTAINER_DIED)
    assert opened.diagnosis.cause == "cgroup_oom"
    assert "12s before, it used 31800 of its 32768 MiB limit (97%)" in opened.diagnosis.explanation
    assert (opened.evidence["memory_mib_before"], opened.evidence["memory_limit_mib"], opened.evidence["seconds_before"]) == (31_800, 32_768, 12)
    late = exited(137, oom=True).model_copy(update={"occurred_at": looked.occurred_at + timedelta(minutes=5)})
    d = Detector()
    d.feed(looked, 0)
    d.feed(late, 1)
    d.tick(12)
    (stale,) = d.opened(IncidentKind.CONTAINER_DIED)
    assert "memory_mib_before" not in stale.evidence  # a look 5 minutes old says little of the death


def test_a_full_disk_at_the_time_is_the_cause_of_an_otherwise_plain_error():
    opened = postmortem(exited(1), disks=(disk(99),))
    assert opened.diagnosis.cause == "disk_full"


@pytest.mark.parametrize("event", [exited(0), exited(143, engine_signal="SIGTERM")])
def test_a_normal_end_or_a_stop_the_node_asked_for_opens_nothing(event):
    assert postmortem(event) is None


def test_an_exit_caused_by_gpumedics_own_kill_is_part_of_that_incident():
    d = Detector(Policy(fleet=FleetPolicy(hold_s=0), kinds=POLICY.kinds.model_copy(update={"zombie_job": POLICY.kinds.zombie_job.model_copy(update={"idle_for_s": 10})})))
    idle = sample(gpus=(GpuSample(index=0, utilization_gpu_pct=0, processes=(JOB,)),))
    idle = idle.model_copy(update={"jobs": JobsObservation(running=1, output_growing=False)})
    for s in range(0, 15, 5):
        d.feed(idle, s)
    assert d.opened(IncidentKind.ZOMBIE_JOB)  # acting: the kill is on its way
    (request,) = [e for e in d.events if isinstance(e, ActionRequested)]
    d.feed(exited(137), 16)
    # The kill worked and the next sample shows the GPU free: the zombie resolves before the
    # exit has settled; the exit is still the kill's doing, not a death of its own.
    done = ActionCompleted(
        source="remediator", incident_id=request.incident_id, action_id=request.action_id, node_id="n1",
        attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="killed",
    )
    d._commit(d.logic.on_action_completed(done, at(17), None), at(17))
    d.feed(sample(gpus=(GpuSample(index=0, utilization_gpu_pct=0),), jobs=0), 20)
    assert [e.resolution for e in d.events if isinstance(e, IncidentResolved)] == ["fixed"]
    d.tick(30)
    assert d.opened(IncidentKind.CONTAINER_DIED) == []
    # Later, with nothing being done to the node, the same exit is a death of its own.
    d.feed(exited(137, cid="b" * 64), 200)
    d.tick(215)
    assert [e.diagnosis.cause for e in d.opened(IncidentKind.CONTAINER_DIED)] == ["killed"]


def test_the_exit_of_gpumedics_own_kill_delivered_after_the_fix_closed_is_still_the_kills_doing():
    """A bus that falls behind delivers the killed job's container exit after the sample that
    showed its GPU free, which closed the zombie: by the node's clock it died while the kill ran."""
    d = Detector(Policy(fleet=FleetPolicy(hold_s=0), kinds=POLICY.kinds.model_copy(update={"zombie_job": POLICY.kinds.zombie_job.model_copy(update={"idle_for_s": 10})})))
    idle = sample(gpus=(GpuSample(index=0, utilization_gpu_pct=0, processes=(JOB,)),))
    idle = idle.model_copy(update={"jobs": JobsObservation(running=1, output_growing=False)})
    for s in range(0, 15, 5):
        d.feed(idle, s)
    (request,) = [e for e in d.events if isinstance(e, ActionRequested)]
    done = ActionCompleted(
        source="remediator", incident_id=request.incident_id, action_id=request.action_id, node_id="n1",
        attempt=1, outcome=ActionOutcome.SUCCEEDED, detail="killed",
    )
    d._commit(d.logic.on_action_completed(done, at(17), None), at(17))
    d.feed(sample(gpus=(GpuSample(index=0, utilization_gpu_pct=0),), jobs=0), 20)
    assert [e.resolution for e in d.events if isinstance(e, IncidentResolved)] == ["fixed"]
    d.feed(exited(143).model_copy(update={"occurred_at": at(16)}), 80)  # died as the kill ran; delivered a minute late
    d.tick(95)
    assert d.opened(IncidentKind.CONTAINER_DIED) == []
    # A death after the close, however late it comes, is its own.
    d.feed(exited(143, cid="b" * 64).model_copy(update={"occurred_at": at(25)}), 100)
    d.tick(115)
    assert [e.diagnosis.cause for e in d.opened(IncidentKind.CONTAINER_DIED)] == ["sigterm"]


def test_a_restart_that_leaves_its_process_behind_is_the_orphans_story_not_two_deaths():
    d = Detector()
    d.feed(exited(137, lines=("received SIGKILL",)), 0)
    d.feed(exited(1, cid="a" * 64, lines=("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",)), 0)
    d.feed(sample(gpus=(orphaned_gpu(),)), 3)  # the old container's process lives on, its container gone
    d.tick(12)
    assert d.opened(IncidentKind.CONTAINER_DIED) == []
    for s in range(15, 50, 5):
        d.feed(sample(gpus=(orphaned_gpu(),)), s)
    assert len(d.opened(IncidentKind.ORPHAN_GPU_HOLDER)) == 1


def test_a_sample_begun_before_the_death_and_delivered_after_it_does_not_hide_the_death():
    """A sample whose read spanned the exit (or whose publish was held up) arrives after the exit
    and still shows the dead container's process: by the node's clock it was taken before the
    death, so it is no restart's leftover, and the segfault is a death of its own."""
    d = Detector()
    d.feed(sample(), 0)
    d.feed(exited(139, lines=("Fatal Python error: Segmentation fault",)).model_copy(update={"occurred_at": at(2)}), 2)
    d.feed(sample().model_copy(update={"occurred_at": at(1.5)}), 3)  # the process as it was half a second before
    d.tick(14)
    (opened,) = d.opened(IncidentKind.CONTAINER_DIED)
    assert opened.diagnosis.cause == "segfault"


def test_a_kernel_oom_line_for_a_process_never_seen_is_logged_and_kept_nowhere_else(caplog):
    caplog.set_level(logging.INFO, logger="zombie_detector.rules.container")  # on the rule's own logger, whatever another test left on its parents
    d = Detector()
    d.feed(ProcessOomKilled(source="node-sampler", node_id="n1", pid=31337, process_name="stray", constraint="CONSTRAINT_NONE"), 0)
    assert "OOM kill of pid 31337 (stray) on n1 outside any container" in caplog.text
    d.tick(400)
    assert d.opened() == []
    (rule,) = [r for r in d.logic.rules if isinstance(r, ContainerRule)]
    assert rule.nodes == {}  # nothing kept once the OOM kill has waited its while


def test_an_event_for_a_node_never_seen_is_judged_like_any_other():
    d = Detector()
    d.feed(exited(139, node="never-seen"), 0)
    d.tick(11)
    (opened,) = d.opened()
    assert opened.node_id == "never-seen" and opened.diagnosis.cause == "segfault"


def test_samples_the_bus_did_not_take_on_many_nodes_are_one_control_plane_incident_and_no_node_is_silent_meanwhile():
    d = Detector()
    for node in ("n1", "n2", "n3", "n4"):
        d.feed(sample(node), 0)
    d.feed(sample("n1").model_copy(update={"unacknowledged": 2}), 5)  # one node's link: no incident
    d.feed(sample("n2").model_copy(update={"unacknowledged": 1}), 5)
    assert not d.opened()
    opened, *_ = d.feed(sample("n3").model_copy(update={"unacknowledged": 4}), 6)
    assert (opened.kind, opened.node_id) == (IncidentKind.SAMPLES_LOST, "control-plane")
    assert opened.summary.startswith("the bus did not acknowledge 7 sample(s) of 3 node(s) in the last 60s")
    counts = {"n1": 2, "n2": 1, "n3": 4}
    for s in range(10, 60, 5):  # n4 says nothing more while the bus drops samples: it is no silent node
        for node, count in counts.items():
            d.feed(sample(node).model_copy(update={"unacknowledged": count}), s)
        d.tick(s)
    assert not d.opened(IncidentKind.NODE_SILENT)
    assert [e for e in d.tick(70) if isinstance(e, IncidentResolved)]  # no loss for a minute: resolved
    restarted = sample("n1").model_copy(update={"unacknowledged": 0})  # a sampler that restarted counts from 0
    assert d.feed(restarted, 71) == [] and d.logic.rules and not [e for e in d.feed(sample("n1"), 72) if isinstance(e, IncidentOpened)]


def test_a_job_outside_any_container_killed_by_the_oom_killer_is_a_death_at_once():
    """Runbook 002's jobs "failing with exit code -9": no engine reports the exit; the kernel's line
    and the sampler's last look (it computed on GPU 3) are all there is."""
    d = Detector()
    d.feed(ProcessOomKilled(source="node-sampler", node_id="n1", pid=7001, process_name="python", constraint="CONSTRAINT_NONE",
                            cgroup="/user.slice/user-1000.slice/session-2.scope", gpu_index=3,
                            command="python selfplay.py --gpu 3", kernel_lines=("Out of memory: Killed process 7001 (python)",)), 0)
    (died,) = d.opened(IncidentKind.CONTAINER_DIED)
    assert died.node_id == "n1" and died.diagnosis.cause == "host_oom" and died.evidence["gpu_index"] == 3
    assert died.summary.startswith("the job python selfplay.py --gpu 3 (pid 7001, no container) was killed (SIGKILL, exit -9): host oom")
    assert died.fingerprint.endswith("/pid-7001")


def test_a_death_whose_log_was_lost_says_so_and_how_to_keep_logs():
    lost = "the engine had removed the container before its log could be read (docker run --rm, or removed at once)"
    opened = postmortem(exited(139).model_copy(update={"logs_lost": lost}))
    assert opened.diagnosis.cause == "segfault"  # the cause is judged as before, from the exit
    assert opened.summary.endswith(f"; its log is lost: {lost}") and opened.evidence["logs_lost"] == lost
    assert opened.diagnosis.remedies[-1].startswith("keep job containers' logs after they die")
    assert "setup-docker-logging.sh" in opened.diagnosis.remedies[-1]
    read = postmortem(exited(139, lines=("Segmentation fault",)))
    assert "log is lost" not in read.summary and not any("keep job containers' logs" in r for r in read.diagnosis.remedies)
