"""How every gpumedic process logs: `GPUMEDIC_LOG_LEVEL` (DEBUG, INFO, WARNING, ERROR; INFO by
default) and `GPUMEDIC_LOG_FORMAT` (`text`, the default, one readable line per record; `json`, one
JSON object per line for a log shipper). A JSON line carries the trace and span id of the span
current when it was written, so a log line leads to its incident's trace in the trace UI.
"""

from __future__ import annotations

import json
import logging
import os
import sys
from datetime import UTC, datetime

from opentelemetry import trace

LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
FORMATS = ("text", "json")
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"
URL_LOGGERS = ("httpx", "httpcore")
"""Their INFO lines carry whole request URLs, and a webhook's URL is a secret (Slack's is the
credential): they log warnings and worse only, whatever the level."""


class JsonLines(logging.Formatter):
    """One JSON object per record: time, level, service, logger, message, trace ids, exception."""

    def __init__(self, service: str) -> None:
        super().__init__()
        self.service = service

    def format(self, record: logging.LogRecord) -> str:
        line = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "service": self.service,
            "logger": record.name,
            "message": record.getMessage(),
        }
        context = trace.get_current_span().get_span_context()
        if context.is_valid:
            line["trace_id"] = format(context.trace_id, "032x")
            line["span_id"] = format(context.span_id, "016x")
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return json.dumps(line, ensure_ascii=False)


def configure_logging(service: str, environ: dict[str, str] | None = None) -> None:
    """Set the root logger from GPUMEDIC_LOG_LEVEL and GPUMEDIC_LOG_FORMAT; ValueError names a bad one."""
    env = os.environ if environ is None else environ
    level = env.get("GPUMEDIC_LOG_LEVEL", "INFO").strip().upper() or "INFO"
    if level not in LEVELS:
        raise ValueError(f"GPUMEDIC_LOG_LEVEL={level!r} is not a level; use one of {', '.join(LEVELS)}")
    kind = env.get("GPUMEDIC_LOG_FORMAT", "text").strip().lower() or "text"
    if kind not in FORMATS:
        raise ValueError(f"GPUMEDIC_LOG_FORMAT={kind!r} is not a format; use text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonLines(service) if kind == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level)
    for name in URL_LOGGERS:
        logging.getLogger(name).setLevel(max(logging.WARNING, logging.getLevelName(level)))
