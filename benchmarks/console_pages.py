"""The web console on a store with many incidents: how long each page takes to answer, side by side
with the console's own floor (`/healthz`, the same server and client with no store read).

A SQLite store (as the embedded mode keeps it) is filled with `--console-incidents` (10,000)
incidents over 30 days on 500 nodes, four timeline rows and an action each, one in twenty still
open; then the list (first page, a deep page, filtered by kind and node), one incident's page, its
saved report, the fleet and the ledger are fetched `--console-runs` times each, in turns. The target
is a p95 under 200 ms for the list and the incident page.
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import random
import tempfile
import uuid
from datetime import UTC, datetime, timedelta

from sqlalchemy import insert

from benchmarks import print_pages, time_pages
from gpumedic_store import ActionRecord, Incident, TimelineEntry, create_engine, session_factory, upgrade
from report_builder.console import Console, ConsoleConfig

KINDS = ("zombie_job", "orphan_gpu_holder", "gpu_xid", "container_died", "node_silent", "ssh_unreachable", "disk_pressure")
TARGET_MS = 200.0


async def _fill(sessions, count: int, nodes: int) -> str:
    """`count` incidents; returns the id of one in the middle."""
    rng = random.Random(7)
    start = datetime.now(UTC) - timedelta(days=30)
    step = timedelta(days=30) / count
    incidents, timeline, actions = [], [], []
    for n in range(count):
        incident_id, opened = str(uuid.uuid4()), start + n * step
        node, kind = f"gpu-node-{rng.randrange(nodes):04d}", rng.choice(KINDS)
        status = "open" if n % 20 == 0 else "resolved"
        incidents.append({
            "id": incident_id, "node_id": node, "kind": kind, "gpu_index": 0, "fingerprint": f"{node}/{kind}/0", "status": status,
            "summary": f"{kind} on {node}", "opened_at": opened, "updated_at": opened, "closed_at": None if status == "open" else opened,
            "resolution": None if status == "open" else "fixed", "trace_id": uuid.uuid4().hex, "evidence": {"n": n}, "detector": "zombie-detector",
            "severity": "warning", "diagnosis": None, "recommended_action": "", "occurrences": 1,
        })
        for i, what in enumerate(("opened", "action requested", "action succeeded", "resolved")):
            timeline.append({
                "event_id": str(uuid.uuid4()), "incident_id": incident_id, "occurred_at": opened + timedelta(seconds=i),
                "event_type": "IncidentOpened", "subject": "gpumedic.v1.incident.opened", "source": "zombie-detector",
                "summary": what, "payload": {}, "trace_id": None,
            })
        actions.append({
            "action_id": str(uuid.uuid4()), "incident_id": incident_id, "node_id": node, "attempt": 1,
            "operation": {"operation": "kill_gpu_processes"}, "requested_by": "zombie-detector", "reason": "", "status": "succeeded",
            "detail": "", "steps": [], "audit": [], "requested_at": opened, "started_at": opened, "finished_at": opened,
        })
    async with sessions() as session:
        for model, rows in ((Incident, incidents), (TimelineEntry, timeline), (ActionRecord, actions)):
            for at in range(0, len(rows), 2000):
                await session.execute(insert(model), rows[at : at + 2000])
        await session.commit()
    return incidents[count // 2]["id"]


async def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m benchmarks")
    parser.add_argument("--console-incidents", type=int, default=10_000)
    parser.add_argument("--console-runs", type=int, default=30)
    args, _ = parser.parse_known_args(argv)
    logging.getLogger("report_builder.console.server").setLevel(logging.WARNING)

    with tempfile.TemporaryDirectory(prefix="gpumedic-bench-console-") as tmp:
        url = f"sqlite+aiosqlite:///{tmp}/gpumedic.db"
        upgrade(url)
        engine = create_engine(url)
        sessions = session_factory(engine)
        middle = await _fill(sessions, args.console_incidents, nodes=500)
        console = Console(sessions, ConsoleConfig(port=0), publish=lambda event: asyncio.sleep(0))
        await console.start()
        pages = {
            "floor (/healthz)": "/healthz",
            "incident list, first page": "/incidents",
            "incident list, page 100": "/incidents?page=100",
            "incident list by kind and node": "/incidents?kind=zombie_job&node=gpu-node-0042",
            "incident list, open, last week": "/incidents?status=open&since=" + (datetime.now(UTC) - timedelta(days=7)).strftime("%Y-%m-%dT%H:%M"),
            "one incident": f"/incidents/{middle}",
            "one incident as a file": f"/incidents/{middle}/report.html",
            "fleet (500 open incidents)": "/",
            "ledger": "/ledger",
        }
        try:
            took = await time_pages(console.url, pages, args.console_runs)
        finally:
            await console.stop()
            await engine.dispose()

    print(f"console pages on {args.console_incidents:,} incidents (SQLite), {args.console_runs} runs each, in turns")
    print_pages(took, target_ms=TARGET_MS)
