"""`--json` for the read commands: what they print as a table, as JSON for a script or `jq`.

One shape everywhere: a store row is an object of its columns, a time is ISO 8601 in UTC, a
duration is seconds, a list is a JSON array (empty when there is nothing).
"""

from __future__ import annotations

import dataclasses
import json
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from sqlalchemy import inspect
from sqlalchemy.orm import DeclarativeBase


def to_json(data: Any) -> str:
    return json.dumps(data, indent=2, default=_plain, ensure_ascii=False)


def _plain(value: Any) -> Any:
    if isinstance(value, DeclarativeBase):
        return {attr.key: getattr(value, attr.key) for attr in inspect(value).mapper.column_attrs}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID | Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
