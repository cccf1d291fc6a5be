"""The shared detector's apply path, driven directly: a decision is in the book at once and
applied (persisted, then published) behind it in the order decided, so a slow state store or bus
holds no input that does not wait; a transition that fails for good is taken back out of the book
with the later changes of its incident. The state bucket is stood in for by a dict with a
controllable write (tests/e2e/test_detector_resume.py runs the real bucket and bus)."""

from __future__ import annotations

import asyncio

import pytest

from gpumedic_bus import NatsSettings, ServiceRuntime
from gpumedic_events import Event, IncidentKind, IncidentOpened, IncidentResolved
from gpumedic_incidents import Finding, Policy
from gpumedic_incidents.book import IncidentBook
from gpumedic_incidents.detector import Detector
from gpumedic_incidents.policy import FleetPolicy, Kinds, ZombiePolicy

POLICY = Policy(fleet=FleetPolicy(hold_s=60, min_nodes=1000), kinds=Kinds(zombie_job=ZombiePolicy()))  # no fleet incident here


class Logic:
    def __init__(self) -> None:
        self.book = IncidentBook("zombie-detector", POLICY)

    def on_action_completed(self, event, now, traceparent):
        return []

    def on_tick(self, now):
        return []


class States:
    """The state bucket: each write waits `delay_s`, or fails while `broken`."""

    def __init__(self) -> None:
        self.saved: dict[str, object] = {}
        self.delay_s = 0.0
        self.broken = False

    async def save(self, state) -> None:
        await asyncio.sleep(self.delay_s)
        if self.broken:
            raise OSError("the bucket is gone")
        self.saved[state.fingerprint] = state

    async def delete(self, state) -> None:
        await asyncio.sleep(self.delay_s)
        self.saved.pop(state.fingerprint, None)


class RecordingDetector(Detector):
    def __init__(self) -> None:
        super().__init__(ServiceRuntime("zombie-detector", NatsSettings(url="nats://127.0.0.1:1")), Logic(), "zombie-detector")
        self.states = States()  # type: ignore[assignment]
        self.published: list[Event] = []

    async def _send(self, event: Event) -> None:
        self.published.append(event)


def zombie(node: str, present: bool = True) -> Finding:
    return Finding(IncidentKind.ZOMBIE_JOB, node, 0, present=present, summary=f"idle GPU 0 on {node}")


async def test_decisions_do_not_wait_for_a_slow_store_and_are_applied_in_order():
    det = RecordingDetector()
    det.states.delay_s = 0.05
    loop = asyncio.get_running_loop()
    started = loop.time()
    for i in range(20):
        await det.decide(lambda now, i=i: det.logic.book.on_finding(zombie(f"n{i}"), now), wait=False)
    assert loop.time() - started < 0.5  # 20 transitions x 2 writes x 50 ms = 2 s if deciding waited
    assert len(det.logic.book.incidents) == 20  # the next input already sees them
    assert all(s.traceparent for s in det.logic.book.incidents.values())  # the trace begun when decided
    await det.settled()
    assert [e.node_id for e in det.published if isinstance(e, IncidentOpened)] == [f"n{i}" for i in range(20)]
    assert len(det.states.saved) == 20 and all(not s.outbox for s in det.states.saved.values())


async def test_an_input_that_waits_returns_once_applied():
    det = RecordingDetector()
    det.states.delay_s = 0.05
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n1"), now))
    assert IncidentOpened in {type(e) for e in det.published}
    assert [s.node_id for s in det.states.saved.values()] == ["n1"]


async def test_a_transition_that_fails_for_good_is_taken_back_with_the_later_changes_of_its_incident():
    det = RecordingDetector()
    det.states.delay_s = 0.05
    det.states.broken = True
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n1"), now), wait=False)
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n1", present=False), now), wait=False)  # decided from the first
    assert det.logic.book.incidents == {}  # closed again, optimistically
    await det.settled()  # the open fails meanwhile
    det.states.broken = False
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n2"), now), wait=False)
    await det.settled()
    assert {e.node_id for e in det.published} == {"n2"}  # n1's open failed; its close was never tried
    assert [s.node_id for s in det.logic.book.incidents.values()] == ["n2"]
    # Whoever waits is told; the book is as before, so the next finding opens it again.
    det.states.broken = True
    with pytest.raises(OSError, match="the bucket is gone"):
        await det.decide(lambda now: det.logic.book.on_finding(zombie("n3"), now))
    assert "n3" not in {s.node_id for s in det.logic.book.incidents.values()}
    det.states.broken = False
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n3"), now))
    await det.decide(lambda now: det.logic.book.on_finding(zombie("n3", present=False), now))
    n3 = [type(e) for e in det.published if e.node_id == "n3"]
    assert n3[0] is IncidentOpened and n3[-1] is IncidentResolved
