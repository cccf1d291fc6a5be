"""Pre-flight for job launchers: are a node's GPUs ready for the next job, and if only leftovers are
in the way, clean them through the gate; if only memory no process owns, reset the GPU through it.

The remediator answers because it alone may log in to nodes. The check is read-only
(`catalogue.preflight`); with `deep`, DCGM's diagnostics run too (`catalogue.diag`), and only once
every GPU checked is free: they load the GPUs. A clean is one `kill_gpu_processes` per GPU, built from what the node
shows now (never from what the asker says: an asker names a node and GPUs, not pids), only on a
GPU that is idle, and run through `ActionHandler.run_gated`: the breaker, protected nodes, one
action per node, the per-node cap and observe mode all apply, and the ledger records it under the
check's id (`gpumedic actions`). Then the GPUs are looked at again, and that look is the answer. A
reset (`reset`, runbook 003's "GPU state not reset" between container restarts) goes the same way,
one `gpu_reset` per GPU that nothing uses or holds yet keeps memory in use; not asked, the report
offers it for such a GPU.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid

from opentelemetry.trace import Tracer

from gpumedic_events import ActionOutcome, ActionRequested, EventDecodeError, GpuReset, KillGpuProcesses, PreflightReport, PreflightRequest
from gpumedic_incidents.policy import Policy
from gpumedic_nodes.inventory import InventoryError
from gpumedic_nodes.ssh import NodeError, SshExecutor
from gpumedic_telemetry import NODE_ID
from remediator.catalogue import diag, preflight
from remediator.catalogue.base import Node
from remediator.handlers import SERVICE, ActionHandler

log = logging.getLogger(__name__)


class Preflight:
    def __init__(
        self, *, policy: Policy, executor: SshExecutor, actions: ActionHandler, tracer: Tracer, verify_timeout_s: float
    ) -> None:
        self._policy = policy
        self._executor = executor
        self._actions = actions
        self._tracer = tracer
        self._verify_timeout_s = verify_timeout_s

    async def handle(self, body: bytes) -> bytes:
        """One request's bytes in, the report's bytes out; a malformed request gets a report that says why."""
        try:
            request = PreflightRequest.from_json(body)
        except EventDecodeError as exc:
            return PreflightReport(
                check_id=uuid.uuid4(), node_id="invalid", ready=False, error=f"invalid pre-flight request: {exc.reason}"
            ).to_json()
        return (await self.check(request)).to_json()

    async def check(self, request: PreflightRequest) -> PreflightReport:
        check_id = uuid.uuid4()
        started = time.monotonic()
        with self._tracer.start_as_current_span("preflight", attributes={NODE_ID: request.node_id}) as span:
            try:
                looks = await self._look(request)
                cleaned: list[str] = []
                if request.clean and any(not look.readiness.ready for look in looks):
                    cleaned = await self._clean(request, check_id, looks)
                    looks = await self._look(request)
                reset: list[str] = []
                if request.reset and any(not look.readiness.ready for look in looks):
                    reset = await self._reset(request, check_id, looks)
                    looks = await self._look(request)
                diagnostics = await self._diagnose(request, looks) if request.deep else None
                host = await self._host(request)
            except (InventoryError, NodeError, preflight.NoGpuState) as exc:
                return self._report(request, check_id, started, error=str(exc))
            except Exception as exc:
                log.exception("pre-flight of %s failed unexpectedly", request.node_id)
                return self._report(request, check_id, started, error=f"internal error: {exc!r}")
            report = self._report(request, check_id, started, looks=looks, cleaned=cleaned, reset=reset, diagnostics=diagnostics, host=host)
            span.set_attribute("gpumedic.preflight.ready", report.ready)
            log.info("pre-flight %s of %s for %s: %s", check_id, request.node_id, request.requested_by, "ready" if report.ready else "not ready")
            return report

    async def _look(self, request: PreflightRequest) -> list[preflight.GpuLook]:
        async with self._executor.session(request.node_id) as session:
            node = Node(session.run, self._verify_timeout_s, asyncio.sleep, time.monotonic)
            return await preflight.inspect(node, request.gpus, self._policy.preflight)

    async def _host(self, request: PreflightRequest) -> list[str]:
        async with self._executor.session(request.node_id) as session:
            node = Node(session.run, self._verify_timeout_s, asyncio.sleep, time.monotonic)
            return await preflight.host_problems(node, self._policy.preflight)

    async def _diagnose(self, request: PreflightRequest, looks: list[preflight.GpuLook]) -> diag.Verdict:
        if not looks or any(not look.readiness.ready for look in looks):
            return diag.Verdict(False, False, "DCGM diagnostics not run: they load the GPUs, and not every GPU checked is free")
        rule = self._policy.actions.undrain_node
        async with self._executor.session(request.node_id) as session:
            node = Node(session.run, self._verify_timeout_s, asyncio.sleep, time.monotonic)
            return await diag.run(node, rule.dcgm_diag or 1, rule.dcgm_diag_timeout_s)

    async def _clean(self, request: PreflightRequest, check_id: uuid.UUID, looks: list[preflight.GpuLook]) -> list[str]:
        """One gated kill per GPU whose only trouble is leftovers on an idle GPU; a line per GPU."""
        lines = []
        rules = self._policy.preflight
        for look in looks:
            gpu = look.readiness
            if gpu.ready:
                continue
            if why_not := preflight.refusal_to_clean(look, rules):
                lines.append(why_not)
                continue
            async with self._executor.session(request.node_id) as session:
                node = Node(session.run, self._verify_timeout_s, asyncio.sleep, time.monotonic)
                targets = await preflight.identify(node, list(look.processes))
            if not targets:
                lines.append(f"GPU {gpu.index}: its leftovers exited by themselves")
                continue
            action = ActionRequested(
                source=SERVICE,
                action_id=uuid.uuid4(),
                incident_id=check_id,
                node_id=request.node_id,
                attempt=1,
                operation=KillGpuProcesses(
                    gpu_index=gpu.index,
                    targets=tuple(targets),
                    signal="TERM",
                    grace_s=self._policy.actions.kill_gpu_processes.grace_s,
                    max_gpu_utilization_pct=rules.idle_util_pct,
                ),
                reason=f"pre-flight --clean by {request.requested_by}: leftovers on idle GPU {gpu.index}",
            )
            record = await self._actions.run_gated(action, "", _keep_going)
            outcome = "cleaned" if record.status == ActionOutcome.SUCCEEDED else f"not cleaned ({record.status})"
            lines.append(f"GPU {gpu.index}: {outcome}: {record.detail} [action {record.action_id}]")
        return lines

    async def _reset(self, request: PreflightRequest, check_id: uuid.UUID, looks: list[preflight.GpuLook]) -> list[str]:
        """One gated reset per GPU that nothing uses or holds but that keeps memory in use; a line per GPU not ready."""
        lines = []
        for look in looks:
            if look.readiness.ready:
                continue
            if why_not := preflight.refusal_to_reset(look, self._policy.preflight):
                lines.append(why_not)
                continue
            index = look.readiness.index
            action = ActionRequested(
                source=SERVICE, action_id=uuid.uuid4(), incident_id=check_id, node_id=request.node_id, attempt=1,
                operation=GpuReset(gpu_index=index),
                reason=f"pre-flight --reset by {request.requested_by}: {look.readiness.memory_used_mib} MiB in use on GPU {index} "
                "with nothing using or holding it",
            )
            record = await self._actions.run_gated(action, "", _keep_going)
            outcome = "reset" if record.status == ActionOutcome.SUCCEEDED else f"not reset ({record.status})"
            lines.append(f"GPU {index}: {outcome}: {record.detail} [action {record.action_id}]")
        return lines

    def _report(
        self,
        request: PreflightRequest,
        check_id: uuid.UUID,
        started: float,
        *,
        looks: list[preflight.GpuLook] | None = None,
        cleaned: list[str] | None = None,
        reset: list[str] | None = None,
        diagnostics: diag.Verdict | None = None,
        host: list[str] | None = None,
        error: str = "",
    ) -> PreflightReport:
        gpus = tuple(look.readiness for look in looks or ())
        if not error and not gpus:
            error = "the node shows no GPU"
        return PreflightReport(
            check_id=check_id,
            node_id=request.node_id,
            ready=not error and all(g.ready for g in gpus) and not host
            and not (diagnostics is not None and diagnostics.ran and not diagnostics.passed),
            gpus=gpus,
            host_problems=tuple(p[:300] for p in host or ()),
            cleaned=tuple(cleaned or ()),
            reset=tuple(reset or ()),
            resettable=() if reset else tuple(
                look.readiness.index for look in looks or () if not look.readiness.ready
                and not preflight.refusal_to_reset(look, self._policy.preflight)
            ),
            diagnostics=diagnostics.summary[:2000] if diagnostics is not None else "",
            error=error[:2000],
            took_ms=round((time.monotonic() - started) * 1000, 1),
        )


async def _keep_going() -> None:
    """No JetStream delivery to keep alive: the asker waits for the answer."""
