"""A node's or worker's log, read for a person: runbook 001's `fetch_worker_logs.py <worker_id>
--lines 200`, without handing out the SSH key.

A request and its reply over core NATS (request-reply on `LOGS_SUBJECT`). The remediator answers,
since it alone may log in to nodes, and only for a log the policy names (`logs.files`): a request
names the log, never a path. The lines come back cleaned of control characters and with what
looks like a secret masked.
"""

from __future__ import annotations

import uuid
from typing import Annotated, ClassVar

from pydantic import Field

from gpumedic_events.action import ENDPOINT_PATTERN
from gpumedic_events.base import MAX_EVENT_BYTES, NodeId, SubjectToken
from gpumedic_events.preflight import _Message

LOGS_SUBJECT = "gpumedic.v1.logs.read"
MAX_LOG_LINES = 1000
MAX_LOG_LINE = 1024


class LogRequest(_Message):
    """The last `lines` lines of the log the policy calls `log`, on `node_id`."""

    SUBJECT: ClassVar[str] = LOGS_SUBJECT

    node_id: NodeId
    log: str = Field(pattern=ENDPOINT_PATTERN, description="The log's name in the policy's logs.files.")
    lines: int = Field(default=200, ge=1, le=MAX_LOG_LINES)
    requested_by: SubjectToken = "operator"


class LogReport(_Message):
    SUBJECT: ClassVar[str] = LOGS_SUBJECT

    read_id: uuid.UUID
    node_id: str = Field(max_length=253)
    log: str = Field(max_length=64)
    path: str = Field(default="", max_length=512, description="Where the log is on the node, as the policy names it.")
    lines: tuple[Annotated[str, Field(max_length=MAX_LOG_LINE)], ...] = Field(default=(), max_length=MAX_LOG_LINES)
    error: str = Field(default="", max_length=2000, description="Why nothing was read ('' when it was).")
    left_out: int = Field(default=0, ge=0, description="The earliest lines asked for that were left out to keep the reply "
                          "within a message's size (a log of long lines, or of characters JSON escapes).")
    took_ms: float = 0.0

    def fitted(self, budget: int = MAX_EVENT_BYTES - 8 * 1024) -> LogReport:
        """This report within `budget` bytes of JSON: the earliest lines are left out, and counted."""
        size = len(self.to_json())
        if size <= budget:
            return self
        cost = [len(LogReport.model_construct(lines=(line,)).model_dump_json(include={"lines"})) - 11 for line in self.lines]
        keep = len(self.lines)
        while keep and size > budget:
            keep -= 1
            size -= cost[len(self.lines) - keep - 1]
        lines = self.lines[len(self.lines) - keep:]
        return self.model_copy(update={"lines": lines, "left_out": self.left_out + len(self.lines) - keep})
