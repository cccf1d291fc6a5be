"""The checkpoint step: before an action that ends a job's work, the job is told to save it, and
waited for (the policy's `kinds.<kind>.checkpoint`; off unless set).

How the job is told is one of a closed list, as every command on a node is:

- `signal`: `kill -s USR1 PID` (or the signal named) to each of the job's processes; the job is
  done when the process has exited (it saved and stopped, as jobs that checkpoint on preemption
  do). A process with no handler for the signal dies of it: set it only for jobs that handle it.
- `file`: a file of the policy's name in each process's working directory (`/proc/PID/cwd`);
  the job is done when it removes the file (or exits).
- `http`: the job's hook on the node (a loopback URL), POSTed once with curl on the node: 2xx
  means asked (200: saved already); the job is done when a GET of the same URL answers 200 (202:
  still saving), or when its processes have exited.

The job's processes are what the action will end: every GPU compute process on the node for a
drain, a reboot, or a rented worker's end or pod restart for its own incident, the GPU's for a
reset, the targets for a kill. Each is checked against
/proc/PID/stat before it is told (a pid gone or reused is not told). The wait ends early once
every process told is done, and at `wait_s` regardless: the action then runs, and its detail
says what was asked, what the job answered and what the wait cost. A kill's targets idled for
the kind's idle window (that is what makes them a kill's), so they are not asked unless
`even_when_idle`: there is nothing to save.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from gpumedic_events import ActionRequested
from gpumedic_incidents.policy import HEALTH_URL, CheckpointPolicy
from remediator.catalogue import provider
from remediator.catalogue.base import InvalidParameter, Means, Node, quoted, short
from remediator.catalogue.gpu import apps_command, parse_pids
from remediator.catalogue.kill import parse_stat, stat_command, validate_pid

log = logging.getLogger(__name__)

ALL_APPS = "nvidia-smi --query-compute-apps=pid --format=csv,noheader"
"""NVML's compute processes on every GPU of the node: a pid per line."""
HOOK_TIMEOUT_S = 10


@dataclass(frozen=True)
class Whose:
    """The processes whose work an action ends: those NVML lists (`apps`), or named ones (`pids`)."""

    apps: str = ""
    pids: tuple[int, ...] = ()
    idle: str = ""
    """Why they have nothing to save ('' when they may): asked only with `even_when_idle`."""


Jobs = Callable[[Any, ActionRequested | None], Whose]
"""An operation's entry in the catalogue: whose work it ends, for this request."""


def whole_node(operation: Any, request: ActionRequested | None) -> Whose:
    return Whose(apps=ALL_APPS)


def idle_node(operation: Any, request: ActionRequested | None) -> Whose:
    """Every job of a node whose GPUs all idle (a pattern kill runs only then)."""
    return Whose(apps=ALL_APPS, idle="every GPU of the node idled (nothing to save)")


def one_gpu(operation: Any, request: ActionRequested | None) -> Whose:
    return Whose(apps=apps_command(operation.gpu_index))


def targets(operation: Any, request: ActionRequested | None) -> Whose:
    return Whose(pids=tuple(validate_pid(t.pid) for t in operation.targets),
                 idle="the job idled for the whole idle window (nothing to save)")


def the_worker(operation: Any, request: ActionRequested | None) -> Whose:
    """A worker ended for its own incident: its jobs; the pool's idle ones have none."""
    if provider.chosen_as_idle(operation, request):
        return Whose(idle="the pool chose the workers as idle (nothing to save)")
    return Whose(apps=ALL_APPS)


def signal_command(signal: str, pid: int) -> str:
    return f"kill -s {quoted(signal)} {quoted(validate_pid(pid))}"


def _path(pid: int, file: str) -> str:
    return f"/proc/{validate_pid(pid)}/cwd/{file}"


def touch_command(pid: int, file: str) -> str:
    return f"touch -- {quoted(_path(pid, file))}"


def exists_command(pid: int, file: str) -> str:
    return f"test -e {quoted(_path(pid, file))}"


def hook_command(url: str, *, ask: bool) -> str:
    """curl on the node: POST (ask) or GET (is it saved?) the job's hook; the HTTP status on stdout."""
    if not HEALTH_URL.fullmatch(url):
        raise InvalidParameter(f"checkpoint hook {short(url)} is not a plain loopback URL")
    method = "-X POST " if ask else ""
    return f"curl -sS -m {HOOK_TIMEOUT_S} {method}-o /dev/null -w '%{{http_code}}' {quoted(url)}"


async def first(whose: Whose, rule: CheckpointPolicy, means: Means) -> str:
    """Ask the job to checkpoint, and wait: a sentence for the action's detail. Whatever keeps it
    from being asked (the node unreachable, not in the inventory), the action goes on: this is a
    courtesy to the job, never a condition of the fix."""
    if whose.idle and not rule.even_when_idle:
        return f"no checkpoint asked: {whose.idle}"
    if not whose.apps and not whose.pids:
        return "no checkpoint asked: no job to ask"
    try:
        async with means.node() as node:
            return await _ask(node, whose, rule)
    except Exception as exc:  # the node's session: the action does not depend on it
        log.info("checkpoint on %s not asked: %s", means.request and means.request.node_id, exc)
        return f"no checkpoint asked: {short(str(exc) or type(exc).__name__, 200)}"


async def _ask(node: Node, whose: Whose, rule: CheckpointPolicy) -> str:
    pids = whose.pids
    if whose.apps:
        listed = await node.run(whose.apps)
        if listed.exit_status != 0:
            return f"no checkpoint asked: the job's processes could not be listed ({short(listed.stderr.strip() or listed.stdout.strip())})"
        pids = tuple(dict.fromkeys(parse_pids(listed.stdout)))
    if not pids:
        return "no checkpoint asked: no job runs on the GPUs"
    if rule.how == "http":
        return await _ask_hook(node, pids, rule)
    how = f"SIG{rule.signal}" if rule.how == "signal" else f"a file {rule.file} in its working directory"
    told: dict[int, int] = {}
    for pid in pids:
        ticks = await _start_ticks(node, pid)
        if ticks is None:
            continue  # gone meanwhile: nothing to tell
        ask = signal_command(rule.signal, pid) if rule.how == "signal" else touch_command(pid, rule.file)
        if (await node.run(ask)).exit_status == 0:
            told[pid] = ticks
    if not told:
        return f"no checkpoint asked: none of pid(s) {_pids(pids)} could be told ({how})"
    waiting = dict(told)

    async def done() -> bool:
        for pid, ticks in list(waiting.items()):
            if await _exited(node, pid, ticks) or (
                    rule.how == "file" and (await node.run(exists_command(pid, rule.file))).exit_status != 0):
                del waiting[pid]
        return not waiting

    took = await _wait(node, rule, done)
    asked = f"asked pid(s) {_pids(told)} to checkpoint ({how})"
    if took is not None:
        return f"{asked}: done after {took:.0f}s"
    return f"{asked}: pid(s) {_pids(waiting)} not done after {rule.wait_s:g}s, so the action went ahead"


async def _ask_hook(node: Node, pids: tuple[int, ...], rule: CheckpointPolicy) -> str:
    """One POST to the node's hook for all its jobs; then a GET each poll until it answers 200."""
    assert rule.url is not None  # the policy requires it for how: http
    running = {pid: ticks for pid in pids if (ticks := await _start_ticks(node, pid)) is not None}
    if not running:
        return f"no checkpoint asked: none of pid(s) {_pids(pids)} runs any more"
    asked = await node.run(hook_command(rule.url, ask=True))
    status = asked.stdout.strip()
    if asked.exit_status != 0 or not status.startswith("2"):
        said = f"HTTP {status}" if status.isdigit() and status != "000" else short(asked.stderr.strip() or "no answer")
        return f"no checkpoint asked: the hook {rule.url} did not accept it ({said})"
    how = f"pid(s) {_pids(running)} through {rule.url}"
    if status == "200":
        return f"asked {how} to checkpoint: done at once"

    async def done() -> bool:
        answer = await node.run(hook_command(rule.url, ask=False))
        if answer.exit_status == 0 and answer.stdout.strip() == "200":
            return True
        return all([await _exited(node, pid, ticks) for pid, ticks in running.items()])

    took = await _wait(node, rule, done)
    if took is not None:
        return f"asked {how} to checkpoint: done after {took:.0f}s"
    return f"asked {how} to checkpoint: not done after {rule.wait_s:g}s, so the action went ahead"


async def _wait(node: Node, rule: CheckpointPolicy, done: Callable[[], Awaitable[bool]]) -> float | None:
    """Poll `done` every poll_s until it says so (the seconds it took) or wait_s has passed (None)."""
    started = node.clock()
    while node.clock() - started < rule.wait_s:
        await node.sleep(min(rule.poll_s, max(0.0, rule.wait_s - (node.clock() - started))))
        if await done():
            return node.clock() - started
    return None


async def _start_ticks(node: Node, pid: int) -> int | None:
    """When the process started (to know it again), or None if it is gone."""
    stat = await node.run(stat_command(pid))
    return parse_stat(stat.stdout).start_ticks if stat.exit_status == 0 else None


async def _exited(node: Node, pid: int, ticks: int) -> bool:
    """The process told has exited (or the pid is another's now, or a zombie's)."""
    stat = await node.run(stat_command(pid))
    if stat.exit_status != 0:
        return True
    now = parse_stat(stat.stdout)
    return now.start_ticks != ticks or now.state == "Z"


def _pids(pids) -> str:
    return ", ".join(str(p) for p in pids)
