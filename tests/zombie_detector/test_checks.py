"""The operator's own checks and log patterns as incidents. check_failed: node-problem-detector's
exit 0/1/2, 'problem' for the check's for_s opens one per node and check, 'ok' clears it, 'unknown'
does neither, and a check with a ladder of its own in the policy gets that ladder's action.
log_pattern: `count` matching lines within `window_s`, counted across a sampler's restart."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from pydantic import ValidationError

from gpumedic_events import ActionRequested, CheckFact, IncidentKind, IncidentResolved, LogMatches, RestartUnit
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import (
    Actions,
    CheckFailedPolicy,
    CheckPolicy,
    FleetPolicy,
    Kinds,
    LogPatternPolicy,
    PatternPolicy,
    SAMPLER_UNIT,
    RestartPolicy,
    Step,
    UnitRule,
)
from tests.zombie_detector.test_rules import Detector, sample
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules.logs import LogRule

NFS = CheckPolicy(for_s=10, severity="critical", unit="remount-data.service", advice="mount /data again",
                  ladder=(Step(action="restart_unit", verify_within_s=60),))
POLICY = Policy(
    fleet=FleetPolicy(hold_s=0),
    actions=Actions(restart_unit=RestartPolicy(units={"remount-data.service": UnitRule(), SAMPLER_UNIT: UnitRule()})),
    kinds=Kinds(check_failed=CheckFailedPolicy(for_s=60, checks={"nfs-mounted": NFS})),
)


def checked(node: str = "n1", /, **results: str):
    """A sample with the checks' results, by name (`gpu_fabric` is gpu-fabric): 'problem: why', 'ok' or 'unknown: why'."""
    facts = []
    for name, result in results.items():
        status, _, message = result.partition(": ")
        facts.append(CheckFact(name=name.replace("_", "-"), status=status, message=message, ran_at=datetime(2026, 11, 28, tzinfo=UTC)))
    return sample(node).model_copy(update={"checks": tuple(facts)})


def test_a_failing_check_opens_after_its_for_s_with_its_message_and_clears_when_it_passes():
    d = Detector(POLICY)
    for at in (0, 30):
        d.feed(checked(gpu_fabric="problem: NVSwitch 2 is missing"), at)
    assert d.opened(IncidentKind.CHECK_FAILED) == []  # within for_s (60 s, the kind's default here)
    d.feed(checked(gpu_fabric="problem: NVSwitch 2 is missing"), 61)
    (opened,) = d.opened(IncidentKind.CHECK_FAILED)
    assert opened.node_id == "n1" and opened.fingerprint == "n1/check_failed/node/gpu-fabric"
    assert opened.summary == "the check gpu-fabric fails on n1: NVSwitch 2 is missing"
    assert "run gpu-fabric on n1 by hand" in opened.recommended_action
    assert not [e for e in d.events if isinstance(e, ActionRequested)]  # a person's by default
    d.feed(checked(gpu_fabric="problem: NVSwitch 2 is missing"), 70)
    assert len(d.opened(IncidentKind.CHECK_FAILED)) == 1
    d.feed(checked(gpu_fabric="ok: 4 NVSwitches"), 80)
    (resolved,) = [e for e in d.events if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id and resolved.resolution == "cleared"


def test_unknown_opens_and_clears_nothing_and_an_ok_restarts_the_count():
    d = Detector(POLICY)
    d.feed(checked(gpu_fabric="problem: down"), 0)
    d.feed(checked(gpu_fabric="unknown: timed out after 10s"), 40)
    d.feed(checked(gpu_fabric="problem: down"), 61)
    assert len(d.opened(IncidentKind.CHECK_FAILED)) == 1  # an unknown in between neither clears nor restarts the count
    d2 = Detector(POLICY)
    d2.feed(checked(gpu_fabric="problem: down"), 0)
    d2.feed(checked(gpu_fabric="ok"), 30)
    d2.feed(checked(gpu_fabric="problem: down"), 61)
    assert d2.opened(IncidentKind.CHECK_FAILED) == []  # failed twice, passed between: 0 s of a lasting problem
    for at in range(0, 600, 60):
        d2.feed(checked("n2", gpu_fabric="unknown: exit 2: no nvidia-smi"), at)
    assert d2.opened(IncidentKind.CHECK_FAILED) == []


def test_a_check_with_its_own_policy_takes_its_for_s_severity_advice_and_ladder():
    d = Detector(POLICY)
    d.feed(checked(nfs_mounted="problem: /data is not mounted"), 0)
    opened, request = d.feed(checked(nfs_mounted="problem: /data is not mounted"), 10)
    assert opened.kind is IncidentKind.CHECK_FAILED and opened.severity == "critical"
    assert opened.recommended_action == "mount /data again"
    assert request.operation == RestartUnit(unit="remount-data.service")  # its own ladder, not the kind's (empty)
    d.feed(checked("n2", other="problem: x"), 0)
    d.feed(checked("n2", other="problem: x"), 10)
    assert [e.node_id for e in d.opened(IncidentKind.CHECK_FAILED)] == ["n1"]  # the kind's 60 s for every other check


def test_a_check_the_node_no_longer_runs_clears_and_many_nodes_at_once_are_one_fleet_incident():
    d = Detector(POLICY)
    d.feed(checked(gpu_fabric="problem: down", disk="ok"), 0)
    d.feed(checked(gpu_fabric="problem: down", disk="ok"), 61)
    d.feed(checked(disk="ok"), 70)  # the operator removed the script
    assert len([e for e in d.events if isinstance(e, IncidentResolved)]) == 1
    fleet = Detector(Policy(fleet=FleetPolicy(hold_s=30), kinds=Kinds(check_failed=CheckFailedPolicy(for_s=0))))
    for node in range(1, 11):
        fleet.feed(checked(f"n{node}", disk="ok"), 0)
    for at in (1, 40):
        for node in range(1, 9):
            fleet.feed(checked(f"n{node}", disk="problem: /data 100% full"), at)
    fleet.tick(40)
    kinds = [e.kind for e in fleet.opened()]
    assert IncidentKind.FLEET_ANOMALY in kinds and not [e for e in fleet.events if isinstance(e, ActionRequested)]


def test_a_checks_ladder_may_only_act_on_its_node_and_restarts_only_an_allowed_unit():
    with pytest.raises(ValidationError, match="an operator.s check or pattern may drain_node, restart_unit, reboot_node, not kill_gpu_processes"):
        CheckPolicy(ladder=(Step(action="kill_gpu_processes"),))
    with pytest.raises(ValidationError, match="restart_unit needs unit"):
        CheckPolicy(ladder=(Step(action="restart_unit"),))
    with pytest.raises(ValidationError, match="not a check's name"):
        CheckFailedPolicy(checks={"../etc/passwd": CheckPolicy()})
    with pytest.raises(ValidationError, match=r"kinds.check_failed.checks.nfs-mounted restarts remount-data.service, which "
                                              r"actions.restart_unit.units does not allow"):
        Policy(kinds=Kinds(check_failed=CheckFailedPolicy(checks={"nfs-mounted": NFS})))
    assert POLICY.of(IncidentKind.CHECK_FAILED, "nfs-mounted") is NFS
    assert POLICY.of(IncidentKind.CHECK_FAILED, "other").for_s == 60


# --- log_pattern ------------------------------------------------------------------------------


def logged(node: str = "n1", /, **counts: int | tuple[int, str]):
    """A sample with the log patterns' counts since the sampler started (and the last line)."""
    facts = []
    for name, value in counts.items():
        count, last = value if isinstance(value, tuple) else (value, "ERROR SSH connection failed")
        facts.append(LogMatches(name=name.replace("_", "-"), count=count, last_line=last))
    return sample(node).model_copy(update={"logs": tuple(facts)})


PATTERNS = Policy(
    fleet=FleetPolicy(hold_s=0),
    kinds=Kinds(log_pattern=LogPatternPolicy(count=3, window_s=60, patterns={"oom-in-app": PatternPolicy(count=1, severity="critical")})),
)


def test_count_matches_within_the_window_open_and_fewer_clear_across_a_sampler_restart():
    d = Detector(PATTERNS)
    d.feed(logged(worker_errors=40), 0)  # what it counted before this detector saw it is history
    d.feed(logged(worker_errors=42), 10)
    assert d.opened(IncidentKind.LOG_PATTERN) == []  # 2 in the window, 3 needed
    d.feed(logged(worker_errors=(43, "ERROR Failed to reset orphaned tasks: 3 tasks")), 20)
    (opened,) = d.opened(IncidentKind.LOG_PATTERN)
    assert opened.fingerprint == "n1/log_pattern/node/worker-errors"
    assert opened.summary == "3 line(s) matched the log pattern worker-errors on n1 within 60s; the last: ERROR Failed to reset orphaned tasks: 3 tasks"
    d.feed(logged(worker_errors=1), 30)  # the sampler restarted: 1 more, 4 in the window
    d.feed(logged(worker_errors=1), 85)  # the lines of 10 s and 20 s fell out of the window: 1 left (30 s)
    (resolved,) = [e for e in d.events if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id and "matched 1 line(s) within 60s, fewer than 3" in resolved.summary


def test_a_pattern_of_its_own_opens_on_one_line_and_a_pattern_no_longer_counted_clears():
    d = Detector(PATTERNS)
    d.feed(logged(oom_in_app=0, worker_errors=0), 0)
    d.feed(logged(oom_in_app=(1, "java.lang.OutOfMemoryError"), worker_errors=0), 5)
    (opened,) = d.opened(IncidentKind.LOG_PATTERN)
    assert opened.severity == "critical" and opened.summary.endswith("the last: java.lang.OutOfMemoryError")
    d.feed(logged(worker_errors=0), 10)
    (resolved,) = [e for e in d.events if isinstance(e, IncidentResolved)]
    assert resolved.incident_id == opened.incident_id
    quiet = Detector(PATTERNS)
    for at in range(0, 3600, 5):
        quiet.feed(logged("n2", worker_errors=7), at)
    (rule,) = [r for r in quiet.logic.rules if isinstance(r, LogRule)]
    assert quiet.opened() == [] and len(rule._seen["n2"]["worker-errors"].changes) == 1  # a quiet count keeps one point


def test_a_detector_that_restarted_clears_an_incident_its_rules_no_longer_remember():
    """Rule memory is not persisted, the incident store is: a check or pattern seen first after a
    restart with an incident still open clears it once it passes."""
    d = Detector(POLICY)
    d.feed(checked(gpu_fabric="problem: down"), 0)
    d.feed(checked(gpu_fabric="problem: down"), 61)
    logs = Detector(PATTERNS)
    logs.feed(logged(worker_errors=0), 0)
    logs.feed(logged(worker_errors=3), 5)
    for detector in (d, logs):
        assert len(detector.opened()) == 1
        restarted = NodeIncidents(detector.logic.book.policy)  # fresh rules, the same incident store
        restarted.book = detector.logic.book
        detector.logic = restarted
    d.feed(checked(gpu_fabric="ok"), 70)
    logs.feed(logged(worker_errors=3), 100)  # nothing new within the window
    for detector in (d, logs):
        (resolved,) = [e for e in detector.events if isinstance(e, IncidentResolved)]
        assert resolved.incident_id == detector.opened()[0].incident_id
