"""`gpumedic cluster log`: its own mistakes said plainly before the store is read, and the log as the runbook kept it."""

from __future__ import annotations

import asyncio

import pytest

from gpumedic.cli import main
from gpumedic_events import ClusterChecked, PeerRow
from gpumedic_store import create_engine, session_factory, upgrade
from report_builder import repository


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


def test_the_log_shows_the_latest_checks_peer_table(tmp_path, capsys):
    url = f"sqlite+aiosqlite:///{tmp_path}/log.db"
    upgrade(url)
    check = ClusterChecked(source="leader-health", cluster="selfplay", peers_total=2, peers_answering=1, leader="lambda-gh200-1",
                           healthy=True, summary="1/2 peers answer; leader lambda-gh200-1; Voters 5/8 (quorum OK)",
                           peers=(PeerRow(url="http://a:8770/status", state="ok", node_id="lambda-gh200-1", role="leader", voter=True,
                                          answer_ms=12.4, jobs=2, gpu_percent=3.5),
                                  PeerRow(url="http://b:8770/status", state="blocked", answer_ms=3001)))

    async def record() -> None:
        engine = create_engine(url)
        async with session_factory(engine)() as session, session.begin():
            await repository.record_cluster_check(session, event=check)
        await engine.dispose()

    asyncio.run(record())
    assert main(["cluster", "log", "--store", url]) == 0
    out = capsys.readouterr().out
    lines = [" ".join(line.split()) for line in out.splitlines()]
    assert "PEER STATE ROLE VOTER ANSWER JOBS GPU%" in lines
    assert "lambda-gh200-1 ok leader yes 12ms 2 3.5" in lines
    assert "http://b:8770/status blocked - - 3001ms - -" in lines
