"""A node's log for a person (`gpumedic logs NODE LOG`): runbook 001's `fetch_worker_logs.py
<worker_id> --lines 200`, read over the remediator's own verified SSH so the person needs no key.

Only a log the policy names (`logs.files`, limited to some nodes where it says so) is read, by its
path there, with one fixed command: the last `TAIL_BYTES` of the file (`tail -c`), of which the
last lines asked are kept. Nothing on the node changes; the lines come back cleaned of control
characters and with what looks like a secret masked.
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from pathlib import Path

from gpumedic_events import EventDecodeError, LogReport, LogRequest
from gpumedic_events.logs import MAX_LOG_LINE
from gpumedic_events.redact import redact
from gpumedic_incidents.policy import Policy
from gpumedic_nodes.inventory import InventoryError, address_of
from gpumedic_nodes.ssh import NodeError, SshExecutor
from remediator.catalogue.base import quoted, said

log = logging.getLogger(__name__)

TAIL_BYTES = 1 << 20
"""The most of a log read: its last MiB (a thousand lines of a thousand characters)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")


def tail_command(path: str) -> str:
    return f"tail -c {TAIL_BYTES} -- {quoted(path)}"


class LogReader:
    def __init__(self, *, policy: Policy, executor: SshExecutor, inventory: Path) -> None:
        self._policy = policy
        self._executor = executor
        self._inventory = inventory

    async def handle(self, body: bytes) -> bytes:
        """One request's bytes in, the report's bytes out; a malformed request gets a report that says why."""
        try:
            request = LogRequest.from_json(body)
        except EventDecodeError as exc:
            return LogReport(read_id=uuid.uuid4(), node_id="invalid", log="invalid", error=f"invalid log request: {exc.reason}").to_json()
        return (await self.read(request)).to_json()

    async def read(self, request: LogRequest) -> LogReport:
        read_id, started = uuid.uuid4(), time.monotonic()

        def report(**fields) -> LogReport:
            return LogReport(read_id=read_id, node_id=request.node_id, log=request.log,
                             took_ms=round((time.monotonic() - started) * 1000, 1), **fields)

        rule = self._policy.logs.files.get(request.log)
        if rule is None:
            names = ", ".join(sorted(self._policy.logs.files)) or "none"
            return report(error=f"no log {request.log} in the policy's logs.files (it names: {names})")
        try:
            address = address_of(self._inventory, request.node_id)
            if not rule.allowed_on(request.node_id, address.group, address.labels):
                return report(path=rule.path, error=f"logs.files.{request.log} is not for {request.node_id} (its nodes: {', '.join(rule.nodes)})")
            async with self._executor.session(request.node_id) as session:
                result = await session.run(tail_command(rule.path))
        except (InventoryError, NodeError) as exc:
            return report(path=rule.path, error=str(exc))
        if result.exit_status != 0:
            return report(path=rule.path, error=f"{rule.path} cannot be read on {request.node_id}: {said(result)}")
        lines = result.stdout.splitlines()
        if len(result.stdout.encode()) >= TAIL_BYTES and lines:
            lines = lines[1:]  # the first line of the last MiB is cut
        kept = tuple(redact(_CONTROL.sub(" ", line))[:MAX_LOG_LINE] for line in lines[-request.lines:])
        log.info("log %s of %s read for %s: %d line(s)", request.log, request.node_id, request.requested_by, len(kept))
        return report(path=rule.path, lines=kept)
