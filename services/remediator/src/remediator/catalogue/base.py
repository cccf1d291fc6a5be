"""What every operation of the catalogue shares: its errors, results, and the poll that verifies it."""

from __future__ import annotations

import re
import shlex
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from gpumedic_events import ActionOutcome, ActionRequested
from gpumedic_incidents import IncidentState
from gpumedic_incidents.policy import Actions, CheckpointPolicy, PreflightPolicy
from gpumedic_nodes.ssh import CommandResult

if TYPE_CHECKING:
    from gpumedic_providers.base import Provider
    from gpumedic_store import TaskDatabase

VERIFY_POLL_S = 0.5
MAX_GPU_INDEX = 63


class InvalidParameter(ValueError):
    """A parameter an operation cannot take; nothing is rendered, nothing runs."""


Runner = Callable[..., Awaitable[CommandResult]]
"""Runs one rendered command on the node the action is for: `run(command)`, or
`run(command, input=text)` to give it text on stdin (a secret that must stay off the command line),
and `timeout_s=` for a command that takes longer than the node's command timeout."""


Step = Callable[[str, Callable[[], Awaitable[object]]], Awaitable[str]]
"""Runs one named step that is no node command (a drain's, a provider call), audited as a command
is; '' when it worked, else what went wrong."""


@dataclass
class ExecutionResult:
    """What running an operation did: the outcome, a sentence for a person, every command run."""

    outcome: ActionOutcome
    detail: str
    steps: list[str] = field(default_factory=list)
    audit: list[dict] = field(default_factory=list)
    """Per command run: exit status, output digest, timing (filled in by whoever ran the commands)."""
    in_use: bool = False
    """Blocked only because the target is in use: asking again once it is free may succeed."""


@dataclass
class Node:
    """One node as an operation sees it: a command runner that records each step, and a clock."""

    run_command: Runner
    verify_timeout_s: float
    sleep: Callable[[float], Awaitable[None]]
    clock: Callable[[], float]
    steps: list[str] = field(default_factory=list)
    service_manager: str = "systemd"
    """What runs the node's services (the inventory's `service_manager`): restart_unit goes through it."""
    gpumedic_dir: str | None = None
    """Where `gpumedic enroll` put its supervisor on the node (None: ~/.gpumedic)."""

    async def run(self, command: str, *, input: str | None = None, timeout_s: float | None = None) -> CommandResult:
        """`timeout_s`: longer than the node's command timeout, for a command known to take long."""
        self.steps.append(command)
        extra = {k: v for k, v in (("input", input), ("timeout_s", timeout_s)) if v is not None}
        return await self.run_command(command, **extra)

    async def poll(self, check: Callable[[], Awaitable[bool]], timeout_s: float | None = None) -> bool:
        """Call `check` every VERIFY_POLL_S until it is true or the time is up (at least once)."""
        deadline = self.clock() + (self.verify_timeout_s if timeout_s is None else timeout_s)
        while True:
            if await check():
                return True
            if self.clock() >= deadline:
                return False
            await self.sleep(VERIFY_POLL_S)

    async def poll_command(self, command: str, passes: Callable[[CommandResult], bool]) -> tuple[bool, CommandResult]:
        """Run `command` every VERIFY_POLL_S until its result `passes` or the verify timeout ends;
        whether it passed, and its last result."""
        last = CommandResult(-1, "", "")

        async def check() -> bool:
            nonlocal last
            last = await self.run(command)
            return passes(last)

        return await self.poll(check), last

    def result(self, outcome: ActionOutcome, detail: str, *, in_use: bool = False) -> ExecutionResult:
        return ExecutionResult(outcome=outcome, detail=detail, steps=self.steps, in_use=in_use)


def _no_node() -> AbstractAsyncContextManager[Node]:
    raise InvalidParameter("no node session is given to this operation")


async def _unaudited(name: str, run: Callable[[], Awaitable[object]]) -> str:
    try:
        await run()
    except Exception as exc:
        return str(exc) or type(exc).__name__
    return ""


class Scheduler(Protocol):
    """Where drains are kept and told (the store, the hook, the bus): the remediator's side."""

    async def holders(self, node_id: str) -> list[str]:
        """Who holds the node drained: incidents' ids, and `OPERATORS_HOLD` for the rollouts'."""
        ...

    async def hold(self, request: ActionRequested, holder: str) -> None: ...

    async def release(self, request: ActionRequested, holder: str) -> None: ...

    async def tell(self, request: ActionRequested, *, drained: bool) -> None:
        """POST to the policy's hook; raises with the host (never the URL) if it did not take it."""
        ...

    async def publish(self, request: ActionRequested, *, drained: bool) -> None: ...


@dataclass(frozen=True)
class Means:
    """What an operation acts through; the handler hands it over with every step audited. Each
    operation takes what it needs (`need`): a node operation opens the node, a provider's call
    the provider, a drain the scheduler."""

    actions: Actions
    node: Callable[..., AbstractAsyncContextManager[Node]] = lambda at=None: _no_node()
    """An SSH session to the request's node (or to `at`, another node of the inventory), its commands recorded."""
    request: ActionRequested | None = None
    step: Step = _unaudited
    admin_token: Callable[[], str | None] = lambda: None
    provider: Provider | None = None
    task_db: TaskDatabase | None = None
    scheduler: Scheduler | None = None
    preflight: PreflightPolicy = PreflightPolicy()
    """When a GPU is free and healthy (the policy's `preflight`): a new worker's acceptance reads it."""
    checkpoint: CheckpointPolicy | None = None
    """The incident's kind's checkpoint step (`kinds.<kind>.checkpoint`): None, none is asked."""
    rollout: bool = False
    """An operator's fleet operation, run in the remediator's own process (never a request off the
    bus): its drains are the operators' hold (`OPERATORS_HOLD`), not the request's incident's."""

    def need(self, what: str) -> Any:
        """One of request, provider, task_db or scheduler; InvalidParameter says which setting is missing."""
        value = getattr(self, what)
        if value is None:
            raise InvalidParameter(_MISSING[what])
        return value


_MISSING = {
    "request": "no request is given to this operation",
    "provider": "no provider is configured (GPUMEDIC_REMEDIATOR_PROVIDER)",
    "task_db": "no task database is configured (GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE)",
    "scheduler": "no scheduler side is configured for drains",
}


def allowed_name(value: object, pattern: str, allowed: Mapping[str, object], *, what: str, form: str, listed_in: str) -> str:
    """`value` as a name of the policy's allow-list `allowed`: InvalidParameter says whether it is no
    such name at all (`form`) or not on the list (`listed_in`), and which names are."""
    if not isinstance(value, str) or not re.fullmatch(pattern, value):
        raise InvalidParameter(f"{what} {short(value)} is not {form}")
    if value not in allowed:
        names = ", ".join(sorted(allowed)) or "none"
        raise InvalidParameter(f"{what} {value} is not in the policy's {listed_in} (allowed: {names})")
    return value


def validate_gpu_index(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPU_INDEX:
        raise InvalidParameter(f"GPU index {short(value)} is not an integer in 0..{MAX_GPU_INDEX}")
    return value


def quoted(value: object) -> str:
    """A validated value as one shell word: quoted even so, so that no value can become syntax."""
    return shlex.quote(str(value))


def said(result: CommandResult) -> str:
    """What a failed command said, in the node's words (nvidia-smi reports its failures on stdout)."""
    return short(result.stderr.strip() or result.stdout.strip() or f"exit status {result.exit_status}")


def short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."


@dataclass(frozen=True)
class KnownLeader:
    """leader-health's latest check of the peer cluster a node is in (`ClusterChecked`)."""

    cluster: str
    leader: str | None
    """The leader most peers named; None when the check found none."""
    checked_at: datetime


@dataclass(frozen=True)
class Fit:
    """What an operation is checked against before it may run for an incident (each entry's `fits`):
    only the policy and the remediator's own sources, never what the request or its detector says."""

    incident: IncidentState
    rules: Any
    """The policy's rules for the incident's kind (`kinds.<kind>`): the thresholds that make its actions safe."""
    actions: Actions
    now: datetime
    max_age_s: float
    """How old a fact of leader-health's may be and still count (the gate's request age limit)."""
    leader: KnownLeader | None = None
    """leader-health's latest check of the cluster the request's node is in (None: no check names it)."""
    killed: frozenset[str] = frozenset()
    """The nodes where the remediator's own ledger holds a succeeded (verified) kill or job stop for the incident."""

    @property
    def kind(self) -> str:
        return self.incident.kind.value
