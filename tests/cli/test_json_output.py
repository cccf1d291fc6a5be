"""Every read command's `--json`: what it prints as a table, as JSON a script can load."""

from __future__ import annotations

import json
import uuid
from datetime import UTC, datetime

import pytest

from gpumedic.cli import main
from gpumedic_store import create_engine, session_factory, upgrade
from gpumedic_store.models import BreakerTrip, Incident


@pytest.fixture
async def store(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/store.db"
    upgrade(url)
    engine = create_engine(url)
    now = datetime(2026, 11, 23, 10, 0, tzinfo=UTC)
    async with session_factory(engine)() as session:
        session.add(Incident(id=str(uuid.uuid4()), node_id="gpu-node-07", kind="zombie_job", gpu_index=0, fingerprint="gpu-node-07/zombie_job/0",
                             status="open", summary="GPU 0 idle for 30 min", opened_at=now, updated_at=now, evidence={"idle_s": 1800},
                             detector="zombie-detector", severity="warning", recommended_action="kill", occurrences=1))
        session.add(BreakerTrip(tripped_at=now, reason="6 nodes in 10 min", reset_at=None, reset_by=None))
        await session.commit()
    await engine.dispose()
    return url


def _json(capsys, argv: list[str]):
    assert main(argv) == 0
    return json.loads(capsys.readouterr().out)


def test_each_read_command_prints_json(store, capsys):
    [incident] = _json(capsys, ["incidents", "--store", store, "--json"])
    assert (incident["node_id"], incident["kind"], incident["opened_at"]) == ("gpu-node-07", "zombie_job", "2026-11-23T10:00:00+00:00")
    assert incident["evidence"] == {"idle_s": 1800}
    one = _json(capsys, ["incidents", incident["incident_id"][:8], "--store", store, "--json"])
    assert one["incident"]["incident_id"] == incident["incident_id"] and one["timeline"] == [] and one["trace"] == []
    [ledger] = _json(capsys, ["incidents", "--false-positives", "--store", store, "--json"])
    assert (ledger["kind"], ledger["incidents"], ledger["false_positives"]) == ("zombie_job", 1, 0)
    assert _json(capsys, ["breaker", "--store", store, "--json"]) == {"open": True, "since": "2026-11-23T10:00:00+00:00", "reason": "6 nodes in 10 min"}
    assert _json(capsys, ["actions", "--store", store, "--json"]) == []
    assert _json(capsys, ["drained", "--store", store, "--json"]) == []
    assert _json(capsys, ["silence", "list", "--store", store, "--json"]) == []
    assert _json(capsys, ["cluster", "log", "--store", store, "--json"]) == []
