"""kill_pattern: runbook 000's `pkill -f 'python.*selfplay'`, each process checked to be the one listed.

When killing a stuck GPU's holders is not enough (the job's launcher starts them again), the
runbook ends the whole job on the node by a pattern of its command line. Only a pattern the
policy names (`actions.kill_pattern.patterns`) can be asked for, and by its name: no request
carries a regular expression.

It looks before it acts: every GPU of the node must still idle at most `max_gpu_utilization_pct`
(the runbook's node is stuck as a whole; a busy GPU means work the pattern would end too), and at
most the pattern's `max_processes` may match. Then each match is ended as kill_gpu_processes ends
one: its start time read, its command line checked to still match right before SIGTERM, SIGKILL
after `grace_s` for the same process only, then verified gone. Last, the pattern is asked again:
a process that matches anew was started again by something the kill does not reach (a unit, a
scheduler), and the action fails saying so.
"""

from __future__ import annotations

import re

from gpumedic_events import ActionOutcome, KillPattern
from gpumedic_events.redact import redact
from gpumedic_incidents.policy import Actions, NodeScoped, ProcessPattern
from remediator.catalogue.base import ExecutionResult, Fit, InvalidParameter, Means, Node, quoted, said, short
from remediator.catalogue.kill import MIN_PID, ProcStat, cmdline_command, parse_cmdline, read_stat, send_signal, still_alive
from remediator.catalogue.preflight import GPU_STATE

NO_MATCH = 1
"""pgrep's exit status when nothing matches."""


def pattern_of(operation: KillPattern, actions: Actions) -> ProcessPattern:
    rule = actions.kill_pattern.patterns.get(operation.pattern)
    if rule is None:
        raise InvalidParameter(f"pattern {short(operation.pattern)} is not in actions.kill_pattern.patterns")
    return rule


def list_command(regex: str) -> str:
    """Every process whose command line matches, one `PID COMMAND LINE` per line (pgrep leaves itself out)."""
    return f"pgrep -f -a -- {quoted(regex)}"


def render(operation: KillPattern, actions: Actions) -> tuple[str, ...]:
    """The commands that find the matches; each match is then read and signalled with
    kill_gpu_processes's forms (`cat /proc/PID/stat|cmdline`, `kill -s TERM|KILL PID`)."""
    return (GPU_STATE, list_command(pattern_of(operation, actions).regex))


def fits(operation: KillPattern, fit: Fit) -> str:
    """The pattern is the one the kind's rules name, on a node below its idle threshold, with the policy's grace."""
    named = getattr(fit.rules, "kill_pattern", None)
    if operation.pattern != named:
        return f"kinds.{fit.kind} ends the pattern {named or 'none'}, not {operation.pattern}"
    limit = getattr(fit.rules, "idle_below_pct", None)
    if limit is None or operation.max_gpu_utilization_pct >= limit:
        return (f"the pattern would be ended with GPUs up to {operation.max_gpu_utilization_pct}% busy, not below the "
                f"policy's kinds.{fit.kind}.idle_below_pct ({limit}%)")
    grace = fit.actions.kill_pattern.grace_s
    if operation.grace_s != grace:
        return f"the kill asks {operation.grace_s:g}s grace; the policy's actions.kill_pattern is {grace:g}s"
    return ""


def scope(operation: KillPattern, actions: Actions) -> tuple[NodeScoped, str, str] | None:
    if rule := actions.kill_pattern.patterns.get(operation.pattern):
        return rule, f"the pattern {operation.pattern} may be ended", "actions.kill_pattern.patterns"
    return None


def parse_listing(text: str) -> dict[int, str]:
    """pgrep -a's lines as pid -> command line; a line that is not `PID COMMAND` raises ValueError."""
    found: dict[int, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        pid, _, command = line.strip().partition(" ")
        if not pid.isdigit():
            raise ValueError(f"not a `PID COMMAND` line: {short(line)}")
        found[int(pid)] = command
    return found


async def execute(operation: KillPattern, node: Node, means: Means) -> ExecutionResult:
    rule = pattern_of(operation, means.actions)
    return await _PatternKill(operation, rule, node).go()


class _PatternKill:
    def __init__(self, operation: KillPattern, rule: ProcessPattern, node: Node) -> None:
        self._op, self._rule, self._node = operation, rule, node
        self._regex = re.compile(rule.regex)
        self._signalled: dict[int, int] = {}
        """pid -> the start time it was signalled with."""
        self._escalated: list[int] = []
        self._refused: set[int] = set()
        self._problems: list[str] = []

    async def go(self) -> ExecutionResult:
        if refusal := await self._busy_gpu():
            return self._node.result(ActionOutcome.BLOCKED, refusal)
        matches = await self._matches()
        if isinstance(matches, str):
            return self._node.result(ActionOutcome.BLOCKED, matches)
        if not matches:
            return self._node.result(ActionOutcome.SUCCEEDED, f"no process matches {self._op.pattern} ({self._rule.regex}): nothing to end")
        if len(matches) > self._rule.max_processes:
            return self._node.result(ActionOutcome.BLOCKED, f"refused: {len(matches)} processes match {self._op.pattern}, more than "
                                     f"its max_processes ({self._rule.max_processes}): the pattern is too wide; nothing was signalled")
        for pid in sorted(matches):
            stat = await self._checked(pid)
            if stat is not None and await self._signal(pid, "TERM"):
                self._signalled[pid] = stat.start_ticks
        survivors = await self._alive(list(self._signalled), self._op.grace_s) if self._op.grace_s > 0 else []
        for pid in survivors:
            stat = await self._stat(pid)
            if stat is not None and stat.state != "Z" and stat.start_ticks == self._signalled[pid] and await self._signal(pid, "KILL"):
                self._escalated.append(pid)
        alive = await self._alive(self._escalated or ([] if self._op.grace_s > 0 else list(self._signalled)), self._node.verify_timeout_s)
        for pid in alive:
            self._problems.append(f"pid {pid} still alive after {self._node.verify_timeout_s:g}s of SIG{'KILL' if self._escalated else 'TERM'}")
        again = await self._matches()
        if isinstance(again, dict) and (new := sorted(set(again) - set(self._signalled) - set(matches))):
            self._problems.append(f"started again: {', '.join(map(str, new[:10]))} match {self._op.pattern} anew (a unit or a "
                                  "scheduler restarts them; ending the processes does not stop it)")
        return self._result(matches)

    async def _busy_gpu(self) -> str:
        result = await self._node.run(GPU_STATE)
        try:
            if result.exit_status != 0:
                raise ValueError(said(result))
            busy = []
            for line in result.stdout.splitlines():
                if line.strip():
                    index, utilization = (int(v.strip()) for v in line.split(",")[:2])  # a lost GPU's "[GPU requires reset]" refuses
                    if utilization > self._op.max_gpu_utilization_pct:
                        busy.append(f"GPU {index} at {utilization}%")
        except ValueError as exc:
            return f"refused: the GPUs' utilisation cannot be read on the node ({short(str(exc))}); nothing is ended blind"
        if busy:
            return (f"refused: {', '.join(busy)} (> {self._op.max_gpu_utilization_pct}%): the pattern would end work that "
                    "runs; nothing was signalled")
        return ""

    async def _matches(self) -> dict[int, str] | str:
        result = await self._node.run(list_command(self._rule.regex))
        if result.exit_status == NO_MATCH and not result.stdout.strip():
            return {}
        try:
            if result.exit_status != 0:
                raise ValueError(said(result))
            found = parse_listing(result.stdout)
        except ValueError as exc:
            return f"refused: the processes cannot be listed on the node ({short(str(exc))}); nothing is ended blind"
        # the session that asks (a shell running pgrep) carries the pattern in its own command line
        return {pid: command for pid, command in found.items() if pid >= MIN_PID and not command.lstrip().startswith(("pgrep ", "sh -c pgrep", "bash -c pgrep"))}

    async def _checked(self, pid: int) -> ProcStat | None:
        """Its stat when it is still a process whose command line matches (None: gone, or refused)."""
        stat = await self._stat(pid)
        if stat is None or stat.state == "Z":
            return None
        result = await self._node.run(cmdline_command(pid))
        if result.exit_status != 0:
            return None
        command = parse_cmdline(result.stdout)
        if not self._regex.search(command):
            self._refused.add(pid)
            self._problems.append(f"refused {pid}: its command line {short(redact(command))} no longer matches (the pid was recycled)")
            return None
        return stat

    async def _signal(self, pid: int, signal: str) -> bool:
        problem = await send_signal(self._node, pid, signal)
        if problem:
            self._refused.add(pid)
            self._problems.append(problem)
        return problem == ""

    async def _stat(self, pid: int) -> ProcStat | None:
        return await read_stat(self._node, pid)

    async def _alive(self, pids: list[int], timeout_s: float) -> list[int]:
        """Those of `pids` still the process signalled after `timeout_s`, or once none is."""
        return await still_alive(self._node, pids, timeout_s, self._signalled)

    def _result(self, matches: dict[int, str]) -> ExecutionResult:
        parts = [f"{len(matches)} process(es) matched {self._op.pattern} ({self._rule.regex})"]
        if self._signalled:
            parts.append(f"sent TERM to {', '.join(map(str, self._signalled))}")
        if self._escalated:
            parts.append(f"sent KILL after {self._op.grace_s:g}s to {', '.join(map(str, self._escalated))}")
        gone = [pid for pid in matches if pid not in self._signalled and pid not in self._refused]
        if gone:
            parts.append(f"gone before their turn: {', '.join(map(str, gone))}")
        parts.extend(self._problems)
        outcome = ActionOutcome.FAILED if self._problems else ActionOutcome.SUCCEEDED
        return self._node.result(outcome, "; ".join(parts))
