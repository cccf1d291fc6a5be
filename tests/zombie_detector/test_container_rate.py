"""container_died on a node as a whole: many different containers dying there and seldom
elsewhere, judged like a black hole's tasks; a job's own crash loop, stops that were asked for
and gpumedic's own kills never make a node stand out."""

from __future__ import annotations

import pytest

from gpumedic_events import ContainerExited, IncidentKind
from gpumedic_incidents import Policy
from tests.zombie_detector.test_rules import Detector

POLICY = Policy.model_validate({"fleet": {"hold_s": 0}})
NODES = [f"n{i}" for i in range(8)]


def ended(node: str, name: str, code: int = 0, *, engine_signal: str | None = None) -> ContainerExited:
    return ContainerExited(source="node-sampler", node_id=node, container_id=f"{abs(hash((node, name))):064x}"[:64], name=name,
                           exit_code=code, engine_signal=engine_signal)


def fleet_day(d: Detector, bad: dict[str, list[tuple[str, int]]] | None = None, per_node: int = 12) -> None:
    """Each node runs `per_node` short jobs, each its own container, all ending well, except what `bad` says."""
    s = 0.0
    for node in NODES:
        for j in range(per_node):
            d.feed(ended(node, f"task-{j}"), s)
            s += 0.1
    for node, exits in (bad or {}).items():
        for name, code in exits:
            d.feed(ended(node, name, code), s)
            s += 0.1
    d.tick(s + 20)  # past the exits' settling and the rule's cadence


def test_a_node_where_many_different_containers_die_is_one_incident_for_a_person():
    d = Detector(POLICY)
    fleet_day(d, bad={"n3": [(f"job-{j}", 139 if j % 2 else 1) for j in range(8)]})
    rate = [o for o in d.opened(IncidentKind.CONTAINER_DIED) if o.fingerprint.endswith("/node_rate")]
    assert [o.node_id for o in rate] == ["n3"]
    (opened,) = rate
    assert opened.summary.startswith("8 of the 20 containers that ran on n3 in the last 60 min died (40%) against 0.6% on the rest")
    assert opened.diagnosis.cause == "node_kills_containers" and opened.evidence["nodes_judged"] == len(NODES)
    assert not any(type(e).__name__ == "ActionRequested" and e.node_id == "n3" and "node_rate" in (e.fingerprint or "") for e in d.events)


@pytest.mark.parametrize(("what", "exits"), [
    ("one job's crash loop: one container, however often it died", [("trainer", 1)] * 12),
    ("stops and kills the engine was asked for", [(f"job-{j}", 137) for j in range(8)]),
    ("deaths spread evenly: two on this node as on any", [("job-a", 1), ("job-b", 139)]),
])
def test_what_is_no_node_s_doing_opens_no_node_rate_incident(what, exits):
    d = Detector(POLICY)
    asked = what.startswith("stops")
    s = 0.0
    for node in NODES:
        for j in range(12):
            d.feed(ended(node, f"task-{j}"), s)
            s += 0.1
        if what.startswith("deaths spread"):
            for name, code in exits:
                d.feed(ended(node, name, code), s)
    if not what.startswith("deaths spread"):
        for name, code in exits:
            d.feed(ended("n3", name, code, engine_signal="SIGKILL" if asked else None), s)
    d.tick(s + 20)
    assert not [o for o in d.opened(IncidentKind.CONTAINER_DIED) if o.fingerprint.endswith("/node_rate")], what


def test_too_few_containers_or_no_one_to_compare_with_judges_nothing_and_null_turns_it_off():
    d = Detector(POLICY)
    for j in range(9):  # nine containers, all dead: below min_containers
        d.feed(ended("n1", f"job-{j}", 1), j)
    d.feed(ended("n2", "task", 0), 10)
    d.tick(40)
    assert not [o for o in d.opened(IncidentKind.CONTAINER_DIED) if o.fingerprint.endswith("/node_rate")]
    off = Policy.model_validate({"fleet": {"hold_s": 0}, "kinds": {"container_died": {"node_rate": None}}})
    d = Detector(off)
    fleet_day(d, bad={"n3": [(f"job-{j}", 1) for j in range(8)]})
    assert not [o for o in d.opened(IncidentKind.CONTAINER_DIED) if o.fingerprint.endswith("/node_rate")]
