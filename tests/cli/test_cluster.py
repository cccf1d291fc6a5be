"""`gpumedic cluster log`'s own mistakes are said plainly, before the store is read."""

from __future__ import annotations

import pytest

from gpumedic.cli import main
from gpumedic_store import upgrade


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (["--since", "2x"], "--since: '2x' is not a time"),
        (["--goal-peers", "20"], "--goal-peers and --goal-hours go together"),
    ],
)
def test_bad_options_are_refused(tmp_path, capsys, options, message):
    assert main(["cluster", "log", *options, "--store", f"sqlite+aiosqlite:///{tmp_path}/x.db"]) == 2
    assert message in capsys.readouterr().err


def test_an_empty_log_says_where_checks_come_from(tmp_path, capsys):
    url = f"sqlite+aiosqlite:///{tmp_path}/log.db"
    upgrade(url)
    assert main(["cluster", "log", "--store", url]) == 0
    assert "no cluster checks recorded (is leader-health running" in capsys.readouterr().out
