"""kill_gpu_processes: signal the processes holding one GPU, each checked to be the one the incident saw.

A check-then-act sequence. First the GPU must still be in the state the incident describes:
`nvidia-smi` on the node must show its utilisation at or under the request's
`max_gpu_utilization_pct`, else the job came back to life and nothing is touched. Each target
must hold that very GPU, as NVML's compute processes or `fuser /dev/nvidiaN` say (else the
request names a process elsewhere, on a GPU that may be busy, and it is refused). Before each
signal, `/proc/PID/stat` must still show the start time the detector saw (else the pid was
recycled and now belongs to an innocent process) and `/proc/PID/cmdline` the command line it
saw; a target that lacks either is refused before anything runs. With SIGTERM and a grace
period, a target still there when the grace ends is checked again and gets SIGKILL. After the
last signal the process must vanish (or become a zombie, which holds nothing) within the verify
timeout.
"""

from __future__ import annotations

from dataclasses import dataclass

from gpumedic_events import ActionOutcome, KillGpuProcesses, ProcessTarget
from gpumedic_events.redact import redact
from gpumedic_incidents.policy import Actions
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, Node, quoted, said, short, validate_gpu_index
from remediator.catalogue.gpu import NO_PROCESS, apps_command, holders_command, parse_pids

MIN_PID = 2
MAX_PID = 4_194_304
"""Linux's PID_MAX_LIMIT; pid 1 (init) is never a target."""
SIGNALS = frozenset({"KILL", "TERM"})

_STATE_FIELD = 0
_STARTTIME_FIELD = 19
"""Indexes into the fields after the comm's closing ')': field 3 (state) and field 22 (starttime)."""


@dataclass(frozen=True)
class ProcStat:
    """The fields of /proc/PID/stat the kill checks need."""

    pid: int
    comm: str
    state: str
    start_ticks: int


def validate_pid(value: object) -> int:
    """A pid as an int in 2..4194304; strings, bools, floats and init are refused."""
    # bool is an int subclass; True must not become pid 1.
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidParameter(f"pid must be an integer, not {type(value).__name__} {short(value)}")
    if not MIN_PID <= value <= MAX_PID:
        raise InvalidParameter(f"pid {value} is out of range {MIN_PID}..{MAX_PID} (pid 1 is never a target)")
    return value


def validate_signal(value: object) -> str:
    if not isinstance(value, str) or value not in SIGNALS:
        raise InvalidParameter(f"signal {short(value)} is not allowed (allowed: {', '.join(sorted(SIGNALS))})")
    return value


def stat_command(pid: object) -> str:
    return f"cat /proc/{quoted(validate_pid(pid))}/stat"


def cmdline_command(pid: object) -> str:
    return f"cat /proc/{quoted(validate_pid(pid))}/cmdline"


def kill_command(signal: object, pid: object) -> str:
    return f"kill -s {quoted(validate_signal(signal))} {quoted(validate_pid(pid))}"


def gpu_utilization_command(gpu_index: object) -> str:
    """One line on stdout: the GPU's utilisation in percent (NVML's, as nvidia-smi reports it)."""
    return f"nvidia-smi --query-gpu=utilization.gpu --format=csv,noheader,nounits --id={quoted(validate_gpu_index(gpu_index))}"


def render(operation: KillGpuProcesses, actions: Actions | None = None) -> tuple[str, ...]:
    signal = validate_signal(operation.signal)
    if operation.max_gpu_utilization_pct is None:
        raise InvalidParameter(
            "the request does not say in which GPU state the kill is safe (max_gpu_utilization_pct); refusing"
        )
    escalates = signal == "TERM" and operation.grace_s > 0
    commands: list[str] = [gpu_utilization_command(operation.gpu_index), apps_command(operation.gpu_index),
                           holders_command(operation.gpu_index)]
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
        if escalates:
            commands.append(kill_command("KILL", pid))
    return tuple(commands)


def fits(operation: KillGpuProcesses, fit: Fit) -> str:
    """A kill runs only on a GPU below the kind's idle threshold, with the policy's signal and grace."""
    limit = getattr(fit.rules, "idle_below_pct", None)
    if limit is None:
        return f"kinds.{fit.kind} sets no idle_below_pct, the GPU state a kill is safe in"
    if operation.max_gpu_utilization_pct is None or operation.max_gpu_utilization_pct >= limit:
        return (
            f"the kill would run on a GPU up to {operation.max_gpu_utilization_pct}% busy, not below the policy's "
            f"kinds.{fit.kind}.idle_below_pct ({limit}%)"
        )
    grace = fit.actions.kill_gpu_processes.grace_s
    if (operation.signal, operation.grace_s) != ("TERM", grace):
        return (
            f"the kill asks SIG{operation.signal} with {operation.grace_s:g}s grace; the policy's "
            f"actions.kill_gpu_processes is SIGTERM with {grace:g}s grace"
        )
    return ""


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
        raise ValueError(f"not a /proc/PID/stat line: {short(text)}")
    try:
        return ProcStat(
            pid=int(pid_text.strip()),
            comm=comm,
            state=fields[_STATE_FIELD],
            start_ticks=int(fields[_STARTTIME_FIELD]),
        )
    except ValueError:
        raise ValueError(f"not a /proc/PID/stat line: {short(text)}") from None


def parse_cmdline(text: str) -> str:
    """NUL-separated arguments joined with spaces, as the detector reports a command line."""
    return " ".join(text.split("\0")).strip()


async def execute(operation: KillGpuProcesses, node: Node, means: Means) -> ExecutionResult:
    return await _KillRun(operation, node).go()


async def gpu_state_refusal(node: Node, operation: KillGpuProcesses) -> str:
    """Why the GPU is not in the state the incident describes ('' when it is): nothing is killed then."""
    gpu, limit = operation.gpu_index, operation.max_gpu_utilization_pct
    result = await node.run(gpu_utilization_command(gpu))
    try:
        if result.exit_status != 0:
            raise ValueError(said(result))
        utilization = parse_utilization(result.stdout)
    except ValueError as exc:
        return f"refused: GPU {gpu}'s utilisation cannot be read on the node ({exc}); nothing is killed blind"
    if limit is not None and utilization > limit:
        return (
            f"refused: GPU {gpu} is busy again ({utilization}% > {limit}%), so the job is not the zombie the "
            "incident describes; nothing was killed"
        )
    return ""


class _KillRun:
    """One kill_gpu_processes action: check and signal each target in turn, escalate, then verify."""

    def __init__(self, operation: KillGpuProcesses, node: Node) -> None:
        self._op = operation
        self._node = node
        self._gone: list[int] = []
        self._signalled: list[int] = []
        self._escalated: list[int] = []
        self._verified: list[int] = []
        self._problems: list[str] = []

    async def go(self) -> ExecutionResult:
        if refusal := await self._gpu_state_refusal():
            return self._node.result(ActionOutcome.BLOCKED, refusal)
        holders, unread = await self._holders()
        if holders is None:
            return self._node.result(ActionOutcome.BLOCKED, unread)
        for target in self._op.targets:
            if target.pid not in holders:
                await self._not_a_holder(target.pid, unread)
                continue
            # Check and signal one target at a time: the gap between the check and the kill,
            # in which a pid could be recycled, stays as short as one round trip.
            if await self._identified(target) and await self._signal(target.pid, self._op.signal):
                self._signalled.append(target.pid)
        survivors = self._signalled
        if self._op.signal == "TERM" and self._op.grace_s > 0 and survivors:
            survivors = await self._wait_gone(survivors, self._op.grace_s)
            started = {t.pid: t.start_ticks for t in self._op.targets}
            for pid in survivors:
                # The same pid and start time are the same process; anything else means it exited
                # since the last look (and its pid may name another process by now).
                stat = await self._stat(pid)
                if stat is None or stat.state == "Z" or stat.start_ticks != started[pid]:
                    continue
                if await self._signal(pid, "KILL"):
                    self._escalated.append(pid)
            survivors = self._escalated
        alive = await self._wait_gone(survivors, self._node.verify_timeout_s)
        self._gone = [pid for pid in self._gone if pid not in self._signalled]
        self._verified = [pid for pid in self._signalled if pid not in alive]
        last = "KILL" if self._escalated else self._op.signal
        for pid in alive:
            self._problems.append(f"pid {pid} still alive after {self._node.verify_timeout_s:g}s of SIG{last}")
        return self._result()

    async def _gpu_state_refusal(self) -> str:
        return await gpu_state_refusal(self._node, self._op)

    async def _holders(self) -> tuple[set[int] | None, str]:
        """The pids holding the GPU (NVML's compute processes and the device file's holders), and
        what could not be read; None when neither could: nothing is killed blind."""
        gpu = self._op.gpu_index
        apps = await self._node.run(apps_command(gpu))
        device = await self._node.run(holders_command(gpu))
        pids: set[int] = set()
        unread = []
        if apps.exit_status == 0:
            pids.update(parse_pids(apps.stdout))
        else:
            unread.append(f"its compute processes ({said(apps)})")
        if device.exit_status in (0, NO_PROCESS):
            pids.update(parse_pids(device.stdout))
        else:
            unread.append(f"/dev/nvidia{gpu}'s holders ({said(device)})")
        if len(unread) == 2:
            return None, f"refused: what holds GPU {gpu} cannot be read on the node: {'; '.join(unread)}; nothing is killed blind"
        return pids, "; ".join(unread)

    async def _not_a_holder(self, pid: int, unread: str) -> None:
        stat = await self._stat(pid)
        if stat is None or stat.state == "Z":
            self._gone.append(pid)
            return
        gpu = self._op.gpu_index
        also = f" (not read: {unread})" if unread else ""
        self._problems.append(f"refused {pid}: it does not hold GPU {gpu}{also}, so it is not the process the incident saw there")

    async def _identified(self, target: ProcessTarget) -> bool:
        """Whether the pid still names the process the incident saw (False: gone or refused)."""
        pid = target.pid
        stat = await self._stat(pid)
        if stat is None or stat.state == "Z":
            self._gone.append(pid)
            return False
        if stat.start_ticks != target.start_ticks:
            self._problems.append(
                f"refused {pid}: start time {stat.start_ticks} != expected {target.start_ticks} "
                f"(the pid was recycled; now {stat.comm!r})"
            )
            return False
        # The sampler reports command lines with the job's secrets masked; the node's is masked the
        # same way (masking is idempotent) before the two are compared, and before it is shown.
        expected = redact(target.command.strip())
        result = await self._node.run(cmdline_command(pid))
        if result.exit_status != 0:
            self._gone.append(pid)  # it exited between the two reads
            return False
        actual = redact(parse_cmdline(result.stdout))
        if actual != expected:
            self._problems.append(f"refused {pid}: command line {short(actual)} != expected {short(expected)}")
            return False
        return True

    async def _signal(self, pid: int, signal: str) -> bool:
        problem = await send_signal(self._node, pid, signal)
        if problem is None:
            self._gone.append(pid)
        elif problem:
            self._problems.append(problem)
        return problem == ""

    async def _stat(self, pid: int) -> ProcStat | None:
        return await read_stat(self._node, pid)

    async def _wait_gone(self, pids: list[int], timeout_s: float) -> list[int]:
        return await still_alive(self._node, pids, timeout_s)

    def _result(self) -> ExecutionResult:
        parts = []
        if self._signalled:
            parts.append(f"sent {self._op.signal} to {', '.join(map(str, self._signalled))}")
        if self._escalated:
            parts.append(f"sent KILL after {self._op.grace_s:g}s to {', '.join(map(str, self._escalated))}")
        if self._verified:
            parts.append(f"verified gone: {', '.join(map(str, self._verified))}")
        if self._gone:
            parts.append(f"already gone: {', '.join(map(str, self._gone))}")
        parts.extend(self._problems)
        outcome = ActionOutcome.FAILED if self._problems else ActionOutcome.SUCCEEDED
        return self._node.result(outcome, "; ".join(parts))


# --- what every kill does to one process (kill_gpu_processes, stop_job's ranks, kill_pattern) ------


async def read_stat(node: Node, pid: int) -> ProcStat | None:
    """The process's stat, or None when it no longer exists."""
    result = await node.run(stat_command(pid))
    if result.exit_status != 0:
        return None
    return parse_stat(result.stdout)


async def send_signal(node: Node, pid: int, signal: str) -> str | None:
    """'' when sent; None when the process is gone (or a zombie); else why the signal failed."""
    result = await node.run(kill_command(signal, pid))
    if result.exit_status == 0:
        return ""
    after = await read_stat(node, pid)
    if after is None or after.state == "Z":
        return None
    return f"kill -s {signal} {pid} failed: {short(result.stderr.strip() or f'exit status {result.exit_status}')}"


async def still_alive(node: Node, pids: list[int], timeout_s: float, started: dict[int, int] | None = None) -> list[int]:
    """The pids still alive (not zombies, and where `started` gives their start time, still that
    process) when they all died or `timeout_s` passed."""
    alive = list(pids)

    async def all_gone() -> bool:
        nonlocal alive
        still = []
        for pid in alive:
            stat = await read_stat(node, pid)
            if stat is not None and stat.state != "Z" and (started is None or stat.start_ticks == started[pid]):
                still.append(pid)
        alive = still
        return not alive

    if alive:
        await node.poll(all_gone, timeout_s)
    return alive
