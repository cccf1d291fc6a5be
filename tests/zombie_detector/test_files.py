"""file_missing: the files every node must have (runbook 002's canonical models), judged across the
fleet: missing, or a copy other than the one most nodes have, for `for_s`; nothing where it cannot
be told or where the fleet has no majority copy."""

from __future__ import annotations

from gpumedic_events import FileFact, IncidentKind, IncidentResolved
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FileMissingPolicy, FleetPolicy, Kinds
from tests.zombie_detector.test_rules import Detector, sample

MODEL = "/models/canonical/selfplay-v7.safetensors"
GOOD, OLD = "a" * 64, "b" * 64
POLICY = Policy(fleet=FleetPolicy(hold_s=0), kinds=Kinds(file_missing=FileMissingPolicy(for_s=60)))


def with_file(node: str, *, present=True, sha=GOOD, error=None):
    fact = FileFact(path=MODEL, present=present, size=4096 if present else None, sha256=sha if present else None, error=error)
    return sample(node).model_copy(update={"files": (fact,)})


def feed(d: Detector, at: float, nodes: dict[str, dict]) -> None:
    for node, how in nodes.items():
        d.feed(with_file(node, **how), at)


def test_a_model_missing_on_one_node_or_a_stale_copy_is_an_incident_after_for_s_and_clears_once_synced():
    d = Detector(POLICY)
    fleet = {f"n{i}": {} for i in range(1, 5)}
    changed = fleet | {"n3": {"present": False}, "n4": {"sha": OLD}}
    for at in (0, 30):
        feed(d, at, changed)
    assert d.opened(IncidentKind.FILE_MISSING) == []  # within for_s: a sync may be under way
    feed(d, 61, changed)
    opened = {e.node_id: e for e in d.opened(IncidentKind.FILE_MISSING)}
    assert set(opened) == {"n3", "n4"}
    assert opened["n3"].summary == f"{MODEL} is missing (3 other node(s) have it)"
    assert opened["n4"].summary.startswith(f"{MODEL} differs from the copy 2 of 3 nodes have (sha256 bbbbbbbbbbbb, theirs aaaaaaaaaaaa)")
    assert "rsync" in opened["n3"].recommended_action and opened["n3"].fingerprint.startswith("n3/file_missing/node/selfplay-v7-safetensors-")
    feed(d, 90, fleet)  # both synced
    resolved = {e.node_id for e in d.events if isinstance(e, IncidentResolved)}
    assert resolved == {"n3", "n4"}


def test_no_majority_copy_calls_nobody_stale_and_a_node_that_cannot_tell_opens_nothing():
    d = Detector(POLICY)
    rollout = {"n1": {}, "n2": {}, "n3": {"sha": OLD}, "n4": {"sha": OLD}}  # half rolled out: no majority
    for at in (0, 61, 122):
        feed(d, at, rollout | {"n5": {"present": None, "error": "cannot be read: Permission denied"}, "n6": {"sha": None}})
    assert d.opened(IncidentKind.FILE_MISSING) == []


def test_a_node_that_stops_expecting_the_file_clears_its_incident():
    d = Detector(POLICY)
    for at in (0, 61):
        feed(d, at, {"n1": {}, "n2": {}, "n3": {"present": False}})
    assert [e.node_id for e in d.opened(IncidentKind.FILE_MISSING)] == ["n3"]
    d.feed(sample("n3"), 90)  # its sampler no longer lists the file
    assert [e.node_id for e in d.events if isinstance(e, IncidentResolved)] == ["n3"]
