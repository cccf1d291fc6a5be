"""Fleet operations: one operation on many nodes, batch by batch, each action through the gate.

The operator names the nodes by selectors over the inventory (a node, `group:NAME`,
`label:KEY=VALUE`); they are taken in node-id order, `batch` at a time. Every node's action is an
`ActionRequested` of its own run through `ActionHandler.run_gated`: protected nodes, the unit's
allow-list and node scope, one action per node, the per-node cap, observe mode and the breaker all
apply, and the ledger records it under the rollout's id (`gpumedic actions`). A batch's actions
run at once; each is verified as the catalogue verifies it (a restarted unit active and healthy,
a drain the scheduler's), and the next batch starts only when all of them succeeded. Before each
batch the rollout checks that it would not take the breaker past its limit, and stops if it
would: a rollout never trips the breaker itself. A node a person silenced whole (a maintenance
window: `gpumedic silence --node N`) is left alone and said so. A dry run resolves the nodes and renders each
command, says where the gate would refuse (a protected node, the unit's node scope, observe
mode) and before which batch the breaker would stop the real run, and runs nothing. A drain by a
rollout is the operators' hold: any rollout's undrain gives it back, and a fleet-wide drain
counts against the breaker as a fix does.
"""

from __future__ import annotations

import asyncio
import time
import uuid

from opentelemetry.trace import Tracer

from gpumedic_events import (
    ActionOutcome,
    ActionRequested,
    DrainNode,
    EventDecodeError,
    RestartUnit,
    RolloutReport,
    RolloutRequest,
    RolloutStep,
    TerminateWorker,
    UndrainNode,
)
from gpumedic_incidents.policy import NodeSelector, Policy, selects
from gpumedic_nodes.inventory import InventoryError, load_inventory
from gpumedic_providers.base import ProviderError
from gpumedic_telemetry import NODE_ID
from remediator.catalogue import render
from remediator.catalogue.base import InvalidParameter
from remediator.gate import Verdict
from remediator.handlers import SERVICE, ActionHandler


class Rollout:
    def __init__(self, *, policy: Policy, actions: ActionHandler, tracer: Tracer) -> None:
        self._policy = policy
        self._actions = actions
        self._tracer = tracer

    async def handle(self, body: bytes) -> bytes:
        """One request's bytes in, the report's bytes out (within a message's size); a malformed
        request gets a report that says why."""
        try:
            request = RolloutRequest.from_json(body)
        except EventDecodeError as exc:
            return RolloutReport(rollout_id=uuid.uuid4(), operation="invalid", error=f"invalid rollout request: {exc.reason}").to_json()
        return (await self.run(request)).fitted().to_json()

    async def run(self, request: RolloutRequest) -> RolloutReport:
        rollout_id = uuid.uuid4()
        started = time.monotonic()
        report = RolloutReport(rollout_id=rollout_id, operation=request.operation, dry_run=request.dry_run)
        with self._tracer.start_as_current_span("rollout", attributes={"gpumedic.rollout.operation": request.operation}) as span:
            try:
                nodes = await self._workers(request) if request.operation == "terminate_worker" else self._nodes(request)
                operation = _operation(request, nodes[0])
                render(operation, self._policy.actions)  # a unit off the allow-list is said before anything runs
            except (InventoryError, InvalidParameter, ProviderError, ValueError) as exc:
                return report.model_copy(update={"error": str(exc)[:2000], "took_ms": _ms(started)})
            batches = tuple(tuple(nodes[i : i + request.batch]) for i in range(0, len(nodes), request.batch))
            report = report.model_copy(update={"batches": batches})
            held = await self._actions.in_maintenance(nodes) if request.operation != "terminate_worker" else {}
            if request.dry_run:
                return await self._dry_run(report, rollout_id, request, operation, batches, held, started)
            steps: list[RolloutStep] = []
            stopped = ""
            for n, batch in enumerate(batches, 1):
                steps += [RolloutStep(batch=n, node_id=node, status="silenced", detail=held[node][:2000]) for node in batch if node in held]
                batch = tuple(node for node in batch if node not in held)  # a person's maintenance window: left alone
                if not batch:
                    continue
                if why := await self._actions.breaker_room(set(batch), operation):
                    stopped = f"before batch {n} of {len(batches)}: {why}; {_left(batches, n - 1)}"
                    break
                records = await asyncio.gather(*(self._act(rollout_id, request, _operation(request, node), node, n) for node in batch))
                steps += [RolloutStep(batch=n, node_id=r.node_id, status=r.status, detail=(r.detail or "")[:2000],
                                      action_id=uuid.UUID(r.action_id)) for r in records]
                failed = [r.node_id for r in records if r.status != ActionOutcome.SUCCEEDED]
                if failed:
                    stopped = f"batch {n} of {len(batches)} did not succeed on {', '.join(failed)}; {_left(batches, n)}"
                    break
            span.set_attribute("gpumedic.rollout.nodes", len(steps))
            return report.model_copy(update={"steps": tuple(steps), "stopped": stopped, "took_ms": _ms(started)})

    async def _dry_run(self, report: RolloutReport, rollout_id: uuid.UUID, request: RolloutRequest, operation,
                       batches: tuple[tuple[str, ...], ...], held: dict[str, str], started: float) -> RolloutReport:
        """Every node's plan, and the batch before which the breaker would stop the real run (each
        batch asked as the real run asks, with the batches before it taken as done)."""
        steps, planned, stopped = [], set(), ""
        for n, batch in enumerate(batches, 1):
            steps += [RolloutStep(batch=n, node_id=node, status="silenced", detail=held[node][:2000]) if node in held
                      else self._plan(rollout_id, request, _operation(request, node), node, n) for node in batch]
            acting = {node for node in batch if node not in held}
            if acting and not stopped and (why := await self._actions.breaker_room(acting, operation, before=planned)):
                stopped = f"the real run would stop before batch {n} of {len(batches)}: {why}; {_left(batches, n - 1)}"
            planned |= acting
        return report.model_copy(update={"steps": tuple(steps), "stopped": stopped, "took_ms": _ms(started)})

    def _nodes(self, request: RolloutRequest) -> list[str]:
        """The inventory's nodes the selectors name, in node-id order."""
        selectors = tuple(NodeSelector(text) for text in request.nodes)
        inventory = load_inventory(self._actions.inventory_path)
        chosen = sorted(node for node, address in inventory.items() if selects(selectors, node, address.group, address.labels))
        if not chosen:
            raise ValueError(f"no node of the inventory matches {', '.join(request.nodes)}")
        return chosen

    def _plan(self, rollout_id: uuid.UUID, request: RolloutRequest, operation, node: str, batch: int) -> RolloutStep:
        """A dry run's step: what would run, or why the gate would not let it (a protected node, the
        unit's node scope, observe mode)."""
        decision = self._actions.standing_verdict(_request(rollout_id, request, operation, node, batch))
        if decision.verdict is Verdict.ALLOW:
            commands = "; ".join(render(operation, self._policy.actions)) or "the scheduler's drain"
            return RolloutStep(batch=batch, node_id=node, status="planned", detail=commands[:2000])
        status = "observed" if decision.verdict is Verdict.OBSERVE else "blocked"
        return RolloutStep(batch=batch, node_id=node, status=status, detail=decision.reason[:2000])

    async def _workers(self, request: RolloutRequest) -> list[str]:
        """The provider's live workers the request names (`all`: every one), in id order."""
        provider = self._actions.provider
        if provider is None:
            raise ValueError("no provider is configured (GPUMEDIC_REMEDIATOR_PROVIDER): there are no workers to end")
        live = sorted(w.worker_id for w in await provider.workers() if w.status not in ("terminated", "stopped"))
        if "all" in request.workers:
            chosen = live
        else:
            unknown = sorted(set(request.workers) - set(live))
            if unknown:
                raise ValueError(f"the provider has no live worker {', '.join(unknown[:10])}")
            chosen = sorted(set(request.workers))
        if not chosen:
            raise ValueError("the provider has no live worker")
        return chosen

    async def _act(self, rollout_id: uuid.UUID, request: RolloutRequest, operation, node: str, batch: int):
        with self._tracer.start_as_current_span("rollout.node", attributes={NODE_ID: node}):
            return await self._actions.run_gated(_request(rollout_id, request, operation, node, batch), "", _keep_going, rollout=True)


def _request(rollout_id: uuid.UUID, request: RolloutRequest, operation, node: str, batch: int) -> ActionRequested:
    return ActionRequested(
        source=SERVICE, action_id=uuid.uuid4(), incident_id=rollout_id, node_id=node, attempt=1, operation=operation,
        reason=f"rollout {request.operation} by {request.requested_by}, batch {batch}",
    )


def _operation(request: RolloutRequest, target: str) -> RestartUnit | DrainNode | UndrainNode | TerminateWorker:
    """The operation on one node (or, for terminate_worker, one worker)."""
    if request.operation == "restart_unit":
        assert request.unit is not None  # the request's own check
        return RestartUnit(unit=request.unit)
    if request.operation == "terminate_worker":
        return TerminateWorker(worker_ids=(target,))
    return DrainNode() if request.operation == "drain_node" else UndrainNode()


def _left(batches: tuple[tuple[str, ...], ...], done: int) -> str:
    rest = [node for batch in batches[done:] for node in batch]
    return f"{len(rest)} node(s) not acted on: {', '.join(rest[:20])}{' ...' if len(rest) > 20 else ''}" if rest else "no node left"


def _ms(started: float) -> float:
    return round((time.monotonic() - started) * 1000, 1)


async def _keep_going() -> None:
    """No JetStream delivery to keep alive: the operator waits for the answer."""
