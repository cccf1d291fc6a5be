"""The cluster monitoring log end to end: leader-health probes a simulated peer cluster over real
HTTP, report-builder keeps every check it publishes on the real bus, and `gpumedic cluster log`
shows the checks and the runbook's summary, including the stretch the cluster had no leader."""

from __future__ import annotations

import asyncio
from datetime import timedelta

from sqlalchemy import select

from gpumedic.clusterlog import log_text
from gpumedic_store import ClusterCheck, create_engine, session_factory
from gpumedic_store.clusterlog import Goal
from leader_health.main import create_app as leader_app
from leader_health.settings import Settings as LeaderSettings
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings


async def _checks(store_url: str) -> list[ClusterCheck]:
    engine = create_engine(store_url)
    async with session_factory(engine)() as session:
        rows = list((await session.scalars(select(ClusterCheck).order_by(ClusterCheck.checked_at))).all())
    await engine.dispose()
    return rows


async def _until(store_url: str, done, timeout_s: float = 20.0) -> list[ClusterCheck]:
    for _ in range(int(timeout_s / 0.2)):
        rows = await _checks(store_url)
        if done(rows):
            return rows
        await asyncio.sleep(0.2)
    raise AssertionError(f"not in the log within {timeout_s}s: {[(r.leader, r.summary) for r in rows]}")


def _leaderless_s(rows: list[ClusterCheck]) -> float:
    times = [r.checked_at for r in rows if r.leader is None]
    return (max(times) - min(times)).total_seconds() if len(times) >= 2 else 0.0


async def test_every_check_is_kept_and_the_log_shows_the_leaderless_stretch(nats_settings, store_url, fleet, apps):
    peers = [n.status_url for n in fleet.nodes.values()]
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url})))
    await apps.start(leader_app(LeaderSettings(nats=nats_settings, cluster="sim", peers=peers, interval_s=0.2, http_timeout_s=2.0)))
    await _until(store_url, lambda rows: len(rows) >= 3)
    fleet.set_leader(None)  # quorum holds, nobody leads: the classic stuck cluster
    # leaderless for a second and a half at least, so the log's whole seconds show a stretch (three
    # checks 0.2 s apart could round down to 0 s)
    await _until(store_url, lambda rows: _leaderless_s(rows) >= 1.5)
    fleet.set_leader("sim-node-02")  # a new leader is elected
    await _until(store_url, lambda rows: rows[-1].leader == "sim-node-02")
    await apps.stop_all()
    rows = await _checks(store_url)  # a check may have landed between the last read and the stop

    assert all(r.cluster == "sim" and r.peers_total == 2 for r in rows)
    assert {r.leader for r in rows} == {"sim-node-01", None, "sim-node-02"}
    assert any(not r.healthy and "no leader with quorum" in r.summary for r in rows)
    # Every row shown: on a loaded machine the leaderless stretch can be more than the default 30 rows back.
    text = await log_text(store_url, cluster="sim", since=timedelta(hours=1), goal=Goal(2, 1), rows=len(rows))
    assert text.startswith(f"cluster sim: {len(rows)} checks over")
    assert "peers now 2/2, peak 2" in text and "leader changes 1 " in text
    assert "longest without a leader 0s" not in text and "goal 2 peers for 1h: not yet" in text
    assert "no leader with quorum" in text and "sim-node-02" in text
