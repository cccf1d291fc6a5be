"""A detector cell: the rules that look at one node at a time, over the samples and node events
of the partitions this instance holds, and what they find sent to the decider's incident book.

Run when the detector runs in several instances (`Settings.cells`); see docs/architecture.md,
"Detector cells".

Each partition this instance holds (`gpumedic_bus.shares`, work "cells") is read through that
partition's own durable consumers (`topology.cell_durables`): its nodes' samples over a push
consumer, their node events over one pull consumer, so one node's facts come in order, and a
partition whose cell died is read on from where its consumers stood. Taking a partition reads its
part of the rules' memory (`zombie_detector.memory`); giving one back writes it first, and the
rules are built again from what they remember of the partitions still held (so nothing of a node
this cell no longer reads stays behind). The rules read the open incidents as the state bucket
holds them (`OpenIncidents`); the decider's book decides on what they find.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime

from nats.js.errors import KeyNotFoundError

from gpumedic_bus import ServiceRuntime, publish_event
from gpumedic_bus.consume import PacedConsumer, keep_rejected
from gpumedic_bus.outage import BUS_AWAY, nats_reason
from gpumedic_bus.runtime import HEARTBEAT_EVERY_S
from gpumedic_bus.streams import INCIDENT_STATE, RULE_MEMORY, partition_of, stream_of
from gpumedic_bus.topology import Durable, cell_durables, subject_matches
from gpumedic_events import ConsumerLag, Event, EventDecodeError, IncidentKind, NodeFindings, ServiceHeartbeat
from gpumedic_events.findings import MAX_FINDINGS
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, IncidentState, IncidentStates, Policy
from gpumedic_incidents.book import RecentActions, RecentCloses
from gpumedic_incidents.store import state_key
from zombie_detector import memory
from zombie_detector.clocks import NodeClocks, by_arrival
from zombie_detector.node_incidents import SOURCE
from zombie_detector.rules import DECIDERS, Incidents, Rule, build_rules
from zombie_detector.rules.job import JobRule
from zombie_detector.wire import wire

log = logging.getLogger(__name__)

DECIDERS_KINDS = frozenset({IncidentKind.JOB_HUNG})
"""Kinds a cell's rules may find over the nodes it reads, but only the decider judges (a job's ranks span partitions)."""
RECONCILE_EVERY_S = 0.5
TICK_EVERY_S = 1.0
EVENTS_BATCH = 16


def cell_rules(policy: Policy) -> list[Rule]:
    """The rules that look at one node at a time; and the job rule, for what the per-rank rules ask
    of it (whether a rank is one of a job across nodes, whether its job is being stopped), over the
    nodes this cell reads: its own findings are the decider's to make (`DECIDERS_KINDS`)."""
    return [rule for rule in build_rules(policy) if not isinstance(rule, DECIDERS) or isinstance(rule, JobRule)]


def cell_name(partition: int) -> str:
    return f"p{partition:02d}"


class OpenIncidents:
    """The open incidents as the state bucket holds them, for the rules to read (`rules.Incidents`),
    those closed lately and the work-ending actions they asked for, by when this cell read each."""

    def __init__(self) -> None:
        self.by_key: dict[str, IncidentState] = {}
        """Each open incident by its key in the bucket (`state_key` of its fingerprint)."""
        self._by_node: dict[str, set[str]] = defaultdict(set)
        self.closed = RecentCloses()
        self.acted = RecentActions()

    def open_on(self, node_id: str) -> list[IncidentState]:
        return [self.by_key[key] for key in self._by_node.get(node_id, ())]

    def closed_on(self, node_id: str) -> list[tuple[IncidentState, datetime]]:
        return self.closed.on(node_id)

    def acted_on(self, node_id: str) -> list[tuple[datetime, datetime]]:
        return self.acted.on(node_id)

    def get(self, fingerprint: str) -> IncidentState | None:
        return self.by_key.get(state_key(fingerprint))

    def put(self, state: IncidentState, read_at: datetime | None = None) -> None:
        key = state_key(state.fingerprint)
        self.acted.note(self.by_key.get(key), state, read_at or datetime.now(UTC))
        self.by_key[key] = state
        self._by_node[state.node_id].add(key)

    def drop(self, key: str, closed_at: datetime | None = None) -> None:
        state = self.by_key.pop(key, None)
        if state is not None:
            self._by_node[state.node_id].discard(key)
            if closed_at is not None:
                self.closed.note(state, closed_at)
                self.acted.note(state, None, closed_at)

    async def follow(self, nc) -> None:
        """Keep up with the bucket until cancelled: every key (a job's incident is on its culprit's
        node), read once, then each write as the bucket's stream takes it. A plain subscription to
        the bucket's subjects: a watch would create a consumer, which no service may."""
        prefix = f"$KV.{INCIDENT_STATE.bucket}."
        early: list = []
        loaded = False

        async def on_write(msg) -> None:
            if not loaded:
                early.append(msg)
                return
            self._apply(msg.subject.removeprefix(prefix), msg.data, (msg.headers or {}).get("KV-Operation"))

        sub = await nc.subscribe(f"{prefix}>", cb=on_write)
        try:
            for state in await (await IncidentStates.open(nc.jetstream())).load_all():
                self.put(state)
            loaded = True
            for msg in early:  # written while the rest was read: newer than what was read
                self._apply(msg.subject.removeprefix(prefix), msg.data, (msg.headers or {}).get("KV-Operation"))
            early.clear()
            await asyncio.Event().wait()
        finally:
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    def _apply(self, key: str, value: bytes, operation: str | None) -> None:
        if operation in ("DEL", "PURGE") or not value:
            self.drop(key, datetime.now(UTC))
            return
        try:
            self.put(IncidentState.model_validate_json(value))
        except ValueError as exc:
            log.warning("%s cell: the state under %s is no incident state (%s); its rules read it as closed", SOURCE, key, exc)
            self.drop(key)


class Finder:
    """A cell's rules, pure (no bus, no clock): what they find in one event or on a tick, the
    judgements only the decider makes left out. `incidents`: the open incidents as the rules read
    them (`OpenIncidents`; a test passes the decider's book)."""

    def __init__(self, policy: Policy, incidents: Incidents) -> None:
        self.policy = policy
        self.incidents = incidents
        self.rules = cell_rules(policy)
        self.clocks = NodeClocks()
        self._routes: dict[type, list[Rule]] = {}
        for rule in self.rules:
            for event_type in rule.inputs:
                self._routes.setdefault(event_type, []).append(rule)

    def observe(self, event, now: datetime) -> list[Finding]:
        at = self.clocks.time_of(event, now)  # the rules time a node by its own samples
        findings: list[Finding] = []
        for rule in self._routes.get(type(event), ()):
            try:
                findings += [f for f in rule.observe(event, by_arrival(rule, now, at), self.incidents) if f.kind not in DECIDERS_KINDS]
            except Exception:  # a rule's bug costs its own findings only
                log.exception("%s cell: rule %s failed on %s", SOURCE, type(rule).__name__, getattr(event, "node_id", "-"))
        return findings

    def tick(self, now: datetime) -> list[Finding]:
        findings: list[Finding] = []
        for rule in self.rules:
            try:
                findings += [f for f in rule.tick(now, self.incidents) if f.kind not in DECIDERS_KINDS]
            except Exception:
                log.exception("%s cell: rule %s failed on a tick", SOURCE, type(rule).__name__)
        return findings

    def again(self, keep: Iterable[int], now: datetime) -> Finder:
        """The rules anew, with what they remember of the partitions in `keep` only."""
        values, _ = memory.snapshot(self.rules, now, whose=memory.CELLS)
        kept = {memory.key(p, memory.CELLS): values[memory.key(p, memory.CELLS)] for p in keep}
        fresh = Finder(self.policy, self.incidents)
        if kept:
            memory.recall(fresh.rules, kept, now)
        return fresh


class _Partition:
    def __init__(self, partition: int, samples: PacedConsumer, events: asyncio.Task) -> None:
        self.partition = partition
        self.samples = samples
        self.events = events


class Cell:
    def __init__(self, runtime: ServiceRuntime, policy: Policy) -> None:
        self._runtime = runtime
        self.incidents = OpenIncidents()
        self.finder = Finder(policy, self.incidents)
        self.shares = runtime.shares("cells", before_giving_back=self._finish, alongside=True)
        self.held: dict[int, _Partition] = {}
        self._memory_kv = None
        runtime.more_paced_consumers = lambda: [held.samples for held in self.held.values()]

    # --- what the cell reads ------------------------------------------------------------------

    async def on_sample(self, sample: Sample) -> None:
        await self._found(self.finder.observe(sample, datetime.now(UTC)), partition_of(sample.node_id), sample.occurred_at)

    async def on_node_event(self, event: Event) -> None:
        await self._found(self.finder.observe(event, datetime.now(UTC)), partition_of(event.node_id), event.occurred_at)

    async def _found(self, findings: Iterable[Finding], partition: int, observed_at: datetime) -> None:
        found = [wire(f) for f in findings]
        for start in range(0, len(found), MAX_FINDINGS):
            event = NodeFindings(source=SOURCE, cell=cell_name(partition), observed_at=observed_at,
                                 findings=tuple(found[start:start + MAX_FINDINGS]))
            await publish_event(self._runtime.broker, event, patience_s=15.0)

    # --- the loops ----------------------------------------------------------------------------

    async def run(self) -> None:
        """Follow the open incidents; take and give back partitions as the shares say; tick."""
        js = self._runtime.broker.connection.jetstream()
        self._memory_kv = await js.key_value(RULE_MEMORY.bucket)
        follower = asyncio.create_task(self._follow_incidents(), name="cell-incidents")
        unbound: set[int] = set()
        try:
            await self.shares.settled.wait()
            next_tick = next_checkpoint = asyncio.get_running_loop().time()
            while True:
                for partition in sorted(set(self.shares.held) - set(self.held)):
                    try:
                        await self._take(partition)
                    except Exception as exc:  # noqa: BLE001 (its consumer missing, the bus away: tried again next round)
                        if partition not in unbound:
                            log.warning("%s cell: partition %d held but not read (%s); trying again every %gs", SOURCE, partition,
                                        nats_reason(exc) if isinstance(exc, BUS_AWAY) else repr(exc), RECONCILE_EVERY_S)
                        unbound.add(partition)
                    else:
                        unbound.discard(partition)
                for partition in sorted(set(self.held) - set(self.shares.held)):  # taken by another: nothing to finish
                    await self._stop(partition)
                    self.finder = self.finder.again(self.held, datetime.now(UTC))
                loop_now = asyncio.get_running_loop().time()
                if loop_now >= next_tick:
                    await self._tick()
                    next_tick = loop_now + TICK_EVERY_S
                if loop_now >= next_checkpoint:
                    await self._checkpoint()
                    next_checkpoint = loop_now + memory.CHECKPOINT_S
                await asyncio.sleep(RECONCILE_EVERY_S)
        finally:
            follower.cancel()
            for partition in list(self.held):
                await self._stop(partition)

    async def _follow_incidents(self) -> None:
        """The open incidents, followed again from a fresh read whenever following them fails."""
        while True:
            try:
                await self.incidents.follow(self._runtime.broker.connection)
            except Exception as exc:  # noqa: BLE001 (the bus away: read afresh once it answers)
                log.warning("%s cell: following the open incidents failed (%s); reading them afresh in 1s", SOURCE,
                            nats_reason(exc) if isinstance(exc, BUS_AWAY) else repr(exc))
                await asyncio.sleep(1.0)

    async def _tick(self) -> None:
        now = datetime.now(UTC)
        lags = [held.samples.lag() for held in self.held.values() if held.samples.started]
        if lags:  # how far behind its own samples this cell is: a sample not given yet is no silent node
            self.finder.observe(ServiceHeartbeat(source=SOURCE, service=SOURCE, instance_id=self._runtime.instance_id, state="ready",
                                                 lag=tuple(ConsumerLag(durable=lag.durable, pending=lag.pending, behind_s=lag.behind_s)
                                                           for lag in lags), loop_lag_s=self._runtime.loop_lag.worst(HEARTBEAT_EVERY_S)), now)
        by_partition: dict[int, list[Finding]] = defaultdict(list)
        for finding in self.finder.tick(now):
            by_partition[partition_of(finding.node_id)].append(finding)
        for partition, findings in by_partition.items():
            if partition in self.held:
                try:
                    await self._found(findings, partition, now)
                except BUS_AWAY as exc:
                    log.warning("%s cell: a tick's findings were not sent (%s); the next tick finds them again", SOURCE, nats_reason(exc))

    async def _checkpoint(self) -> None:
        """The rules' memory of the partitions held, each in its key (a cell that dies loses this little)."""
        values, _ = memory.snapshot(self.finder.rules, datetime.now(UTC), whose=memory.CELLS)
        try:
            for partition in list(self.held):
                key = memory.key(partition, memory.CELLS)
                await self._memory_kv.put(key, values[key])
        except BUS_AWAY as exc:
            log.warning("%s cell: the rules' memory was not kept (%s); the next checkpoint writes it all", SOURCE, nats_reason(exc))

    # --- partitions ---------------------------------------------------------------------------

    async def _take(self, partition: int) -> None:
        key = memory.key(partition, memory.CELLS)
        try:
            stored = {key: (await self._memory_kv.get(key)).value or b""}
        except KeyNotFoundError:
            stored = {}
        if stored:
            lines = memory.recall(self.finder.rules, stored, datetime.now(UTC))
            log.info("%s cell: took partition %d; its rules' memory: %s", SOURCE, partition, "; ".join(lines))
        samples_durable, events_durable = cell_durables(partition)
        samples = PacedConsumer(self._runtime.broker, samples_durable, self.on_sample, service=SOURCE, metrics=self._runtime.metrics,
                               connect=self._runtime.connect_for(samples_durable.name), view=Sample)
        try:
            await samples.start()
        except BaseException:
            with contextlib.suppress(Exception):
                await samples.stop()  # its connection
            raise
        events = asyncio.create_task(self._pull(events_durable), name=f"cell-events-{partition:02d}")
        self.held[partition] = _Partition(partition, samples, events)

    async def _finish(self, partition: int) -> None:
        """Before another instance may take `partition`: stop reading it, write its memory."""
        await self._stop(partition)
        values, _ = memory.snapshot(self.finder.rules, datetime.now(UTC), whose=memory.CELLS)
        await self._memory_kv.put(memory.key(partition, memory.CELLS), values[memory.key(partition, memory.CELLS)])
        self.finder = self.finder.again(self.held, datetime.now(UTC))

    async def _stop(self, partition: int) -> None:
        held = self.held.pop(partition, None)
        if held is None:
            return
        held.events.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await held.events
        await held.samples.stop()

    async def _pull(self, durable: Durable) -> None:
        """One partition's node events, in order: each handled, then acknowledged; one that does
        not validate is dead-lettered; a handler that fails gets it again later."""
        js = self._runtime.broker.connection.jetstream()
        stream = stream_of(durable.event)
        sub = await js.pull_subscribe_bind(durable.name, durable.stream)
        filters = [(stream.partition_filter(e, durable.partition), e) for e in durable.events]
        try:
            await self._pull_each(sub, durable, stream, filters)
        finally:  # unsubscribed, or the connection's drain at the service's stop waits on it forever
            with contextlib.suppress(Exception):
                await sub.unsubscribe()

    async def _pull_each(self, sub, durable: Durable, stream, filters) -> None:
        while True:
            try:
                msgs = await sub.fetch(EVENTS_BATCH, timeout=1.0)
            except TimeoutError:
                continue
            except BUS_AWAY as exc:
                log.warning("%s cell: node events of partition %d not fetched (%s)", SOURCE, durable.partition, nats_reason(exc))
                await asyncio.sleep(1.0)
                continue
            for msg in msgs:
                event_type = next((e for pattern, e in filters if subject_matches(pattern, msg.subject)), None)
                try:
                    if event_type is None:
                        raise EventDecodeError(f"no event of this consumer is published on {msg.subject}")
                    event = event_type.from_json(msg.data, subject=stream.as_published(msg.subject))
                except EventDecodeError as exc:
                    await keep_rejected(self._runtime.broker, SOURCE, msg, exc.reason, msg.metadata.num_delivered, cause="invalid")
                    await msg.term()
                    continue
                try:
                    await self.on_node_event(event)
                except Exception:
                    log.exception("%s cell: %s from %s not handled; it comes again", SOURCE, event_type.__name__, event.node_id)
                    await msg.nak(delay=5.0)
                else:
                    await msg.ack()

