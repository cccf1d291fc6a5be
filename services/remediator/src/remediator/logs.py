"""A node's log for a person (`gpumedic logs NODE LOG`): runbook 001's `fetch_worker_logs.py
<worker_id> --lines 200`, read over the remediator's own verified SSH so the person needs no key.

Only a log the policy names (`logs.files`, limited to some nodes where it says so) is read, by its
path there, with one fixed command (`read_command`): the last `TAIL_BYTES` of that very file, of
which the last lines asked are kept. A job that can write its log's directory could make the log a
symlink to a key or /etc/shadow: the command reads only a regular file that is no symlink, opened
once and read through that descriptor only if the kernel says the descriptor is the configured
path (`/proc/$$/fd/3`), so no link anywhere on the way and no swap between check and read is
followed. Nothing on the node changes; the lines come back cleaned of control characters, with what
looks like a secret masked (a private key's lines as one block), and within a message's size (the
earliest lines left out, and counted).
"""

from __future__ import annotations

import logging
import re
import time
import uuid
from pathlib import Path

from gpumedic_events import EventDecodeError, LogReport, LogRequest
from gpumedic_events.logs import MAX_LOG_LINE
from gpumedic_events.redact import redact_lines
from gpumedic_incidents.policy import Policy
from gpumedic_nodes.inventory import InventoryError, address_of
from gpumedic_nodes.ssh import NodeError, SshExecutor
from remediator.catalogue.base import quoted, said

log = logging.getLogger(__name__)

TAIL_BYTES = 1 << 20
"""The most of a log read: its last MiB (a thousand lines of a thousand characters)."""
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")


READ_SCRIPT = (
    'f=$1; [ -f "$f" ] && [ ! -L "$f" ] || { echo "a symlink or no regular file: not read" >&2; exit 3; }; '
    'exec 3<"$f" && [ "$(readlink /proc/$$/fd/3)" = "$f" ] || { echo "a link on its way leads to another file: not read" >&2; exit 3; }; '
    'tail -c "$2" <&3'
)
"""The read, as one POSIX shell script: the path and size are its arguments, never its text."""


def read_command(path: str) -> str:
    return f"sh -c {quoted(READ_SCRIPT)} gpumedic-log {quoted(path)} {TAIL_BYTES}"


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
        return (await self.read(request)).to_json()  # `read` fits it to a message

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
                result = await session.run(read_command(rule.path))
        except (InventoryError, NodeError) as exc:
            return report(path=rule.path, error=str(exc))
        if result.exit_status != 0:
            return report(path=rule.path, error=f"{rule.path} cannot be read on {request.node_id}: {said(result)}")
        lines = result.stdout.splitlines()
        if len(result.stdout.encode()) >= TAIL_BYTES and lines:
            lines = lines[1:]  # the first line of the last MiB is cut
        kept = tuple(line[:MAX_LOG_LINE] for line in redact_lines([_CONTROL.sub(" ", line) for line in lines])[-request.lines:])
        answer = report(path=rule.path, lines=kept).fitted()
        log.info("log %s of %s read for %s: %d line(s), %d left out to fit", request.log, request.node_id, request.requested_by,
                 len(answer.lines), answer.left_out)
        return answer
