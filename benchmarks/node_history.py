"""Node history at fleet size: a day of minutes for `--history-nodes` (1,000) nodes in a SQLite store
(as the embedded mode keeps it), made by the real node-sampler over simulated 8-GPU nodes whose
jobs come and go; then the node page (its 24 h charts), a container death's incident page (the
node's figures from the hour before) and the history as JSON are fetched `--history-runs` times
each, in turns, beside the console's floor (`/healthz`). Also: the store's size per node-day, how
long report-builder's writer takes to store one minute of the whole fleet late in an hour, and to
fold that hour into its rows once it has ended. The goal is a p95
under 300 ms for the node page and the incident page.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import tempfile
import time
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert

from benchmarks import node_sample, print_pages, time_pages
from gpumedic_events import IncidentOpened
from gpumedic_events.base import json_examples
from gpumedic_sim.fleet.history import backfill
from gpumedic_sim.machine.node import SimNode
from gpumedic_store import NodeHour, create_engine, session_factory, upgrade
from gpumedic_store.history import Columns, MinuteFolder, hour_of, write
from report_builder import repository
from report_builder.console import Console, ConsoleConfig
from report_builder.history import HistoryRecorder

TARGET_MS = 300.0
PATTERNS = 4
"""Simulated nodes whose days are made; the fleet's nodes take them in turn (their blobs differ)."""


async def _fill(sessions, nodes: list[str], minutes: int, now: datetime) -> list[str]:
    days = [await backfill(SimNode(f"pattern-{k}", 8, seed=k), end=now, minutes=minutes) for k in range(PATTERNS)]
    blobs = []
    for day in days:
        hours: dict[datetime, Columns] = {}
        for m in day:
            hours.setdefault(hour_of(m.minute), Columns()).add([m])
        blobs.append([(hour, columns.encode()) for hour, columns in hours.items()])
    incidents = []
    async with sessions() as session:
        for n, node in enumerate(nodes):
            rows = [{"node_id": node, "hour": at, "figures": blob} for at, blob in blobs[n % PATTERNS]]
            await session.execute(insert(NodeHour), rows)
            if n % 10 == 0:
                died = IncidentOpened.model_validate({
                    **json_examples(IncidentOpened)[0], "event_id": str(uuid.uuid4()), "incident_id": str(uuid.uuid4()),
                    "kind": "container_died", "node_id": node, "occurred_at": (now - timedelta(minutes=30)).isoformat(),
                })
                await repository.record_event(session, event=died, subject=died.subject, trace_id=None)
                incidents.append(str(died.incident_id))
            if n % 50 == 49:
                await session.commit()
        await session.commit()
    return incidents


async def _fleet_writes(sessions, nodes: list[str], now: datetime) -> tuple[float, float, int]:
    """Seconds report-builder's writer takes to store one minute of every node (12 samples each),
    late in an hour (what the hour already holds must not matter); then to fold that hour of the
    whole fleet into its rows once it has ended (spread over the next flushes, between samples),
    and the node-hours folded."""
    hour = now.replace(minute=0)
    at = {"now": hour + timedelta(minutes=58)}
    recorder = HistoryRecorder(sessions, retention=timedelta(days=2), now=lambda: at["now"])
    for minute in range(58 - 30, 58):  # half an hour of the fleet already written
        batch = {}
        for n, node in enumerate(nodes):
            folder = MinuteFolder(hour + timedelta(minutes=minute))
            folder.add(node_sample(node, gpus=8).model_copy(update={"occurred_at": hour + timedelta(minutes=minute)}))
            batch[node] = [folder.minute_figures()]
        async with sessions() as session, session.begin():
            await write(session, batch)
    for node in nodes:
        for k in range(12):
            await recorder.on_sample(node_sample(node).model_copy(update={"occurred_at": hour + timedelta(minutes=58, seconds=5 * k)}))
    at["now"] = hour + timedelta(minutes=59, seconds=20)
    started = time.perf_counter()
    await recorder.flush()
    minute_s = time.perf_counter() - started
    at["now"] = hour + timedelta(minutes=61)
    started, folded = time.perf_counter(), 0
    while (done := await recorder.fold(limit=len(nodes))) > 0:
        folded += done
    return minute_s, time.perf_counter() - started, folded


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--history-nodes", type=int, default=1000)
    parser.add_argument("--history-minutes", type=int, default=24 * 60)
    parser.add_argument("--history-runs", type=int, default=20)
    args, _ = parser.parse_known_args(argv)
    logging.getLogger("report_builder.console.server").setLevel(logging.WARNING)
    now = datetime.now(UTC).replace(second=0, microsecond=0)
    nodes = [f"gpu-node-{n:04d}" for n in range(args.history_nodes)]

    with tempfile.TemporaryDirectory(prefix="gpumedic-bench-history-") as tmp:
        path = f"{tmp}/gpumedic.db"
        url = f"sqlite+aiosqlite:///{path}"
        upgrade(url)
        empty = os.path.getsize(path)
        engine = create_engine(url)
        sessions = session_factory(engine)
        filled_at = time.perf_counter()
        incidents = await _fill(sessions, nodes, args.history_minutes, now)
        fill_s = time.perf_counter() - filled_at
        per_node_day = (os.path.getsize(path) - empty) / args.history_nodes * (24 * 60 / args.history_minutes)
        minute_s, fold_s, folded = await _fleet_writes(sessions, nodes, now - timedelta(hours=3))
        console = Console(sessions, ConsoleConfig(port=0), publish=lambda event: asyncio.sleep(0))
        await console.start()
        middle = nodes[len(nodes) // 2]
        pages = {
            "floor (/healthz)": "/healthz",
            "node page, 24 h": f"/nodes/{middle}?window=24h",
            "node page, 1 h": f"/nodes/{middle}?window=1h",
            "node history as JSON, 24 h": f"/nodes/{middle}/history.json?window=24h",
            "incident page (container death)": f"/incidents/{incidents[len(incidents) // 2]}",
        }
        try:
            took = await time_pages(console.url, pages, args.history_runs)
        finally:
            await console.stop()
            await engine.dispose()

    hours = args.history_minutes / 60
    print(f"node history: {args.history_nodes:,} nodes x {hours:g} h of minutes (SQLite, 8 GPUs each), {args.history_runs} runs each, in turns")
    print(f"  size on disk: {per_node_day / 1024:.0f} KiB per node-day ({per_node_day * args.history_nodes / 1024**2:.0f} MiB per day of this fleet); filled in {fill_s:.0f} s")
    print(f"  one minute of the whole fleet stored by report-builder's writer, late in an hour: {minute_s * 1000:.0f} ms")
    print(f"  that hour of the whole fleet folded into its rows once it ended: {fold_s:.1f} s in all"
          f" ({fold_s / max(1, len(nodes)) * 1000:.1f} ms a node-hour, {folded:,} minutes), spread over the next flushes")
    print_pages(took, target_ms=TARGET_MS)
