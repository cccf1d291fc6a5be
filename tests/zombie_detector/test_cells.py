"""Detector cells and the decider, driven directly (`zombie_detector.cell.Finder`, and
`NodeIncidents.on_findings` with the rules that compare nodes): each cell sees only its own nodes
and sends what it finds over the wire as `NodeFindings`; the decider sees every sample and keeps
the book. What a cell cannot see (a job's ranks on another cell's nodes) the decider corrects."""

from __future__ import annotations

import uuid
from datetime import timedelta
from types import SimpleNamespace

from gpumedic_events import ActionRequested, IncidentKind, IncidentOpened, NodeFindings, NodeRetired, NodeSampled
from gpumedic_incidents import Finding
from gpumedic_incidents.store import state_key
from gpumedic_events.views import Sample
from tests.zombie_detector.test_job_rule import POLICY, node_sample
from tests.zombie_detector.test_rules import at, succeeded
from zombie_detector.cell import Finder, OpenIncidents
from zombie_detector.node_incidents import NodeIncidents
from zombie_detector.rules import decider_rules
from zombie_detector.wire import finding_of, wire


class Cells:
    """A decider and one cell per group of nodes, the cells reading the decider's book as the open incidents."""

    def __init__(self, groups: list[set[str]], policy=POLICY) -> None:
        self.decider = NodeIncidents(policy, decider_rules(policy))
        self.cells = [(nodes, Finder(policy, self.decider.book)) for nodes in groups]
        self.events: list = []

    def feed(self, event: NodeSampled, s: float) -> None:
        sample = Sample.decode_body(event.model_copy(update={"occurred_at": at(s)}).to_json())
        self._commit(self.decider.on_event(sample, at(s)))  # every sample, for the rules that compare nodes
        for nodes, finder in self.cells:
            if sample.node_id in nodes:
                self._send(finder.observe(sample, at(s)), s)

    def tick(self, s: float) -> None:
        self._commit(self.decider.on_tick(at(s)))
        for _, finder in self.cells:
            self._send(finder.tick(at(s)), s)

    def _send(self, findings, s: float) -> None:
        if findings:
            sent = NodeFindings(source="zombie-detector", cell="p00", observed_at=at(s), findings=tuple(wire(f) for f in findings))
            self._commit(self.decider.on_findings(NodeFindings.from_json(sent.to_json(), subject=sent.subject), at(s)))

    def _commit(self, transitions, now=None) -> None:
        for t in transitions:
            self.decider.book.commit(t, now)
            self.events += t.events

    def opened(self) -> list[tuple[str, str]]:
        return sorted((e.kind.value, e.node_id) for e in self.events if isinstance(e, IncidentOpened))


def run(cells: Cells, until: int, shape) -> None:
    for s in range(0, until, 5):
        for i in range(4):
            if (one := shape(i, s)) is not None:
                cells.feed(one, s + i * 0.5)
        cells.tick(s + 3)


def test_a_job_whose_ranks_fall_in_two_cells_is_one_job_hung_and_no_zombie_per_rank():
    cells = Cells([{"n1"}, {"n2"}])  # each cell sees one rank's node: to it, a job on one node
    mpi = lambda i, s: node_sample(i, (0, 0), job="rendezvous:10.0.0.1:6000", nodes=None) if i < 2 else None  # noqa: E731
    run(cells, 700, mpi)
    assert cells.opened() == [("job_hung", "n1")]


def test_a_zombie_on_a_job_of_one_node_is_found_by_its_cell_and_opened_by_the_decider():
    cells = Cells([{"n1", "n2"}, {"n3", "n4"}])
    local = lambda i, s: node_sample(0, (0, 0), job="torchelastic:single", nodes=1) if i == 0 else None  # noqa: E731
    run(cells, 700, local)
    assert cells.opened() == [("zombie_job", "n1"), ("zombie_job", "n1")]
    # the cell went on finding it while open; the book kept one incident per GPU
    assert len({e.incident_id for e in cells.events if isinstance(e, IncidentOpened)}) == 2


def test_what_a_cell_found_before_its_node_was_retired_is_not_opened_after():
    cells = Cells([{"n1"}])
    cells._commit(cells.decider.on_event(NodeRetired(source="remediator", node_id="n1", incident_id=uuid.uuid4(), action_id=uuid.uuid4(),
                                                     reason="worker ended", occurred_at=at(10)), at(10)))
    late = Finder(POLICY, cells.decider.book)
    findings = [f for s in range(0, 700, 5) for f in late.observe(Sample.decode_body(
        node_sample(0, (0, 0), job="torchelastic:single", nodes=1).model_copy(update={"occurred_at": at(s)}).to_json()), at(s))]
    assert any(f.kind is IncidentKind.ZOMBIE_JOB and f.present for f in findings)
    sent = NodeFindings(source="zombie-detector", cell="p00", observed_at=at(5), findings=tuple(wire(f) for f in findings[-2:]))
    assert cells.decider.on_findings(sent, at(700)) == []


def test_a_finding_crosses_the_wire_whole():
    finder = Finder(POLICY, NodeIncidents(POLICY).book)
    findings = [f for s in range(0, 700, 5) for f in finder.observe(Sample.decode_body(
        node_sample(0, (0, 0), job="torchelastic:single", nodes=1).model_copy(update={"occurred_at": at(s)}).to_json()), at(s))]
    finding = next(f for f in findings if f.present)
    back = finding_of(NodeFindings.from_json(NodeFindings(source="zombie-detector", cell="p03", observed_at=at(0),
                                                          findings=(wire(finding),)).to_json()).findings[0])
    assert back == finding


def test_the_open_incidents_follow_the_state_buckets_writes():
    cells = Cells([{"n1"}])
    local = lambda i, s: node_sample(0, (0, 0), job="torchelastic:single", nodes=1) if i == 0 else None  # noqa: E731
    run(cells, 700, local)
    mirror = OpenIncidents()
    for state in cells.decider.book.incidents.values():
        mirror._apply(state_key(state.fingerprint), state.model_dump_json().encode(), None)
    assert {s.fingerprint for s in mirror.open_on("n1")} == {s.fingerprint for s in cells.decider.book.open_on("n1")} != set()
    key = next(iter(mirror.by_key))
    closed = mirror.by_key[key]
    mirror._apply(key, b"", "PURGE")
    assert len(mirror.open_on("n1")) == len(cells.decider.book.open_on("n1")) - 1
    assert [state for state, _ in mirror.closed_on("n1")] == [closed]  # readable a while, for facts arriving late
    remaining = next(iter(mirror.by_key))
    mirror._apply(remaining, b"{not json", None)  # a state that does not parse: read as closed, and said
    assert mirror.open_on("n1") == [] and len(mirror.closed_on("n1")) == 1  # no close it can tell of


def test_a_cell_keeps_each_work_ending_actions_window_after_its_incident_moved_on():
    """What a kill ends may reach a cell after the incident it read moved on: the window the cell
    read (from the request to the answer) stays, so the death is still gpumedic's own doing."""
    cells = Cells([{"n1"}])
    local = lambda i, s: node_sample(0, (0, 0), job="torchelastic:single", nodes=1) if i == 0 else None  # noqa: E731
    run(cells, 700, local)
    acting = next(s for s in cells.decider.book.incidents.values() if s.pending_action is not None)
    asked = acting.pending_action
    assert asked.ends_work_on == ("n1",)
    mirror = OpenIncidents()
    mirror.put(acting, at(701))
    skew = timedelta(seconds=5)
    assert mirror.acted_on("n1") == [(asked.requested_at - skew, acting.deadline + skew)]  # no answer yet: until its deadline
    mirror.put(acting.model_copy(update={"phase": "verifying", "pending_action": None}), at(703))
    assert mirror.acted_on("n1") == [(asked.requested_at - skew, at(703) + skew)]  # answered: until then
    assert mirror.acted_on("n2") == []


def test_a_fault_in_what_a_node_sent_before_its_incident_closed_opens_no_new_one():
    """A cell that took over a partition reads the samples its dead holder left: a zombie seen in
    them was found, fixed and closed meanwhile, and is no new incident; one seen after the close is."""
    cells = Cells([{"n1"}])
    local = lambda i, s: node_sample(0, (0, 0), job="torchelastic:single", nodes=1) if i == 0 else None  # noqa: E731
    finder = Finder(POLICY, cells.decider.book)
    found = []
    for s in range(0, 700, 5):
        sample = Sample.decode_body(local(0, s).model_copy(update={"occurred_at": at(s)}).to_json())
        cells._commit(cells.decider.on_event(sample, at(s)))
        found += [(s, f) for f in finder.observe(sample, at(s)) if f.present and f.gpu_index == 0]
    (s_found, zombie), *_ = found

    def send(finding, observed_s: float, now_s: float):
        sent = NodeFindings(source="zombie-detector", cell="p00", observed_at=at(observed_s), findings=(wire(finding),))
        transitions = cells.decider.on_findings(sent, at(now_s))
        cells._commit(transitions)
        return transitions

    [opened] = send(zombie, s_found, s_found + 1)
    [request] = [e for e in cells.events if isinstance(e, ActionRequested)]
    succeeded(SimpleNamespace(logic=cells.decider, _commit=cells._commit), request, s_found + 5)  # the kill ran
    gone = Finding(IncidentKind.ZOMBIE_JOB, "n1", 0, present=False, summary="GPU 0 holds no process")
    [closed] = send(gone, s_found + 10, s_found + 11)
    assert closed.after is None  # resolved: fixed
    assert send(zombie, s_found + 5, s_found + 40) == []  # seen before the close, read after it
    [again] = send(zombie, s_found + 20, s_found + 41)
    assert again.after is not None and again.after.incident_id != opened.after.incident_id
