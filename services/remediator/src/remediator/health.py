"""SSH health: the remediator alone holds the SSH key, so it alone can tell whether every node of
the inventory still lets it in. On a schedule it logs in to each (no command runs) and publishes a
NodeSshChecked whenever the answer changes, and on every failure, so the node-incident detector
opens ssh_unreachable with the cause the runbooks meet (refused, timeout, auth refused, host key
changed) before an action needs the node.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

from gpumedic_bus.lateness import LoopLag
from gpumedic_bus.shares import Shares
from gpumedic_events import NodeSshChecked
from gpumedic_nodes.check import failure_of
from gpumedic_nodes.inventory import InventoryError, load_inventory
from gpumedic_nodes.ssh import SshExecutor

log = logging.getLogger(__name__)

SERVICE = "remediator"
UNJUDGED = "unjudged"
"""A check whose timeout the remediator measured while its own loop lagged: neither way."""


@dataclass(frozen=True)
class Checked:
    """The last answer of one node."""

    cause: str
    failures: int


def next_check(previous: Checked | None, node_id: str, cause: str, detail: str) -> tuple[Checked, NodeSshChecked | None]:
    """The node's new state, and the event to publish (on a change, and on every failure). Pure."""
    reachable = cause == "ok"
    failures = 0 if reachable else (previous.failures if previous else 0) + 1
    state = Checked(cause, failures)
    if reachable and previous is not None and previous.cause == "ok":
        return state, None
    event = NodeSshChecked(source=SERVICE, node_id=node_id, reachable=reachable, cause=cause, detail=detail[:500], failures=failures)
    return state, event


class SshHealth:
    def __init__(self, executor: SshExecutor, inventory: Path, *, interval_s: float, concurrency: int,
                 loop_lag: LoopLag | None = None) -> None:
        """`loop_lag`: the remediator's own loop's lateness; a login that timed out while it lagged
        says nothing of the node (the answer may have waited for the loop) and is checked again."""
        self._executor = executor
        self._loop_lag = loop_lag
        self._inventory = inventory
        self.interval_s = interval_s
        self._limit = asyncio.Semaphore(concurrency)
        self._again_limit = asyncio.Semaphore(concurrency)
        """Checks again have slots of their own: behind a round's queue over a large inventory they
        would wait for most of the round."""
        self.states: dict[str, Checked] = {}
        self._again: set[asyncio.Task] = set()
        """Nodes that began failing, each to be checked again alone (`_check_again`)."""

    def loop(self, publish: Callable[[NodeSshChecked], Awaitable[None]], shares: Shares | None = None):
        """Check every node each round; with `shares`, the nodes of the partitions this instance
        holds (the service's instances split the inventory), from when its share is settled."""
        async def check_ssh() -> None:
            if shares is not None:
                await shares.settled.wait()
            try:
                while True:
                    await self.check_all(publish, mine=shares.holds if shares is not None else None, again=True)
                    await asyncio.sleep(self.interval_s)
            finally:
                for task in self._again:
                    task.cancel()

        return check_ssh

    async def check_all(
        self, publish: Callable[[NodeSshChecked], Awaitable[None]], mine: Callable[[str], bool] | None = None, *, again: bool = False,
    ) -> None:
        """One round over the inventory's nodes (those this instance holds, with `mine`). Each
        node's answer is published as soon as it comes, not at the round's end: a round over a
        large inventory takes about as long as the interval. With `again` (the loop), a node that
        begins failing is checked again alone a quarter of an interval on (`_check_again`)."""
        try:
            nodes = sorted(load_inventory(self._inventory))
        except InventoryError as exc:
            log.warning("SSH checks skipped: %s", exc)
            return
        if mine is not None:
            nodes = [n for n in nodes if mine(n)]
            # A node checked by another instance meanwhile starts afresh here: what this one last
            # saw of it may be older than what the other published.
            self.states = {n: s for n, s in self.states.items() if mine(n)}
        await asyncio.gather(*(self._check_one(node, publish, mine, again=again) for node in nodes))

    async def _check_one(
        self, node: str, publish: Callable[[NodeSshChecked], Awaitable[None]], mine: Callable[[str], bool] | None, *, again: bool,
        limit: asyncio.Semaphore | None = None,
    ) -> None:
        cause, detail = await self._check(node, limit or self._limit)
        if cause == UNJUDGED:
            log.info("SSH check of %s timed out while the remediator's own loop lagged (%s): not counted", node, detail)
            return
        if cause == "not_in_inventory":  # left the inventory since the round began (a worker ended): not ours to check
            self.states.pop(node, None)
            return
        state, event = next_check(self.states.get(node), node, cause, detail)
        if event is not None:
            try:
                await publish(event)
            except Exception as exc:  # the next round tries again: keep the old state
                log.warning("SSH check of %s not published (%r)", node, exc)
                return
            if not event.reachable:
                log.warning("SSH to %s fails (%s, %d in a row): %s", node, cause, state.failures, detail)
        self.states[node] = state
        if again and state.failures == 1:
            task = asyncio.create_task(self._check_again(node, publish, mine), name=f"ssh-again-{node}")
            self._again.add(task)
            task.add_done_callback(self._again.discard)

    async def _check_again(self, node: str, publish: Callable[[NodeSshChecked], Awaitable[None]], mine: Callable[[str], bool] | None) -> None:
        """A node that began failing, checked again alone a quarter of an interval on, not a round
        later: its incident waits for failures in a row (the policy's after_checks), and a round
        over a large inventory takes about as long as the interval."""
        await asyncio.sleep(self.interval_s / 4)
        if (mine is None or mine(node)) and node in self.states:  # still this instance's node
            await self._check_one(node, publish, mine, again=False, limit=self._again_limit)

    async def _check(self, node: str, limit: asyncio.Semaphore) -> tuple[str, str]:
        async with limit:
            started = time.monotonic()
            try:
                await self._executor.check(node)
            except Exception as exc:  # never let one node stop the round
                cause, detail = failure_of(exc)
                if cause == "timeout" and self._loop_lag is not None and self._loop_lag.lagging_since(started):
                    return UNJUDGED, f"lagged {self._loop_lag.worst_since(started):.1f}s"
                return cause, detail
            return "ok", ""
