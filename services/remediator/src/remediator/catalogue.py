"""The closed catalogue: the only commands the remediator ever runs on a node.

Each typed operation renders to a fixed set of simple commands, built here from validated
parameters and quoted with `shlex.quote` even after validation, so no value from a message can
become shell syntax on a node. There is no free-form shell anywhere. A simulated node's SSH
server interprets exactly these command forms, and a real Linux node runs them unchanged:
changing a form here means changing the simulated fleet too.

Killing a GPU holder is a check-then-act sequence. First the GPU must still be in the state
the incident describes: `nvidia-smi` on the node must show its utilisation at or under the
request's `max_gpu_utilization_pct`, else the job came back to life and nothing is touched.
Before each signal, `/proc/PID/stat` must still show the start time the detector saw (else the
pid was recycled and now belongs to an innocent process) and `/proc/PID/cmdline` the command
line it saw; a target that lacks either is refused before anything runs. After the signal the
process must vanish (or become a zombie, which holds nothing) within the verify timeout.
"""

from __future__ import annotations

import asyncio
import shlex
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import NamedTuple

from gpumedic_events import ActionOutcome, KillGpuProcesses, ProcessTarget

MIN_PID = 2
MAX_PID = 4_194_304
"""Linux's PID_MAX_LIMIT; pid 1 (init) is never a target."""
MAX_GPU_INDEX = 63
SIGNALS = frozenset({"KILL", "TERM"})
VERIFY_POLL_S = 0.5

_STATE_FIELD = 0
_STARTTIME_FIELD = 19
"""Indexes into the fields after the comm's closing ')': field 3 (state) and field 22 (starttime)."""


class InvalidParameter(ValueError):
    """A parameter an operation cannot take; nothing is rendered, nothing runs."""


class CommandResult(NamedTuple):
    exit_status: int
    stdout: str
    stderr: str


Runner = Callable[[str], Awaitable[CommandResult]]
"""Runs one rendered command on the node the action is for."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the kill checks need."""

    pid: int
    comm: str
    state: str
    start_ticks: int


@dataclass
class ExecutionResult:
    """What running an operation did: the outcome, a sentence for a person, every command run."""

    outcome: ActionOutcome
    detail: str
    steps: list[str] = field(default_factory=list)
    audit: list[dict] = field(default_factory=list)
    """Per command run: exit status, output digest, timing (filled in by whoever ran the commands)."""


def validate_pid(value: object) -> int:
    """A pid as an int in 2..4194304; strings, bools, floats and init are refused."""
    # bool is an int subclass; True must not become pid 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"pid must be an integer, not {type(value).__name__} {_short(value)}")
    if not MIN_PID <= value <= MAX_PID:
        raise InvalidParameter(f"pid {value} is out of range {MIN_PID}..{MAX_PID} (pid 1 is never a target)")
    return value


def validate_gpu_index(value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_GPU_INDEX:
        raise InvalidParameter(f"GPU index {_short(value)} is not an integer in 0..{MAX_GPU_INDEX}")
    return value


def validate_signal(value: object) -> str:
    if not isinstance(value, str) or value not in SIGNALS:
        raise InvalidParameter(f"signal {_short(value)} is not allowed (allowed: {', '.join(sorted(SIGNALS))})")
    return value


def stat_command(pid: object) -> str:
    return f"cat /proc/{shlex.quote(str(validate_pid(pid)))}/stat"


def cmdline_command(pid: object) -> str:
    return f"cat /proc/{shlex.quote(str(validate_pid(pid)))}/cmdline"


def kill_command(signal: object, pid: object) -> str:
    return f"kill -s {shlex.quote(validate_signal(signal))} {shlex.quote(str(validate_pid(pid)))}"


def gpu_utilization_command(gpu_index: object) -> str:
    """One line on stdout: the GPU's utilisation in percent (NVML's, as nvidia-smi reports it)."""
    index = shlex.quote(str(validate_gpu_index(gpu_index)))
    return f"nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id={index}"


def render(operation: KillGpuProcesses) -> tuple[str, ...]:
    """Every distinct command the operation may run, in first-run order; validates all parameters.

    Called before anything runs, so a bad parameter refuses the whole action up front; observe
    mode reports these as what would have run.
    """
    if not isinstance(operation, KillGpuProcesses):
        raise InvalidParameter(f"operation {type(operation).__name__} is not in the catalogue")
    signal = validate_signal(operation.signal)
    if operation.max_gpu_utilization_pct is None:
        raise InvalidParameter(
            "the request does not say in which GPU state the kill is safe (max_gpu_utilization_pct); refusing"
        )
    commands: list[str] = [gpu_utilization_command(operation.gpu_index)]
    seen: set[int] = set()
    for target in operation.targets:
        pid = validate_pid(target.pid)
        if pid in seen:
            raise InvalidParameter(f"pid {pid} is listed twice")
        if target.start_ticks is None or not target.command.strip():
            missing = "start time" if target.start_ticks is None else "command line"
            raise InvalidParameter(
                f"pid {pid} comes without its {missing}: a process is identified by pid, start time and "
                "command line, and a pid alone may name an innocent process"
            )
        seen.add(pid)
        commands += [stat_command(pid), cmdline_command(pid), kill_command(signal, pid)]
    return tuple(commands)


def parse_utilization(text: str) -> int:
    """nvidia-smi's one-line answer as a percentage; '[N/A]' and the like raise ValueError."""
    value = int(text.strip())
    if not 0 <= value <= 100:
        raise ValueError(f"utilisation {value} is not a percentage")
    return value


def parse_stat(text: str) -> ProcStat:
    """Parse one /proc/PID/stat line.

    The comm field is in parentheses and may itself contain spaces and parentheses (a process
    can name itself anything), so the fixed fields start after the LAST ')'.
    """
    head, sep, tail = text.strip().rpartition(")")
    pid_text, open_paren, comm = head.partition("(")
    fields = tail.split()
    if not sep or not open_paren or len(fields) <= _STARTTIME_FIELD:
        raise ValueError(f"not a /proc/PID/stat line: {_short(text)}")
    try:
        return ProcStat(
            pid=int(pid_text.strip()),
            comm=comm,
            state=fields[_STATE_FIELD],
            start_ticks=int(fields[_STARTTIME_FIELD]),
        )
    except ValueError:
        raise ValueError(f"not a /proc/PID/stat line: {_short(text)}") from None


def parse_cmdline(text: str) -> str:
    """NUL-separated arguments joined with spaces, as the detector reports a command line."""
    return " ".join(text.split("\0")).strip()


async def execute(
    operation: KillGpuProcesses,
    run: Runner,
    *,
    verify_timeout_s: float,
    sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    clock: Callable[[], float] = time.monotonic,
) -> ExecutionResult:
    """Run one operation through `run`; raises only what `run` raises (the node's errors)."""
    render(operation)
    return await _KillRun(operation, run, verify_timeout_s, sleep, clock).go()


class _KillRun:
    """One kill_gpu_processes action: check and signal each target in turn, then verify."""

    def __init__(self, operation: KillGpuProcesses, run: Runner, verify_timeout_s: float, sleep, clock) -> None:
        self._op = operation
        self._run_command = run
        self._verify_timeout_s = verify_timeout_s
        self._sleep = sleep
        self._clock = clock
        self.steps: list[str] = []
        self._gone: list[int] = []
        self._killed: list[int] = []
        self._verified: list[int] = []
        self._problems: list[str] = []

    async def _run(self, command: str) -> CommandResult:
        self.steps.append(command)
        return await self._run_command(command)

    async def go(self) -> ExecutionResult:
        if refusal := await self._gpu_state_refusal():
            return ExecutionResult(outcome=ActionOutcome.BLOCKED, detail=refusal, steps=self.steps)
        for target in self._op.targets:
            # Check and signal one target at a time: the gap between the check and the kill,
            # in which a pid could be recycled, stays as short as one round trip.
            await self._check_and_kill(target)
        await self._verify()
        return self._result()

    async def _gpu_state_refusal(self) -> str:
        """Why the GPU is not in the state the incident describes ('' when it is): nothing is killed then."""
        gpu, limit = self._op.gpu_index, self._op.max_gpu_utilization_pct
        result = await self._run(gpu_utilization_command(gpu))
        try:
            if result.exit_status != 0:
                # nvidia-smi reports its own failures on stdout
                raise ValueError(_short(result.stderr.strip() or result.stdout.strip() or f"exit status {result.exit_status}"))
            utilization = parse_utilization(result.stdout)
        except ValueError as exc:
            return f"refused: GPU {gpu}'s utilisation cannot be read on the node ({exc}); nothing is killed blind"
        if utilization > limit:
            return (
                f"refused: GPU {gpu} is busy again ({utilization}% > {limit}%), so the job is not the zombie the "
                "incident describes; nothing was killed"
            )
        return ""

    async def _check_and_kill(self, target: ProcessTarget) -> None:
        pid = target.pid
        stat = await self._stat(pid)
        if stat is None or stat.state == "Z":
            self._gone.append(pid)
            return
        if stat.start_ticks != target.start_ticks:
            self._problems.append(
                f"refused {pid}: start time {stat.start_ticks} != expected {target.start_ticks} "
                f"(the pid was recycled; now {stat.comm!r})"
            )
            return
        expected = target.command.strip()
        result = await self._run(cmdline_command(pid))
        if result.exit_status != 0:
            self._gone.append(pid)  # it exited between the two reads
            return
        actual = parse_cmdline(result.stdout)
        if actual != expected:
            self._problems.append(f"refused {pid}: command line {_short(actual)} != expected {_short(expected)}")
            return
        result = await self._run(kill_command(self._op.signal, pid))
        if result.exit_status != 0:
            after = await self._stat(pid)
            if after is None or after.state == "Z":
                self._gone.append(pid)
            else:
                reason = result.stderr.strip() or f"exit status {result.exit_status}"
                self._problems.append(f"kill -s {self._op.signal} {pid} failed: {_short(reason)}")
            return
        self._killed.append(pid)

    async def _stat(self, pid: int) -> ProcStat | None:
        """The process's stat, or None when it no longer exists."""
        result = await self._run(stat_command(pid))
        if result.exit_status != 0:
            return None
        return parse_stat(result.stdout)

    async def _verify(self) -> None:
        alive = list(self._killed)
        deadline = self._clock() + self._verify_timeout_s
        while alive:
            still = []
            for pid in alive:
                stat = await self._stat(pid)
                if stat is not None and stat.state != "Z":
                    still.append(pid)
            alive = still
            if not alive or self._clock() >= deadline:
                break
            await self._sleep(VERIFY_POLL_S)
        self._verified = [pid for pid in self._killed if pid not in alive]
        for pid in alive:
            self._problems.append(f"pid {pid} still alive after {self._verify_timeout_s:g}s of SIG{self._op.signal}")

    def _result(self) -> ExecutionResult:
        parts = []
        if self._killed:
            parts.append(f"sent {self._op.signal} to {', '.join(map(str, self._killed))}")
        if self._verified:
            parts.append(f"verified gone: {', '.join(map(str, self._verified))}")
        if self._gone:
            parts.append(f"already gone: {', '.join(map(str, self._gone))}")
        parts.extend(self._problems)
        outcome = ActionOutcome.FAILED if self._problems else ActionOutcome.SUCCEEDED
        return ExecutionResult(outcome=outcome, detail="; ".join(parts), steps=self.steps)


def _short(value: object, limit: int = 120) -> str:
    text = repr(value)
    return text if len(text) <= limit else f"{text[:limit]}..."
