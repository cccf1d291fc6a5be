"""Scoring: injected faults (ground truth) against findings from the bus."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ContainerExited,
    DeviceHolder,
    DiskUsage,
    GpuLost,
    GpuProcess,
    GpuSample,
    GpuXidReported,
    HostSample,
    IncidentKind,
    IncidentOpened,
    NodeSampled,
    ProcessOomKilled,
    ServiceHeartbeat,
)

from gpumedic.sim.scenario import FaultKind
from gpumedic.sim.scoring import (
    EVIDENCE,
    INCIDENT_KINDS,
    SIGNAL_KINDS,
    Finding,
    Score,
    Signal,
    findings_from_event,
    findings_from_events,
    incident_evidence,
    render,
    score,
    signal_evidence,
)
from gpumedic.sim.state import InjectedFault

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)


def t(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def inj(at: float, node: str, gpu: int | None, fault: str) -> InjectedFault:
    return InjectedFault(t(at), node, gpu, fault)


def found(at: float, node: str, gpu: int | None, kind: str, source: str = "node-sampler") -> Finding:
    return Finding(t(at), node, gpu, kind, source)


def incident(at: float, node: str, gpu: int | None, kind: str = "zombie_job") -> Finding:
    return Finding(t(at), node, gpu, kind, "zombie-detector")


def line(result: Score, kind: str):
    (k,) = [k for k in result.kinds if k.kind == kind]
    return k


# --- the evidence table -----------------------------------------------------------------------


def test_evidence_covers_every_fault_kind_with_known_finding_kinds():
    assert set(EVIDENCE) == set(FaultKind)
    for kind, kinds in EVIDENCE.items():
        assert kinds, kind
        assert kinds <= INCIDENT_KINDS | SIGNAL_KINDS, kind


def test_incident_and_signal_kinds_are_apart():
    assert {k.value for k in IncidentKind} == INCIDENT_KINDS
    assert not INCIDENT_KINDS & SIGNAL_KINDS
    assert incident_evidence("zombie_job") == {"zombie_job"} and signal_evidence("zombie_job") == set()
    assert incident_evidence("xid") == set() and signal_evidence("xid") == {"xid"}
    assert signal_evidence("oom_kill") >= {"oom_kill", "container_exit_137"}
    assert signal_evidence("gpu_lost") == {"gpu_lost_reported", "xid"}
    assert signal_evidence("no_such_fault") == set() == incident_evidence("no_such_fault")


# --- matching ---------------------------------------------------------------------------------


def test_perfect_detection():
    faults = [inj(10, "sim-node-02", 3, "zombie_job"), inj(20, "sim-node-05", 1, "oom_kill")]
    findings = [incident(40, "sim-node-02", 3), found(22, "sim-node-05", None, "container_exit_137")]
    result = score(faults, findings)
    zombie, oom = line(result, "zombie_job"), line(result, "oom_kill")
    assert (zombie.injected, zombie.detected, zombie.signalled, zombie.missed) == (1, 1, 0, 0)
    assert zombie.has_detector and not zombie.has_signal
    assert zombie.incident_median_s == zombie.incident_max_s == 30.0
    assert (oom.injected, oom.detected, oom.signalled, oom.missed) == (1, 0, 1, 0)
    assert oom.signal_median_s == 2.0 and not oom.has_detector
    assert result.false_positives == ()
    assert result.precision == 1.0 and zombie.precision == 1.0 and zombie.recall == 1.0
    assert result.recall == 0.5 and result.recall_detectable == 1.0
    assert (result.injected, result.detected, result.signalled, result.missed) == (2, 1, 1, 0)


def test_a_missed_fault():
    result = score([inj(10, "sim-node-09", 4, "xid"), inj(10, "sim-node-02", 0, "zombie_job")], [])
    xid, zombie = line(result, "xid"), line(result, "zombie_job")
    assert (xid.signalled, xid.missed) == (0, 1) and xid.signal_median_s is None
    assert (zombie.detected, zombie.missed, zombie.recall) == (0, 1, 0.0)
    assert result.missed == 2 and result.precision is None and result.recall == 0.0


def test_a_false_positive_on_a_node_never_faulted():
    faults = [inj(10, "sim-node-02", 3, "zombie_job")]
    findings = [incident(30, "sim-node-02", 3), incident(50, "sim-node-17", 0)]
    result = score(faults, findings)
    assert [(f.node_id, f.gpu, f.kind) for f in result.false_positives] == [("sim-node-17", 0, "zombie_job")]
    assert result.precision == 0.5
    assert line(result, "zombie_job").false_positives == 1 and line(result, "zombie_job").precision == 0.5


def test_only_false_positives_give_a_line_with_nothing_injected():
    result = score([], [incident(5, "sim-node-01", 1)])
    zombie = line(result, "zombie_job")
    assert (zombie.injected, zombie.false_positives, zombie.recall, zombie.precision) == (0, 1, None, 0.0)
    assert result.precision == 0.0 and result.recall is None


def test_window_bounds():
    fault = inj(100, "sim-node-02", 3, "zombie_job")
    assert score([fault], [incident(220, "sim-node-02", 3)]).detected == 1  # at + window
    assert score([fault], [incident(99, "sim-node-02", 3)]).detected == 1  # 1 s early
    late = score([fault], [incident(220.5, "sim-node-02", 3)])
    assert late.detected == 0 and late.missed == 1 and len(late.false_positives) == 1
    early = score([fault], [incident(98.5, "sim-node-02", 3)])
    assert early.detected == 0 and len(early.false_positives) == 1
    assert score([fault], [incident(250, "sim-node-02", 3)], window_s=200).detected == 1
    assert score([fault], [incident(99, "sim-node-02", 3)]).outcomes[0].incident_latency_s == 0.0


def test_negative_window_is_refused():
    with pytest.raises(ValueError):
        score([], [], window_s=-1)


def test_gpu_mismatch_does_not_match_but_an_unknown_gpu_does():
    fault = inj(10, "sim-node-02", 3, "zombie_job")
    wrong = score([fault], [incident(20, "sim-node-02", 4)])
    assert wrong.detected == 0 and len(wrong.false_positives) == 1
    assert score([fault], [incident(20, "sim-node-02", None)]).detected == 1
    node_fault = inj(10, "sim-node-11", None, "disk_full")
    assert score([node_fault], [found(15, "sim-node-11", 2, "disk_full")]).signalled == 1


def test_other_node_does_not_match():
    result = score([inj(10, "sim-node-02", 3, "xid")], [found(11, "sim-node-03", 3, "xid")])
    assert result.signalled == 0 and result.missed == 1 and result.unmatched_signals == 1


def test_signal_and_incident_are_kept_apart():
    faults = [inj(10, "sim-node-02", 3, "zombie_job"), inj(10, "sim-node-09", 4, "xid")]
    # an incident kind on the xid node, and a signal on the zombie node: neither counts
    findings = [found(12, "sim-node-09", 4, "xid"), found(12, "sim-node-02", 3, "xid"), incident(15, "sim-node-09", 4)]
    result = score(faults, findings)
    xid, zombie = line(result, "xid"), line(result, "zombie_job")
    assert (xid.signalled, xid.detected, xid.has_detector) == (1, 0, False)
    assert (zombie.signalled, zombie.detected, zombie.missed) == (0, 0, 1)
    assert [f.node_id for f in result.false_positives] == ["sim-node-09"]
    assert result.unmatched_signals == 1  # the xid on the zombie's node


def test_a_signal_of_the_wrong_kind_does_not_count():
    result = score([inj(10, "sim-node-06", 5, "segfault")], [found(12, "sim-node-06", None, "container_exit_137")])
    assert result.signalled == 0 and result.unmatched_signals == 1


def test_gpu_lost_is_seen_through_an_xid_too():
    result = score([inj(60, "sim-node-10", 7, "gpu_lost")], [found(61, "sim-node-10", 7, "xid")])
    assert result.signalled == 1 and result.outcomes[0].first_signal.kind == "xid"


def test_duplicate_findings_count_once():
    faults = [inj(10, "sim-node-02", 3, "zombie_job"), inj(10, "sim-node-05", 1, "oom_kill")]
    findings = [
        incident(40, "sim-node-02", 3),
        incident(70, "sim-node-02", 3),
        incident(40, "sim-node-02", 3),
        *[
            found(11 + i, "sim-node-05", None, k)
            for i, k in enumerate(["oom_kill", "container_exit_137", "container_oom_killed"])
        ],
    ]
    result = score(faults, findings)
    assert result.detected == 1 and result.signalled == 1 and result.false_positives == ()
    assert result.precision == 1.0
    zombie, oom = result.outcomes  # same time: by node
    assert zombie.incident_latency_s == 30.0  # the first incident
    assert oom.first_signal.kind == "oom_kill" and oom.signal_latency_s == 1.0


def test_a_fault_recorded_twice_counts_once():
    fault = inj(10, "sim-node-02", 3, "zombie_job")
    result = score([fault, fault], [incident(30, "sim-node-02", 3)])
    assert result.injected == 1 and result.duplicate_injections == 1 and result.detected == 1


def test_a_fault_injected_twice_at_different_times_counts_twice():
    faults = [inj(10, "sim-node-05", 1, "oom_kill"), inj(300, "sim-node-05", 1, "oom_kill")]
    one_seen = score(faults, [found(12, "sim-node-05", None, "oom_kill")])
    assert line(one_seen, "oom_kill").injected == 2
    assert (one_seen.signalled, one_seen.missed) == (1, 1)
    both = score(faults, [found(12, "sim-node-05", None, "oom_kill"), found(305, "sim-node-05", None, "oom_kill")])
    assert [o.signal_latency_s for o in both.outcomes] == [2.0, 5.0]
    assert both.duplicate_injections == 0


def test_latency_median_and_max():
    faults = [inj(0, f"sim-node-0{i}", 0, "zombie_job") for i in (1, 2, 3)]
    findings = [incident(10, "sim-node-01", 0), incident(20, "sim-node-02", 0), incident(60, "sim-node-03", 0)]
    zombie = line(score(faults, findings), "zombie_job")
    assert (zombie.incident_median_s, zombie.incident_max_s) == (20.0, 60.0)


def test_unknown_fault_names_are_scored_as_missed():
    result = score([inj(5, "sim-node-01", None, "power_cut")], [])
    power = line(result, "power_cut")
    assert (power.injected, power.missed, power.has_signal, power.has_detector) == (1, 1, False, False)


def test_naive_datetimes_are_taken_as_utc():
    fault = InjectedFault(t(10).replace(tzinfo=None), "sim-node-02", 3, "zombie_job")
    result = score([fault], [incident(20, "sim-node-02", 3)])
    assert result.detected == 1 and result.outcomes[0].incident_latency_s == 10.0


def test_kinds_are_in_fault_kind_order_and_outcomes_by_time():
    faults = [
        inj(30, "sim-node-03", None, "ssh_hangs"),
        inj(20, "sim-node-02", 0, "xid"),
        inj(10, "sim-node-01", 0, "zombie_job"),
    ]
    result = score(faults, [])
    assert [k.kind for k in result.kinds] == ["zombie_job", "xid", "ssh_hangs"]
    assert [o.fault.fault for o in result.outcomes] == ["zombie_job", "xid", "ssh_hangs"]


# --- rendering and JSON -----------------------------------------------------------------------


def scenario_result():
    faults = [
        inj(5, "sim-node-02", 3, "zombie_job"),
        inj(20, "sim-node-05", 1, "oom_kill"),
        inj(52, "sim-node-09", 4, "xid"),
        inj(100, "sim-node-18", None, "ssh_refuses"),
    ]
    findings = [
        incident(36.5, "sim-node-02", 3),
        found(22, "sim-node-05", None, "container_exit_137"),
        found(55, "sim-node-09", 4, "xid"),
        incident(80, "sim-node-13", 6),
        found(90, "sim-node-07", None, "container_exit_143"),
    ]
    return faults, findings


def test_render_shows_the_numbers():
    faults, findings = scenario_result()
    text = render(score(faults, findings))
    lines = text.splitlines()
    assert lines[0].split()[:2] == ["fault", "kind"] and "signal seen" in lines[0] and "to incident med/max" in lines[0]
    assert set(lines[1]) <= {"-", " "}
    zombie = next(x for x in lines if x.startswith("zombie_job"))
    assert zombie.split() == ["zombie_job", "1", "-", "1/1", "0", "-", "31.5s/31.5s"]
    oom = next(x for x in lines if x.startswith("oom_kill"))
    assert oom.split() == ["oom_kill", "1", "1/1", "-", "0", "2.0s/2.0s", "-"]
    assert next(x for x in lines if x.startswith("xid")).split() == ["xid", "1", "1/1", "-", "0", "3.0s/3.0s", "-"]
    assert next(x for x in lines if x.startswith("ssh_refuses")).split() == [
        "ssh_refuses",
        "1",
        "0/1",
        "-",
        "1",
        "-",
        "-",
    ]
    assert "false positives (1): incidents that match no injected fault" in text
    assert "  2026-11-22T10:01:20Z  sim-node-13  GPU 6  zombie_job  (zombie-detector)" in lines
    assert "signals that match no injected fault (not scored): 1" in lines
    summary = lines[-1]
    assert summary.startswith(
        "summary: 4 injected, signal seen 2/3, incident 1/4 (recall 25%; 1/1 of kinds with a detector)"
    )
    assert "1 false positive, precision 50%, 1 missed, window 120s" in summary


def test_render_columns_line_up():
    faults, findings = scenario_result()
    lines = render(score(faults, findings)).splitlines()
    table = lines[: 2 + 4]
    ends = {len(x) for x in table}
    assert len(ends) == 1  # fixed width: every row as long as the header


def test_render_is_deterministic_whatever_the_input_order():
    faults, findings = scenario_result()
    first = render(score(faults, findings))
    rng = random.Random(1)
    for _ in range(5):
        rng.shuffle(faults)
        rng.shuffle(findings)
        assert render(score(faults, findings)) == first


def test_render_without_anything():
    text = render(score([], []))
    assert "(no faults injected)" in text and "false positives: none" in text
    assert text.splitlines()[-1] == (
        "summary: 0 injected, signal seen 0/0, incident 0/0 (recall n/a), "
        "0 false positives, precision n/a, 0 missed, window 120s"
    )


def test_to_dict_is_json():
    faults, findings = scenario_result()
    data = json.loads(json.dumps(score(faults, findings).to_dict()))
    assert data["window_s"] == 120.0
    assert data["totals"] == {
        "injected": 4,
        "with_signal": 3,
        "signalled": 2,
        "detectable": 1,
        "detected": 1,
        "missed": 1,
        "false_positives": 1,
        "precision": 0.5,
        "recall": 0.25,
        "recall_detectable": 1.0,
        "unmatched_signals": 1,
        "duplicate_injections": 0,
    }
    zombie = data["kinds"][0]
    assert zombie["kind"] == "zombie_job" and zombie["incident_median_s"] == 31.5 and zombie["signal_median_s"] is None
    assert data["faults"][0]["incident"]["source"] == "zombie-detector"
    assert data["faults"][0]["at"] == "2026-11-22T10:00:05Z"
    assert data["faults"][0]["incident_latency_s"] == 31.5
    assert data["faults"][3]["signal"] is None and data["faults"][3]["fault"] == "ssh_refuses"
    assert data["false_positives"] == [
        {
            "at": "2026-11-22T10:01:20Z",
            "node_id": "sim-node-13",
            "gpu": 6,
            "kind": "zombie_job",
            "source": "zombie-detector",
            "detail": "",
        }
    ]


# --- findings from events ---------------------------------------------------------------------

NODE = "sim-node-04"


def test_incident_opened():
    event = IncidentOpened(
        occurred_at=t(30),
        source="zombie-detector",
        incident_id=uuid.uuid4(),
        node_id=NODE,
        kind=IncidentKind.ZOMBIE_JOB,
        gpu_index=2,
        fingerprint=f"{NODE}/zombie_job/2",
        summary="GPU 2 idle",
    )
    (f,) = findings_from_event(event)
    assert (f.at, f.node_id, f.gpu, f.kind, f.source, f.is_incident) == (
        t(30),
        NODE,
        2,
        "zombie_job",
        "zombie-detector",
        True,
    )


def test_xid_and_gpu_lost():
    (x,) = findings_from_event(
        GpuXidReported(occurred_at=t(1), source="node-sampler", node_id=NODE, gpu_index=3, xid=79)
    )
    assert (x.kind, x.gpu, x.is_incident, x.detail) == ("xid", 3, False, "XID 79")
    (lost,) = findings_from_event(
        GpuLost(occurred_at=t(2), source="node-sampler", node_id=NODE, gpu_index=5, reason="NVMLError_GpuIsLost")
    )
    assert (lost.kind, lost.gpu, lost.detail) == ("gpu_lost_reported", 5, "NVMLError_GpuIsLost")


def test_oom_kill():
    (f,) = findings_from_event(
        ProcessOomKilled(occurred_at=t(3), source="node-sampler", node_id=NODE, pid=41230, process_name="python")
    )
    assert (f.kind, f.gpu, f.node_id) == ("oom_kill", None, NODE)


def exited(code: int, *, oom: bool | None = None, logs: tuple[str, ...] = ()) -> ContainerExited:
    return ContainerExited(
        occurred_at=t(4), source="node-sampler", node_id=NODE, container_id="3f9c2a7d", name="selfplay-3",
        exit_code=code, oom_killed=oom, last_log_lines=logs,
    )  # fmt: skip


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (137, "container_exit_137"),
        (139, "container_exit_139"),
        (143, "container_exit_143"),
        (1, "container_exit_other"),
        (2, "container_exit_other"),
    ],
)
def test_container_exit_codes(code, kind):
    assert [f.kind for f in findings_from_event(exited(code))] == [kind]


def test_container_exit_extras():
    assert findings_from_event(exited(0)) == []
    assert [f.kind for f in findings_from_event(exited(137, oom=True))] == [
        "container_exit_137",
        "container_oom_killed",
    ]
    logs = (
        "Traceback (most recent call last):",
        "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB.",
    )
    assert [f.kind for f in findings_from_event(exited(1, logs=logs))] == ["container_exit_other", "gpu_oom_in_logs"]
    assert "gpu_oom_in_logs" in [
        f.kind for f in findings_from_event(exited(1, logs=("RuntimeError: CUDA error: out of memory",)))
    ]
    assert "gpu_oom_in_logs" not in [
        f.kind for f in findings_from_event(exited(1, logs=("Killed: host out of memory",)))
    ]
    busy = ("RuntimeError: CUDA error: CUDA-capable device(s) is/are busy or unavailable",)
    assert [f.kind for f in findings_from_event(exited(1, logs=busy))] == [
        "container_exit_other",
        "device_busy_in_logs",
    ]


def sample(**kw) -> NodeSampled:
    return NodeSampled(occurred_at=t(5), source="node-sampler", node_id=NODE, interval_s=5.0, **kw)


def test_sample_disk_full_at_98_percent():
    def disk(pct: float) -> DiskUsage:
        return DiskUsage(
            path="/var/lib/docker", total_bytes=100, used_bytes=int(pct), available_bytes=100 - int(pct), used_pct=pct
        )

    assert findings_from_event(sample(host=HostSample(disks=(disk(97.9),)))) == []
    (f,) = findings_from_event(sample(host=HostSample(disks=(disk(98.0),))))
    assert (f.kind, f.gpu, f.at) == ("disk_full", None, t(5)) and "/var/lib/docker" in f.detail


def test_sample_orphans_from_gpu_processes_and_device_holders():
    gone = GpuProcess(pid=100, container_id="9a1b", container_exists=False)
    alive = GpuProcess(pid=101, container_id="3f9c", container_exists=True)
    host_proc = GpuProcess(pid=102)
    holder = DeviceHolder(
        pid=200, container_exists=False, devices=("/dev/nvidia6", "/dev/nvidiactl", "/dev/nvidia-uvm")
    )
    two = DeviceHolder(pid=201, container_exists=False, devices=("/dev/nvidia1", "/dev/nvidia2"))
    fine = DeviceHolder(pid=202, container_exists=None, devices=("/dev/nvidia0",))
    event = sample(
        gpus=(GpuSample(index=0, processes=(alive, host_proc)), GpuSample(index=3, processes=(gone,))),
        device_holders=(holder, two, fine),
    )
    found_ = sorted((f.gpu if f.gpu is not None else -1, f.kind) for f in findings_from_event(event))
    assert found_ == [(-1, "orphan_holder"), (3, "orphan_holder"), (6, "orphan_holder")]


def test_sample_lost_gpu_nvml_missing_and_status_probe():
    event = sample(
        gpus=(GpuSample(index=2, lost=True),),
        errors=(
            "NVML unavailable: NVMLError_LibraryNotFound",
            "status probe http://127.0.0.1:9000/status: no answer within 2s",
            "gpu 5 utilization: NVMLError_GpuIsLost",
            "gpu 2 handle: NVMLError_GpuIsLost",
            "output probe: /data: missing",
        ),
    )
    kinds = sorted((f.kind, f.gpu if f.gpu is not None else -1) for f in findings_from_event(event))
    assert kinds == [("gpu_lost_reported", 2), ("gpu_lost_reported", 5), ("nvml_missing", -1), ("status_probe_failed", -1)]


def test_a_healthy_sample_and_other_events_give_nothing():
    assert (
        findings_from_event(sample(gpus=(GpuSample(index=0, processes=(GpuProcess(pid=5, container_exists=True),)),)))
        == []
    )
    assert (
        findings_from_event(
            ServiceHeartbeat(source="remediator", service="remediator", instance_id=uuid.uuid4(), state="ready")
        )
        == []
    )


def action(outcome: ActionOutcome, detail: str) -> ActionCompleted:
    return ActionCompleted(
        occurred_at=t(6), source="remediator", action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=NODE,
        attempt=1, outcome=outcome, detail=detail,
    )  # fmt: skip


def test_failed_actions_show_ssh_trouble():
    (refused,) = findings_from_event(
        action(ActionOutcome.FAILED, "node 'sim-node-04' (gpumedic@127.0.0.1:2222): connection refused")
    )
    assert refused.kind == "ssh_refused"
    (hung,) = findings_from_event(action(ActionOutcome.FAILED, "node 'sim-node-04' (...): connect timed out after 10s"))
    assert hung.kind == "ssh_timeout"
    assert findings_from_event(action(ActionOutcome.FAILED, "kill: no such process")) == []
    assert findings_from_event(action(ActionOutcome.SUCCEEDED, "connection refused")) == []


def test_findings_from_events_to_score_end_to_end():
    events = [
        GpuXidReported(occurred_at=t(53), source="node-sampler", node_id=NODE, gpu_index=4, xid=48),
        exited(137, oom=True),
    ]
    findings = findings_from_events(events)
    assert [f.kind for f in findings] == ["xid", "container_exit_137", "container_oom_killed"]
    result = score([inj(52, NODE, 4, "xid"), inj(3.5, NODE, 1, "oom_kill")], findings)
    assert result.signalled == 2 and result.missed == 0 and result.unmatched_signals == 0
    assert Signal.XID == "xid"
