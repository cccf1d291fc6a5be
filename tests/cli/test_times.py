"""When an operator's silence starts: now, a delay, or a time with its zone."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpumedic.times import parse_start

NOW = datetime(2026, 11, 27, 12, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "starts"),
    [
        ("now", NOW),
        ("2h", NOW + timedelta(hours=2)),
        ("1h30m", NOW + timedelta(minutes=90)),
        ("2026-11-28T02:00Z", datetime(2026, 11, 28, 2, 0, tzinfo=UTC)),
        ("2026-11-28T03:00+01:00", datetime(2026, 11, 28, 2, 0, tzinfo=UTC)),
    ],
)
def test_a_start_is_now_a_delay_or_a_time_with_its_zone(text, starts):
    assert parse_start(text, NOW) == starts


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("tomorrow", "is not a start: use now, a delay such as 30m"),
        ("2026-11-28T02:00", "has no time zone: add Z for UTC"),
        ("2026-11-26T02:00Z", "is already past"),
    ],
)
def test_a_start_that_cannot_be_taken_says_why(text, says):
    with pytest.raises(ValueError, match=says):
        parse_start(text, NOW)
