"""The remediator's NATS adapter: ActionRequested in, one ActionCompleted out, side effects at most once.

The order of steps is the safety argument.

1. The ledger is read first: a request already there is answered from the ledger (finished) or
   declared interrupted (a remediator died mid-action), never run again. A request is its action
   id and what it asks (`ActionRequested.request_sha256`): action ids can be predicted, so a
   forgery sent first under a real request's id is kept aside, not taken for the real one.
2. The request is checked against itself and its incident (`gate.refusal`): its age by the
   server's clock, the open incident its fingerprint names (read from the detectors' state
   bucket, which only detectors may write), the exact action that incident waits for, and a
   full identity for every process. Forged, replayed and overtaken requests stop here.
3. The gate decides under the store's gate lock (`gpumedic_store.breaker.lock_gate`), one request at a time
   across every instance, and the decision is recorded in the same transaction: executing,
   refused or observed. A burst of requests cannot slip past the breaker or the one-action-per-
   node rule together. If the store is down nothing is recorded, nothing has run, the handler
   raises and JetStream redelivers later.
4. Only an executing record runs. On the node the operation checks again that the GPU and each
   process are still what the incident saw. Once commands may have run, every error becomes a
   failed outcome instead of an exception, because an exception would redeliver a side effect.

At most `max_concurrent_actions` requests are handled at once per instance (the consumer's batch).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import hashlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Collection
from datetime import UTC, datetime, timedelta
from pathlib import Path

from opentelemetry.trace import Status, StatusCode, Tracer
from prometheus_client import Counter, Gauge
from pydantic import ValidationError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from gpumedic_bus import Delivery, EventConsumer, ServiceRuntime, publish_event
from gpumedic_events import (
    ActionCompleted,
    ActionOutcome,
    ActionRequested,
    ClusterChecked,
    Event,
    EventDecodeError,
    NodeRetired,
)
from gpumedic_incidents import FLEET_NODE, IncidentState, IncidentStates, fleet_fingerprint
from gpumedic_incidents.policy import CheckpointPolicy
from gpumedic_nodes.inventory import InventoryError, NodeAddress, load_inventory
from gpumedic_nodes.ssh import NodeError, SshExecutor
from gpumedic_providers.base import Provider
from gpumedic_store import OPERATORS_HOLD, StoreUnavailable, TaskDatabase, breaker, views
from gpumedic_store.models import ActionRecord
from gpumedic_telemetry import ACTION_ID, INCIDENT_ID, NODE_ID
from remediator import catalogue, repository
from remediator.catalogue import CommandResult, ExecutionResult, InvalidParameter, Means, Node
from remediator.catalogue.base import Scheduler
from remediator.leaders import ClusterLeaders
from remediator.gate import RESET_HINT, Decision, Gate, LedgerView, OwnFacts, Verdict, breaker_limit, fleet_verdict, maintenance, refusal
from remediator.scheduler import StoreScheduler
from remediator.settings import Settings

log = logging.getLogger(__name__)

SERVICE = "remediator"
DURABLE = "remediator-actions"
INTERRUPTED_DETAIL = "remediator restarted mid-action; not run again; the detector re-verifies"
MAX_EVENT_STEPS = 64
MAX_DETAIL = 2000

_COMPLETED_NAMESPACE = uuid.UUID("0d6f3c1e-52a4-4b8e-9c71-3e5a2f8b9d40")
"""Completion event ids derive from the action id, so a re-published result is the same event."""


class ActionInFlight(RuntimeError):
    """The same action is executing in another instance; the request is redelivered later."""


class ActionHandler:
    """Handles ActionRequested events; everything it needs is injected.

    `incidents` (the detectors' open incidents) is set once the service has opened its bucket.
    """

    def __init__(
        self,
        *,
        settings: Settings,
        gate: Gate,
        runtime: ServiceRuntime,
        sessions: async_sessionmaker[AsyncSession],
        executor: SshExecutor,
        tracer: Tracer,
        incidents: IncidentStates | None = None,
        scheduler: Scheduler | None = None,
        provider: Provider | None = None,
        task_db: TaskDatabase | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
    ) -> None:
        self._settings = settings
        self._gate = gate
        self._runtime = runtime
        self._sessions = sessions
        self._executor = executor
        self._tracer = tracer
        self.incidents = incidents
        self.scheduler = scheduler
        """Where drains are kept and told (the store, the hook, the bus)."""
        self.provider = provider
        """Where workers are rented and ended (None: no provider configured)."""
        self.task_db = task_db
        """Where tasks are requeued and worker records marked ended (None: not configured)."""
        self.leaders = ClusterLeaders()
        """Each peer cluster's leader, as leader-health reports it (`register` keeps it current)."""
        self._now = clock
        registry = runtime.metrics.registry
        self._outcomes = Counter("gpumedic_actions", "Action requests answered, by operation and outcome (succeeded, "
                                 "failed, blocked, observed).", ["operation", "outcome"], registry=registry)
        self.breaker_open = Gauge("gpumedic_breaker_open", "1 while the fleet circuit breaker is open (no action runs "
                                  "until a person resets it), else 0.", registry=registry)
        self._breaker_nodes = Gauge("gpumedic_breaker_nodes_in_window", "Nodes acted on within the breaker's window, "
                                    "as of the last request.", registry=registry)
        self.paused = Gauge("gpumedic_remediation_paused", "1 while a person paused remediation fleet-wide (`gpumedic "
                            "pause`: the breaker open on purpose), else 0.", registry=registry)

    async def handle(self, request: ActionRequested, delivery: Delivery) -> None:
        attributes = {
            INCIDENT_ID: str(request.incident_id),
            NODE_ID: request.node_id,
            ACTION_ID: str(request.action_id),
        }
        with self._tracer.start_as_current_span("act", context=delivery.trace_context, attributes=attributes) as span:
            record = await self._act(request, delivery)
            self._outcomes.labels(request.operation.operation, record.status).inc()
            span.set_attribute("gpumedic.action.outcome", record.status)
            if record.status == ActionOutcome.FAILED:
                span.set_status(Status(StatusCode.ERROR, record.detail[:200]))
            # Published inside the span, so the result is its child in the incident's trace; the
            # workers it ended first, so that no detector takes their silence for a fault.
            # Their event ids derive from the ledger row, so a re-published answer is stored once.
            for retired in retired_events(request, record):
                await publish_event(self._runtime.broker, retired)
            await publish_event(self._runtime.broker, completed_event(record))

    async def _act(self, request: ActionRequested, delivery: Delivery) -> ActionRecord:
        """The finished ledger record for this request, acting on the node at most once."""
        async with self._sessions() as session:
            known = await repository.find_request(session=session, request=request)
            if known is not None:
                return await self._replay(session, known, delivery)

        checkpoint = None
        stored_under = request.fingerprint
        try:
            incident = await self._incident(request)
            if incident is not None and incident.node_id != FLEET_NODE:
                stored_under = fleet_fingerprint(incident.kind)
                fleet = await self.incidents.get(stored_under)
            else:
                fleet = None
        except ValidationError as exc:
            # Only a detector can write the key, but a state that does not parse is no permission.
            why_not = f"refused: the state stored under {stored_under} is not an incident state ({_first_error(exc)})"
        else:
            facts = await self._own_facts(request)
            why_not = refusal(request, incident=incident, gate=self._gate, now=self._now(), stored_at=delivery.stored_at,
                              facts=facts, fleet=fleet)
            checkpoint = self._gate.kinds.of(incident.kind, incident.key).checkpoint if incident is not None else None
        return await self.run_gated(request, why_not, delivery.still_working, checkpoint=checkpoint)

    async def run_gated(
        self, request: ActionRequested, why_not: str, still_working: Callable[[], Awaitable[None]],
        *, checkpoint: CheckpointPolicy | None = None, rollout: bool = False,
    ) -> ActionRecord:
        """Decide under the gate lock and record, then run only what was decided `executing`.

        `why_not` is the request's own refusal ('' when it passed); `still_working` is called
        before each command (a JetStream delivery's keep-alive); `checkpoint` is the incident's
        kind's checkpoint step. Pre-flight's clean comes in here too, so its kills obey the same
        breaker, locks, caps and modes as every action. `rollout`: an operator's fleet operation
        asks (its drains are the operators' hold, `Means.rollout`)."""
        # Read before the lock, which serialises every instance's decisions.
        fleet_size, address = self._inventory_facts(request.node_id)
        async with self._sessions() as session:
            await breaker.lock_gate(session=session)
            known = await repository.find_request(session=session, request=request)
            if known is not None:  # another instance decided it while we checked
                if known.status == repository.EXECUTING:
                    # It runs there now; come back when it has finished and answer from the ledger.
                    raise ActionInFlight(f"action {request.action_id} is executing in another remediator instance")
                return known
            action_id, taken = await repository.claim(session=session, request=request)
            status, detail = await self._decide(session, request, why_not or taken, fleet_size, address)
            record = await repository.record(
                session=session, request=request, status=status, detail=_clip(detail), now=self._now(), action_id=action_id
            )
            await session.commit()
        if status != repository.EXECUTING:
            log.info("action %s on %s %s: %s", request.action_id, request.node_id, status, detail)
            return record

        result = await self._execute(request, still_working, checkpoint, rollout=rollout)
        log.info("action %s on %s %s: %s", request.action_id, request.node_id, result.outcome.value, result.detail)
        async with self._sessions() as session:
            session.add(record)
            # If this commit fails the row stays executing; the redelivery marks it interrupted.
            await repository.finish(
                session=session,
                record=record,
                status=result.outcome.value,
                detail=_clip(result.detail),
                steps=result.steps,
                audit=result.audit,
                now=self._now(),
                in_use=result.in_use,
            )
            await session.commit()
        return record

    async def _own_facts(self, request: ActionRequested) -> OwnFacts:
        """What the gate checks the request against from the remediator's own sources."""
        killed: frozenset[str] = frozenset()
        if catalogue.spec_of(request.operation).after_kill:
            async with self._sessions() as session:
                killed = await repository.killed(session=session, incident_id=request.incident_id)
        return OwnFacts(leader=self.leaders.of(request.node_id), killed=killed)

    async def _incident(self, request: ActionRequested) -> IncidentState | None:
        """The open incident the request's fingerprint names; a bus error raises (and redelivers)."""
        if request.fingerprint is None:
            return None
        if self.incidents is None:
            raise RuntimeError("the incident state bucket is not open yet")
        return await self.incidents.get(request.fingerprint)

    async def _replay(self, session: AsyncSession, record: ActionRecord, delivery: Delivery) -> ActionRecord:
        """A request seen before: answer from the ledger, never run it again."""
        if record.status == repository.EXECUTING:
            # The process that claimed it died before finishing (or before committing the
            # finish): the node may or may not have been touched, so a person-free retry would
            # be blind. The detector sees whether the fault is still there and asks again.
            log.warning(
                "action %s on %s was left executing (delivery %d); marking it interrupted",
                record.action_id, record.node_id, delivery.deliveries,
            )
            await repository.finish(
                session=session,
                record=record,
                status=ActionOutcome.INTERRUPTED.value,
                detail=INTERRUPTED_DETAIL,
                steps=record.steps,
                now=self._now(),
            )
            await session.commit()
        else:
            log.info("action %s already %s; re-publishing its result", record.action_id, record.status)
        return record

    async def _decide(
        self, session: AsyncSession, request: ActionRequested, why_not: str, fleet_size: int, address: NodeAddress | None
    ) -> tuple[str, str]:
        """The ledger status and detail for a request, decided under the gate lock."""
        if why_not:
            return ActionOutcome.BLOCKED.value, why_not
        now = self._now()
        view = await repository.ledger_view(
            session=session,
            request=request,
            now=now,
            window_s=self._gate.breaker_window_s,
            node_window_s=self._gate.node_window_s,
        )
        view = dataclasses.replace(view, fleet_size=fleet_size)
        # An inventory that cannot be read (fleet_size 0) is no verdict on the node: the action then
        # fails on the same error when it connects.
        decision: Decision = fleet_verdict(
            request, gate=self._gate, ledger_view=view, now=now, address=address, in_inventory=address is not None or not fleet_size,
            reached=self._reached(request),
        )
        self.breaker_open.set(1 if view.breaker_open_since is not None or decision.trip_breaker else 0)
        self._breaker_nodes.set(len(view.nodes_in_window))
        if decision.trip_breaker:
            log.error("circuit breaker tripped by action %s: %s", request.action_id, decision.trip_reason)
            await breaker.trip(session=session, reason=decision.trip_reason, now=now)
        if decision.verdict is Verdict.ALLOW:
            return repository.EXECUTING, ""
        if decision.verdict is Verdict.OBSERVE:
            return ActionOutcome.OBSERVED.value, f"{decision.reason}; {_would_run(request, self._gate)}"
        return ActionOutcome.BLOCKED.value, decision.reason

    @property
    def inventory_path(self) -> Path:
        return self._settings.inventory

    def standing_verdict(self, request: ActionRequested) -> Decision:
        """The gate's verdict on `request` from what does not change from one moment to the next:
        protected nodes, the operation's node scope, the inventory and observe mode (a dry run's;
        the breaker, caps and actions in flight are judged when it runs)."""
        fleet_size, address = self._inventory_facts(request.node_id)
        return fleet_verdict(request, gate=self._gate, ledger_view=LedgerView(fleet_size=fleet_size), now=self._now(),
                             address=address, in_inventory=address is not None or not fleet_size)

    async def in_maintenance(self, nodes: list[str]) -> dict[str, str]:
        """The nodes a person's silence holds out of a fleet operation now (`gate.maintenance`), each
        with the silence that does."""
        now = self._now()
        async with self._sessions() as session:
            silences = await views.list_silences(session, now=now)
        held: dict[str, str] = {}
        for node in nodes:
            if (silence := next((s for s in silences if maintenance(s, node, now)), None)) is not None:
                held[node] = f"silenced by {silence.created_by} ({silence.reason}), silence {silence.id[:8]}: left alone"
        return held

    async def breaker_room(self, nodes: set[str], operation: object, *, before: Collection[str] = ()) -> str:
        """Why acting on `nodes` now would take the breaker past its limit or meet it open ('' when
        it would not): a fleet operation asks before each batch, and stops rather than trip it; a
        dry run asks with the nodes its earlier batches would have acted on (`before`).

        A fleet operation's drain counts as a fix does (`Spec.rollout_counts`); an incident's drain
        moves one node's jobs, and does not."""
        now = self._now()
        probe = ActionRequested(source=SERVICE, action_id=uuid.uuid4(), incident_id=uuid.uuid4(), node_id=sorted(nodes)[0],
                                attempt=1, operation=operation, reason="breaker room")
        async with self._sessions() as session:
            view = await repository.ledger_view(session=session, request=probe, now=now, window_s=self._gate.breaker_window_s,
                                                node_window_s=self._gate.node_window_s)
        if view.breaker_open_since is not None:
            return f"the circuit breaker is open ({view.breaker_reason or 'tripped'}), {RESET_HINT}"
        spec = catalogue.spec_of(operation)
        if not spec.fix and not spec.rollout_counts:
            return ""  # moving jobs back, ending a worker's record: the breaker does not count it
        fleet_size, _ = self._inventory_facts(probe.node_id)
        limit, why = breaker_limit(self._gate, fleet_size)
        already = view.nodes_in_window | (await self._drained_by_rollouts(now) if spec.rollout_counts else set())
        after = already | set(before) | nodes
        if len(after) > limit:
            return (f"it would take the breaker to {len(after)} distinct nodes acted on within {self._gate.breaker_window_s:g}s "
                    f"({len(already | set(before))} already; {why}): wait for the window, or act on fewer nodes at once")
        return ""

    async def _drained_by_rollouts(self, now: datetime) -> set[str]:
        """The nodes fleet operations drained within the breaker's window."""
        since = now - timedelta(seconds=self._gate.breaker_window_s)
        async with self._sessions() as session:
            rows = await views.drains(session=session)
        return {r.node_id for r in rows if r.incident_id == OPERATORS_HOLD and r.drained_at >= since}

    def _inventory_facts(self, node_id: str) -> tuple[int, NodeAddress | None]:
        """Nodes in the inventory (for the breaker's share) and this node's entry (for its group and
        labels); (0, None) if it cannot be read: then the count limit applies, and the action fails
        on the same error when it connects."""
        try:
            nodes = load_inventory(self._settings.inventory)
        except InventoryError:
            return 0, None
        return len(nodes), nodes.get(node_id)

    def _reached(self, request: ActionRequested) -> dict[str, NodeAddress | None]:
        """The other nodes the operation logs in to, with their inventory entries (none when the
        inventory cannot be read: the action then fails on the same error when it connects)."""
        others = [n for n in catalogue.spec_of(request.operation).reaches(request.operation) if n != request.node_id]
        if not others:
            return {}
        try:
            nodes = load_inventory(self._settings.inventory)
        except InventoryError:
            return {}
        return {n: nodes.get(n) for n in others}

    def _admin_token(self, operation: object) -> str | None:
        """The admin endpoints' token, read only for http_admin (a token file may be rotated)."""
        if not catalogue.spec_of(operation).admin_token:
            return None
        try:
            return self._settings.admin_token()
        except ValueError as exc:
            raise InvalidParameter(f"the admin token cannot be read: {exc}") from None

    async def _execute(
        self, request: ActionRequested, still_working: Callable[[], Awaitable[None]], checkpoint: CheckpointPolicy | None = None,
        *, rollout: bool = False,
    ) -> ExecutionResult:
        """Run the operation on the node; every failure is an outcome, never an exception.

        Every command that runs is audited: its exit status, a digest of its output (never the
        output: a command line read from /proc may carry a job's secrets) and its timing."""
        steps: list[str] = []
        audit: list[dict] = []
        t0 = time.monotonic()

        async def run_on(run: Callable[..., Awaitable[CommandResult]], command: str, **stdin: str) -> CommandResult:
            # Each command may take a while; keep JetStream from redelivering meanwhile.
            await still_working()
            steps.append(command)
            started = time.monotonic()
            try:
                result = await run(command, **stdin)  # stdin (a token) is never recorded
            except Exception as exc:
                audit.append(audit_entry(command, None, started - t0, time.monotonic() - started, error=f"{type(exc).__name__}: {exc}"))
                raise
            audit.append(audit_entry(command, result, started - t0, time.monotonic() - started))
            return result

        async def done(run: Callable[[], Awaitable[object]]) -> CommandResult:
            await run()
            return CommandResult(0, "", "")

        async def step(name: str, run: Callable[[], Awaitable[object]]) -> str:
            """A step of a drain or undrain, audited as a command is; '' or what went wrong."""
            try:
                await run_on(lambda _: done(run), name)
            except Exception as exc:  # the store, the hook or the bus: the outcome says which
                return str(exc) or type(exc).__name__
            return ""

        @contextlib.asynccontextmanager
        async def node(at: str | None = None) -> AsyncIterator[Node]:
            async with self._executor.session(at or request.node_id) as session:
                yield Node(lambda command, **stdin: run_on(session.run, command, **stdin), self._settings.verify_timeout_s, asyncio.sleep,
                           time.monotonic, service_manager=session.address.service_manager, gpumedic_dir=session.address.gpumedic_dir)

        means = Means(
            actions=self._gate.actions, node=node, request=request, step=step, admin_token=lambda: self._admin_token(request.operation),
            provider=self.provider, task_db=self.task_db, scheduler=self.scheduler, preflight=self._gate.preflight, checkpoint=checkpoint,
            rollout=rollout,
        )
        try:
            catalogue.render(request.operation, means.actions)  # refuse bad parameters before connecting
            await still_working()
            result = await catalogue.perform(request.operation, means)
            result.steps, result.audit = steps, audit
            return result
        except (InvalidParameter, InventoryError, NodeError) as exc:
            # A node lost mid-action may have run some commands: say how far it got.
            where = f" (after {len(steps)} command(s), the last `{steps[-1]}`)" if steps else ""
            return ExecutionResult(ActionOutcome.FAILED, f"{exc}{where}", steps, audit)
        except Exception as exc:
            log.exception("action %s on %s failed unexpectedly", request.action_id, request.node_id)
            return ExecutionResult(ActionOutcome.FAILED, f"internal error after {len(steps)} command(s): {exc!r}", steps, audit)


def audit_entry(command: str, result: CommandResult | None, at_s: float, took_s: float, *, error: str = "") -> dict:
    """One command's line in the audit log. The output is kept as a SHA-256 digest and a size, which
    prove what a node answered without keeping what it said."""
    entry: dict = {"command": command, "at_ms": round(at_s * 1000, 1), "took_ms": round(took_s * 1000, 1)}
    if result is None:
        entry.update(exit_status=None, error=error[:300])
        return entry
    output = result.stdout.encode() + b"\0" + result.stderr.encode()
    entry.update(
        exit_status=result.exit_status,
        output_sha256=hashlib.sha256(output).hexdigest(),
        stdout_bytes=len(result.stdout.encode()),
        stderr_bytes=len(result.stderr.encode()),
    )
    return entry


def answer_key(record: ActionRecord) -> str:
    """What a ledger row's answer events derive their ids from: its action id and request, so that
    the answer to a forgery refused under a real request's action id does not stand (as its
    duplicate) for the real answer that comes later."""
    return f"{record.action_id}:{record.request_sha256[:16]}" if record.request_sha256 else record.action_id


def retired_events(request: ActionRequested, record: ActionRecord) -> list[NodeRetired]:
    """The workers a succeeded terminate_worker ended, or whose record mark_worker_ended closed: gone
    for good. The same events whenever re-published (their ids derive from the action's)."""
    operation = request.operation
    if record.status != ActionOutcome.SUCCEEDED.value:
        return []
    return [
        NodeRetired(
            event_id=uuid.uuid5(_COMPLETED_NAMESPACE, f"{answer_key(record)}:retired:{worker_id}"), source=SERVICE, node_id=worker_id,
            incident_id=request.incident_id, action_id=uuid.UUID(record.action_id), reason=f"{operation.operation}: {_clip(record.detail)}"[:1000],
        )
        for worker_id in catalogue.spec_of(operation).retires(operation)
    ]


def completed_event(record: ActionRecord) -> ActionCompleted:
    """The result event for a finished ledger record: the same event whenever it is re-published."""
    steps = list(record.steps or [])
    if len(steps) > MAX_EVENT_STEPS:
        # The ledger keeps every command; the event carries the first ones and says so.
        steps = [*steps[: MAX_EVENT_STEPS - 1], f"... and {len(steps) - MAX_EVENT_STEPS + 1} more (see the ledger)"]
    return ActionCompleted(
        event_id=uuid.uuid5(_COMPLETED_NAMESPACE, answer_key(record)),
        occurred_at=record.finished_at or datetime.now(UTC),
        source=SERVICE,
        action_id=uuid.UUID(record.action_id),
        incident_id=uuid.UUID(record.incident_id),
        node_id=record.node_id,
        attempt=record.attempt,
        outcome=ActionOutcome(record.status),
        detail=_clip(record.detail),
        steps=tuple(steps),
        request_sha256=record.request_sha256 or None,
        in_use=bool(record.in_use),
    )


def register(
    runtime: ServiceRuntime,
    settings: Settings,
    *,
    gate: Gate,
    sessions: async_sessionmaker[AsyncSession],
    executor: SshExecutor,
    hook_url: str | None,
    provider: Provider | None,
    task_db: TaskDatabase | None,
) -> tuple[ActionHandler, EventConsumer[ActionRequested]]:
    """Attach the action handler to the remediator's durable consumer. `hook_url` is the policy's
    drain hook; `provider` and `task_db` what workers and tasks are acted on through (None: not configured)."""

    async def publish(event: Event, msg_id: str) -> None:
        await publish_event(runtime.broker, event, msg_id=msg_id)

    scheduler = StoreScheduler(
        sessions=sessions,
        publish=publish,
        hook_url=hook_url,
        hook_token=settings.hook_token,
    )
    handler = ActionHandler(
        settings=settings, gate=gate, runtime=runtime, sessions=sessions, executor=executor, tracer=runtime.tracer, scheduler=scheduler,
        provider=provider, task_db=task_db,
    )
    # The consumer's batch is how many requests this instance handles at once.
    # While the store (the ledger) is down, requests wait in JetStream: none runs unrecorded, none is dead-lettered.
    consumer = runtime.consume(DURABLE, handler.handle, batch_size=settings.max_concurrent_actions, waits_on=(StoreUnavailable,))

    async def watch_breaker() -> None:
        """A reset (`gpumedic breaker reset`) or a trip by another instance shows without a request."""
        while True:
            try:
                async with sessions() as session:
                    trip = await breaker.open_trip(session=session)
                handler.breaker_open.set(0 if trip is None else 1)
                handler.paused.set(1 if trip is not None and trip.reason.startswith(breaker.PAUSED_BY) else 0)
            except Exception as exc:  # the store may be down a moment; the gauge keeps its last value
                log.debug("breaker gauge not refreshed: %r", exc)
            await asyncio.sleep(BREAKER_GAUGE_EVERY_S)

    runtime.background(watch_breaker)

    async def leader_checked(check: ClusterChecked) -> None:
        handler.leaders.observe(check)

    runtime.follow(ClusterChecked, leader_checked)

    async def newest_check() -> None:
        """The newest stored check, so that a leader is known before leader-health's next round."""
        try:
            check = await runtime.latest(ClusterChecked)
        except EventDecodeError as exc:  # leader-health's next check will do
            log.warning("the newest stored cluster check does not validate: %s", exc.reason)
            return
        if isinstance(check, ClusterChecked):
            handler.leaders.observe(check)

    runtime.on_startup(newest_check)
    return handler, consumer


BREAKER_GAUGE_EVERY_S = 15.0


def _would_run(request: ActionRequested, gate: Gate) -> str:
    try:
        return f"would run: {'; '.join(catalogue.render(request.operation, gate.actions))}"
    except InvalidParameter as exc:
        return f"would refuse: {exc}"


def _first_error(exc: ValidationError) -> str:
    error = exc.errors()[0]
    return f"{'.'.join(map(str, error['loc'])) or 'the document'}: {error['msg']}"[:300]


def _clip(text: str) -> str:
    return text if len(text) <= MAX_DETAIL else f"{text[: MAX_DETAIL - 3]}..."
