"""Scoring: what was scripted (each with its answer key) against the incidents detectors opened."""

from __future__ import annotations

import json
import random
import uuid
from datetime import UTC, datetime, timedelta

import pytest
from gpumedic_events import IncidentKind, IncidentOpened

from gpumedic_sim.runs.scoring import Observed, Score, render, score
from gpumedic_sim.runs.simulate import fell_behind
from gpumedic_sim.faults import FAULTS, Benign, Fault, InjectedFault, expected
from gpumedic_sim.machine.node import ScriptedNode

T0 = datetime(2026, 11, 22, 10, 0, 0, tzinfo=UTC)


def t(s: float) -> datetime:
    return T0 + timedelta(seconds=s)


def inj(at: float, node: str, gpu: int | None, fault: str, expect: set[str] | None = None) -> InjectedFault:
    return InjectedFault(t(at), node, gpu, fault, frozenset(expected(fault) if expect is None else expect))


def incident(at: float, node: str, gpu: int | None, kind: str = "zombie_job", related_to: str | None = None) -> Observed:
    return Observed(t(at), str(uuid.uuid4()), node, gpu, kind, "zombie-detector", related_to=related_to)


def line(result: Score, kind: str):
    (k,) = [k for k in result.kinds if k.kind == kind]
    return k


# --- the answer key ------------------------------------------------------------------------------


def test_every_scripted_kind_has_an_answer_and_benign_ones_expect_nothing():
    assert set(FAULTS) == {*Fault, *Benign}
    assert all(isinstance(kind, IncidentKind) for entry in FAULTS.values() for kind in entry.expect)
    assert all(FAULTS[f].expect for f in Fault) and not any(FAULTS[b].expect for b in Benign)


def test_the_answer_for_an_xid_depends_on_the_xid():
    node = ScriptedNode("sim-node-01", 2)
    node.inject_xid(0, 79)
    node.inject_xid(1, 13)
    node.inject_xid(1, 48)
    node.inject_xid(0, 63)  # NVIDIA: ignore the XID; the remap it announces waits for a reset
    node.inject_xid(1, 119)
    assert [i.expect for i in node.injected] == [
        frozenset({"gpu_lost"}), frozenset(), frozenset({"gpu_xid", "row_remap"}), frozenset({"gpu_xid", "row_remap"}),
        frozenset({"gpu_xid"}),
    ]


# --- matching -------------------------------------------------------------------------------------


def test_right_kind_on_the_right_gpu_is_detected_with_its_latency():
    result = score([inj(10, "n1", 3, Fault.ZOMBIE_JOB)], [incident(41.5, "n1", 3)])
    assert (result.detected, result.expected, result.recall, result.precision) == (1, 1, 1.0, 1.0)
    assert result.outcomes[0].latency_s == 31.5


def test_a_fault_nothing_opened_an_incident_for_is_missed():
    result = score([inj(10, "n1", 3, Fault.ZOMBIE_JOB)], [])
    assert result.recall == 0.0 and result.precision is None
    assert [o.injection.fault for o in result.missed] == ["zombie_job"]


def test_the_wrong_kind_is_a_miss_and_a_false_positive_put_down_to_its_fault():
    result = score([inj(10, "n1", 1, Fault.OOM_KILL)], [incident(12, "n1", 1, "zombie_job")])
    assert result.recall == 0.0 and result.precision == 0.0
    (o,) = result.outcomes
    assert not o.detected and [x.kind for x in o.wrong] == ["zombie_job"]
    assert line(result, "oom_kill").false_positives == 1


def test_benign_behaviour_that_opens_an_incident_is_a_false_positive():
    result = score(
        [inj(5, "n1", 2, Benign.SHORT_DIP), inj(5, "n2", 0, Benign.JOB_FINISHED)],
        [incident(20, "n1", 2, "zombie_job")],
    )
    assert result.expected == 0 and result.recall is None and result.precision == 0.0
    assert line(result, "short_dip").false_positives == 1 and line(result, "job_finished").false_positives == 0


def test_an_incident_where_nothing_was_injected_is_a_false_positive():
    result = score([inj(10, "n1", 3, Fault.ZOMBIE_JOB)], [incident(40, "n1", 3), incident(40, "n9", 0)])
    assert result.precision == 0.5 and [x.node_id for x in result.false_positives] == ["n9"]
    assert all(not o.wrong for o in result.outcomes)


@pytest.mark.parametrize(
    ("at", "counts"),
    [(-1.0, True), (-1.5, False), (120.0, True), (120.5, False)],
)
def test_the_window_runs_from_one_second_before_to_window_after(at, counts):
    result = score([inj(10, "n1", 0, Fault.ZOMBIE_JOB)], [incident(10 + at, "n1", 0)])
    assert result.outcomes[0].detected is counts


def test_a_negative_window_is_refused():
    with pytest.raises(ValueError, match="window_s"):
        score([], [], window_s=-1)


def test_a_gpu_fault_is_found_only_by_an_incident_naming_its_gpu():
    faults = [inj(10, "n1", 2, Fault.ZOMBIE_JOB), inj(10, "n2", None, Fault.DISK_FULL), inj(10, "n3", 1, Fault.XID)]
    incidents = [incident(30, "n1", 5), incident(30, "n2", 4, "disk_pressure"), incident(20, "n3", None, "gpu_xid")]
    result = score(faults, incidents)
    assert [o.detected for o in result.outcomes] == [False, True, False]
    assert [x.node_id for x in result.false_positives] == ["n3", "n1"]
    assert "gpu_xid on n3  (for xid on n3 GPU 1, but it names no GPU)" in render(result)


def test_a_containers_death_is_the_nodes_even_for_the_gpu_its_job_was_on():
    result = score([inj(10, "n1", 2, Fault.OOM_KILL)], [incident(20, "n1", None, "container_died")])
    assert result.outcomes[0].detected and result.precision == 1.0


def test_two_faults_on_one_node_each_take_their_own_kind():
    faults = [inj(10, "n1", None, Fault.DISK_FULL), inj(10, "n1", 0, Fault.ZOMBIE_JOB)]
    result = score(faults, [incident(15, "n1", None, "disk_pressure"), incident(40, "n1", 0, "zombie_job")])
    assert (result.recall, result.precision) == (1.0, 1.0)


def test_a_second_incident_of_one_kind_for_one_fault_is_a_duplicate_against_precision():
    faults = [inj(10, "n1", 0, Fault.XID, {"gpu_xid", "row_remap"})]
    incidents = [incident(40, "n1", 0, "gpu_xid"), incident(41, "n1", 0, "row_remap"), incident(90, "n1", 0, "gpu_xid")]
    result = score(faults, incidents)
    assert (result.detected, len(result.incidents), result.precision) == (1, 3, 2 / 3)
    assert [x.kind for x in result.outcomes[0].right] == ["gpu_xid", "row_remap"]
    assert "a second gpu_xid for xid on n1 GPU 0" in render(result)


def test_a_fleet_incident_is_right_when_the_node_incidents_it_grouped_were():
    fleet = incident(31, "fleet", None, "fleet_anomaly")
    faults = [inj(10, f"n{i}", 0, Fault.ZOMBIE_JOB) for i in range(3)]
    nodes = [incident(40, f"n{i}", 0, related_to=fleet.incident_id) for i in range(3)]
    assert score(faults, [fleet, *nodes]).precision == 1.0
    # A fleet incident over benign dips is as wrong as the node incidents it grouped.
    dips = [inj(10, f"n{i}", 0, Benign.SHORT_DIP) for i in range(3)]
    result = score(dips, [fleet, *nodes])
    assert result.precision == 0.0 and len(result.false_positives) == 4


def test_the_same_injection_or_incident_recorded_twice_counts_once():
    fault = inj(10, "n1", 0, Fault.ZOMBIE_JOB)
    seen = incident(40, "n1", 0)
    result = score([fault, fault], [seen, seen])
    assert (len(result.outcomes), len(result.incidents), result.duplicate_injections) == (1, 1, 1)


def test_a_fault_injected_twice_at_different_times_counts_twice():
    result = score([inj(10, "n1", 0, Fault.ZOMBIE_JOB), inj(300, "n1", 0, Fault.ZOMBIE_JOB)], [incident(40, "n1", 0)])
    assert (result.expected, result.detected) == (2, 1)


def test_naive_datetimes_are_taken_as_utc():
    fault = InjectedFault(t(10).replace(tzinfo=None), "n1", 0, "zombie_job", frozenset({"zombie_job"}))
    assert score([fault], [incident(40, "n1", 0)]).outcomes[0].detected


def test_observed_from_an_incident_opened_event():
    fleet_id = uuid.uuid4()
    event = IncidentOpened(
        source="zombie-detector", incident_id=uuid.uuid4(), node_id="n1", kind=IncidentKind.GPU_XID, gpu_index=3,
        summary="XID 48", related_incident_id=fleet_id, fingerprint="a" * 64,
    )
    seen = Observed.from_event(event)
    assert (seen.kind, seen.gpu, seen.detector, seen.related_to) == ("gpu_xid", 3, "zombie-detector", str(fleet_id))


# --- what a person reads ---------------------------------------------------------------------------


def mixed_run() -> tuple[list[InjectedFault], list[Observed]]:
    faults = [
        inj(5, "sim-node-02", 3, Fault.ZOMBIE_JOB),
        inj(20, "sim-node-05", 1, Fault.OOM_KILL),
        inj(40, "sim-node-07", None, Fault.SSH_REFUSES),
        inj(50, "sim-node-08", 2, Benign.SHORT_DIP),
        inj(52, "sim-node-09", 4, Fault.XID, {"gpu_lost"}),
    ]
    incidents = [
        incident(36.5, "sim-node-02", 3),
        incident(32, "sim-node-05", 1, "container_died"),
        incident(80, "sim-node-08", 2, "zombie_job"),
        incident(53, "sim-node-09", 4, "gpu_lost"),
        incident(90, "sim-node-13", 6, "disk_pressure"),
    ]
    return faults, incidents


def test_render_shows_each_kind_what_was_missed_and_every_false_positive():
    text = render(score(*mixed_run()))
    lines = text.splitlines()
    assert lines[0].split()[:3] == ["injected", "n", "expected"] and set(lines[1]) <= {"-", " "}
    row = {x.split()[0]: x.split() for x in lines[2:7]}
    assert row["zombie_job"] == ["zombie_job", "1", "zombie_job", "1/1", "0", "0", "31.5s/31.5s"]
    assert row["oom_kill"] == ["oom_kill", "1", "container_died", "1/1", "0", "0", "12.0s/12.0s"]
    assert row["ssh_refuses"] == ["ssh_refuses", "1", "ssh_unreachable", "0/1", "1", "0", "-"]
    assert row["short_dip"] == ["short_dip", "1", "none", "-", "-", "1", "-"]
    assert "missed: ssh_refuses on sim-node-07 at 2026-11-22T10:00:40Z (expected ssh_unreachable)" in lines
    assert "false positives (2):" in lines
    assert "  2026-11-22T10:01:20Z  zombie_job on sim-node-08 GPU 2  (with short_dip on sim-node-08 GPU 2)" in lines
    assert "  2026-11-22T10:01:30Z  disk_pressure on sim-node-13 GPU 6  (with nothing injected there)" in lines
    assert lines[-1] == (
        "summary: 5 injected, 4 expect an incident; detected 3 (recall 75%); 5 incidents, "
        "2 false positives (precision 60%); window 120s"
    )


def test_render_columns_line_up_and_do_not_depend_on_input_order():
    faults, incidents = mixed_run()
    first = render(score(faults, incidents))
    assert len({len(x) for x in first.splitlines()[:7]}) == 1
    rng = random.Random(1)
    for _ in range(5):
        rng.shuffle(faults)
        rng.shuffle(incidents)
        assert render(score(faults, incidents)) == first


def test_render_without_anything():
    text = render(score([], []))
    assert "(nothing injected)" in text and "false positives: none" in text
    assert text.splitlines()[-1] == (
        "summary: 0 injected, 0 expect an incident; detected 0 (recall n/a); 0 incidents, "
        "0 false positives (precision n/a); window 120s"
    )


def test_to_dict_is_json_with_every_injection_and_false_positive():
    data = json.loads(json.dumps(score(*mixed_run()).to_dict()))
    assert data["totals"] == {
        "injected": 5, "expect_incident": 4, "detected": 3, "missed": 1, "incidents": 5,
        "false_positives": 2, "precision": 0.6, "recall": 0.75, "duplicate_injections": 0,
    }
    by_kind = {k["kind"]: k for k in data["kinds"]}
    assert by_kind["short_dip"]["expect"] == [] and by_kind["short_dip"]["false_positives"] == 1
    assert [i["injected"] for i in data["injections"]] == ["zombie_job", "oom_kill", "ssh_refuses", "short_dip", "xid"]
    assert {x["kind"] for x in data["false_positives"]} == {"zombie_job", "disk_pressure"}


def test_expectations_say_what_a_run_fell_short_of():
    from gpumedic_sim.runs.scoring import Expectations

    result = score([inj(10, "n1", 0, Fault.ZOMBIE_JOB), inj(10, "n2", 0, Fault.ZOMBIE_JOB)], [incident(20, "n1", 0), incident(20, "n3", 0)])
    assert (result.recall, result.precision) == (0.5, 0.5)
    assert Expectations(recall=1.0, precision=0.5, false_positives=0).shortfalls(result) == [
        "recall 50%, expected at least 100%", "1 false positive(s), expected at most 0",
    ]
    assert Expectations(recall=0.5).shortfalls(result) == []
    assert Expectations(recall=1.0, precision=1.0).shortfalls(score([inj(10, "n1", 0, Benign.SHORT_DIP)], [])) == []  # nothing to measure


def test_a_fleet_that_could_not_keep_its_sampling_interval_says_so_beside_the_score():
    assert fell_behind(0, 12_000, 200) is None and fell_behind(120, 12_000, 200) is None and fell_behind(5, 0, 1) is None
    said = fell_behind(5_181, 12_000, 200)
    assert said is not None and "5,181 of about 12,000 sampling ticks (43%)" in said and "200 simulated nodes" in said
    assert "fewer --nodes" in said
