"""Times as scenarios and the CLI write them: seconds, or "10s", "2m", "1m30s", "1h"."""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime, timedelta

MAX_TIME_S = 7 * 86_400.0
"""No scenario time (a fault's `at`, `duration_s`) may exceed a week."""


_NUMBER = re.compile(r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][+-]?\d+)?")
_DURATION = re.compile(
    r"(?:(?P<d>\d+(?:\.\d+)?)d)?\s*(?:(?P<h>\d+(?:\.\d+)?)h)?\s*(?:(?P<m>\d+(?:\.\d+)?)m)?\s*(?:(?P<s>\d+(?:\.\d+)?)s)?", re.IGNORECASE
)
_TIME_HELP = "use seconds (10, 2.5) or a duration such as 10s, 2m, 1m30s, 1h, 7d"


def parse_time(value: object, *, limit_s: float = MAX_TIME_S) -> float:
    """Seconds from a number or a text such as "10", "2.5", "10s", "2m", "1m30s", "1h", "7d";
    ValueError (with a message fit for a person) for anything else, negative or beyond `limit_s`."""
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
            seconds = sum(float(m[unit] or 0) * scale for unit, scale in (("d", 86400), ("h", 3600), ("m", 60), ("s", 1)))
    else:
        seconds = float(value)
    if not math.isfinite(seconds):
        raise ValueError(f"{show(value)} is not a finite time")
    if seconds < 0:
        raise ValueError(f"{show(value)} is negative; times count from the start, 0 or later")
    if seconds > limit_s:
        raise ValueError(f"{show(value)} is beyond the limit of {fmt_time(limit_s)}")
    return seconds


def fmt_time(seconds: float) -> str:
    return f"{seconds:g}s"


def show(value: object) -> str:
    """A value as an error message quotes it: its repr, cut at 60 characters."""
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


_LOOKBACK = re.compile(r"(?P<n>\d+(?:\.\d+)?)\s*(?P<unit>m|h|d)", re.IGNORECASE)
MAX_LOOKBACK_DAYS = 400


def parse_lookback(value: str) -> float:
    """Seconds back from now, from "30m", "6h", "7d" or "30d" (at most 400 days); ValueError says
    what a good one looks like."""
    m = _LOOKBACK.fullmatch(str(value).strip())
    if m is None:
        raise ValueError(f"{show(value)} is not a span back from now; use minutes, hours or days such as 30m, 6h, 7d")
    seconds = float(m["n"]) * {"m": 60, "h": 3600, "d": 86_400}[m["unit"].lower()]
    if not 0 < seconds <= MAX_LOOKBACK_DAYS * 86_400:
        raise ValueError(f"{show(value)}: a span back from now is more than nothing and at most {MAX_LOOKBACK_DAYS} days")
    return seconds


def parse_start(value: str, now: datetime, *, limit_s: float = MAX_TIME_S) -> datetime:
    """When something starts, from "now", a delay from now ("30m", "2h", as `parse_time` reads it)
    or a time with its zone ("2026-12-01T02:00Z", "2026-12-01T03:00+01:00"); ValueError says
    what a good one looks like, and refuses a time already past."""
    text = str(value).strip()
    if text.lower() == "now":
        return now
    try:
        return now + timedelta(seconds=parse_time(text, limit_s=limit_s))
    except ValueError:
        pass
    try:
        at = datetime.fromisoformat(text.replace("Z", "+00:00").replace("z", "+00:00"))
    except ValueError:
        raise ValueError(f"{show(value)} is not a start: use now, a delay such as 30m or 2h, or a time such as "
                         "2026-12-01T02:00Z") from None
    if at.tzinfo is None:
        raise ValueError(f"{show(value)} has no time zone: add Z for UTC, or an offset such as +01:00")
    if at < now - timedelta(minutes=1):
        raise ValueError(f"{show(value)} is already past")
    return at.astimezone(UTC)
