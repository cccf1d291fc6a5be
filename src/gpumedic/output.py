"""What the read commands print: a table for a person (rich), or with `--json` the same rows for a
script or `jq`.

One JSON shape everywhere: a store row is an object of its columns, a time is ISO 8601 in UTC, a
duration is seconds, a list is a JSON array (empty when there is nothing). Job text (command lines,
log lines) is masked in both (`gpumedic_events.redact`), however old the row. Tables have no box,
one row a line: on a terminal as wide as the terminal, the widest columns cut with an ellipsis, and
status words in colour (red for what needs a person, amber for what is open, green for what is
done) unless NO_COLOR is set (no-color.org) or TERM is dumb; into a pipe or a file whole and
plain, so they grep well. Text cut anywhere ends in "…".
"""

from __future__ import annotations

import dataclasses
import io
import json
import shutil
import sys
import uuid
from collections.abc import Iterable, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text
from sqlalchemy import inspect
from sqlalchemy.orm import DeclarativeBase

from gpumedic.printable import colour_on, printable
from gpumedic_events.redact import redact, redact_tree

ELLIPSIS = "…"


def clip(text: str, limit: int) -> str:
    """`text` on one line, its control characters escaped, cut to `limit` characters with an ellipsis where it was cut."""
    text = printable(" ".join(str(text).split()))
    return text if len(text) <= limit else text[: max(limit - 1, 0)] + ELLIPSIS


COLOURS = {
    **dict.fromkeys(("critical", "escalated", "failed", "blocked", "interrupted", "OPEN", "NOT READY", "error"), "red"),
    **dict.fromkeys(("warning", "open", "executing", "waiting", "drained", "observed"), "yellow"),
    **dict.fromkeys(("resolved", "succeeded", "ok", "CLOSED", "READY", "fixed", "cleared"), "green"),
}
"""Words a table colours on a terminal: whole cells only, so a command line is never painted."""


def terminal_width() -> int | None:
    """The terminal's width when stdout is one; None into a pipe or a file (nothing is cut then)."""
    return shutil.get_terminal_size().columns if sys.stdout.isatty() else None


def table(headers: Sequence[str], rows: Iterable[Sequence[Any]], *, indent: int = 0, right: Sequence[str] = (),
          width: int | None = None, colour: bool | None = None) -> str:
    """`rows` under `headers`, columns as wide as their widest cell; the `right` columns aligned right.
    Within `width` (default: the terminal's, if stdout is one) the widest columns are cut with an
    ellipsis; with `colour` (default: `colour_on()`) the status words of COLOURS are painted."""
    width = width or terminal_width()
    colour = colour_on() if colour is None else colour
    grid = Table(box=box.SIMPLE_HEAD, show_edge=False, pad_edge=False, padding=(0, 2, 0, 0), header_style="bold" if colour else "")
    for header in headers:
        grid.add_column(header, justify="right" if header in right else "left", no_wrap=True, overflow="ellipsis")
    for row in rows:
        cells = ("-" if cell is None else printable(redact(str(cell)).replace("\n", " ").replace("\t", " ")) for cell in row)
        grid.add_row(*(Text(c, style=COLOURS.get(c, "")) if colour else Text(c) for c in cells))
    out = io.StringIO()
    Console(file=out, width=(width - indent) if width else 100_000, no_color=not colour, force_terminal=colour,
            color_system="standard" if colour else None, highlight=False, emoji=False, markup=False).print(grid)
    return "\n".join(" " * indent + line.rstrip() for line in out.getvalue().rstrip("\n").splitlines())


def fmt_time(value: datetime | None) -> str:
    """A time as every table shows it: UTC to the millisecond."""
    return value.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z" if value else "-"


def to_json(data: Any) -> str:
    """`data` as JSON, with job text masked (rows written before the sampler masked it)."""
    plain = json.loads(json.dumps(data, default=_plain))
    return json.dumps(redact_tree(plain), indent=2, ensure_ascii=False)


ID_NAMES = {"incidents": "incident_id", "silences": "silence_id"}
"""A row's id under the same name in every command's JSON (an action's is already `action_id`)."""


def _plain(value: Any) -> Any:
    if isinstance(value, DeclarativeBase):
        id_name = ID_NAMES.get(value.__tablename__, "id")
        return {id_name if attr.key == "id" else attr.key: getattr(value, attr.key) for attr in inspect(value).mapper.column_attrs}
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, datetime):
        return value.isoformat()
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, uuid.UUID | Path):
        return str(value)
    raise TypeError(f"{type(value).__name__} is not JSON")
