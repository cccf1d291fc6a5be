"""Times as scenarios and the CLI write them: seconds, or "10s", "2m", "1m30s", "1h"."""

from __future__ import annotations

import math
import re

MAX_TIME_S = 7 * 86_400.0
"""No scenario time (a fault's `at`, `duration_s`) may exceed a week."""


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DURATION = re.compile(
    r"(?:(?P<h>\d+(?:\.\d+)?)h)?\s*(?:(?P<m>\d+(?:\.\d+)?)m)?\s*(?:(?P<s>\d+(?:\.\d+)?)s)?", re.IGNORECASE
)
_TIME_HELP = "use seconds (10, 2.5) or a duration such as 10s, 2m, 1m30s, 1h"


def parse_time(value: object) -> float:
    """Seconds from a number or a text such as "10", "2.5", "10s", "2m", "1m30s", "1h"; ValueError
    (with a message fit for a person) for anything else, negative or beyond `MAX_TIME_S`."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"{show(value)} is not a time; {_TIME_HELP}")  # noqa: TRY004 - the contract is ValueError
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            if text.startswith("-"):
                raise ValueError(f"{value!r} is negative; times count from the start, 0 or later")
            m = _DURATION.fullmatch(text)
            if not text or m is None or not any(m.groupdict().values()):
                raise ValueError(f"{value!r} is not a time; {_TIME_HELP}")
            seconds = sum(float(m[unit] or 0) * scale for unit, scale in (("h", 3600), ("m", 60), ("s", 1)))
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{show(value)} is not a finite time")
    if seconds < 0:
        raise ValueError(f"{show(value)} is negative; times count from the start, 0 or later")
    if seconds > MAX_TIME_S:
        raise ValueError(f"{show(value)} is beyond the limit of {fmt_time(MAX_TIME_S)}")
    return seconds


def fmt_time(seconds: float) -> str:
    return f"{seconds:g}s"


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."
