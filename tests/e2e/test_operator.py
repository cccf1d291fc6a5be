"""What an operator does by hand, through the `gpumedic` CLI against the real services: silence a
node for maintenance (its zombie is recorded, nothing is killed), lift the silence (the zombie is
then fixed), and mark an incident a false positive (the ledger counts it per rule)."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic.cli import main
from gpumedic_store import create_engine, session_factory, views
from remediator.main import create_app as remediator_app
from report_builder.main import create_app as reports_app
from report_builder.settings import Settings as ReportSettings
from tests.e2e.test_thin_path import detector, remediator_settings, wait_for_incident


async def _cli(capsys, *argv: str) -> tuple[int, str, str]:
    """`gpumedic ARGV` as a person runs it (its own event loop, in a thread beside the services)."""
    code = await asyncio.to_thread(main, list(argv))
    out = capsys.readouterr()
    return code, out.out, out.err


async def _listed(capsys, store_url: str, silence_id: str) -> dict:
    """The silence as `silence list --json` shows it, once report-builder has stored it."""
    for _ in range(50):
        _, out, _ = await _cli(capsys, "silence", "list", "--json", "--store", store_url)
        if (found := {row["silence_id"]: row for row in json.loads(out)}.get(silence_id)) is not None:
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"silence {silence_id} was not listed within 5s")


async def _open_incident(store_url: str, timeout_s: float = 30.0):
    engine = create_engine(store_url)
    try:
        for _ in range(int(timeout_s / 0.2)):
            async with session_factory(engine)() as session:
                rows = await views.list_incidents(session, where=views.IncidentFilter(status="open"))
            if rows:
                return rows[0]
            await asyncio.sleep(0.2)
    finally:
        await engine.dispose()
    raise AssertionError(f"no open incident within {timeout_s}s")


async def test_a_silenced_zombie_is_recorded_not_killed_until_the_silence_is_lifted(
    nats_settings, store_url, fleet, sampling, apps, monkeypatch, capsys
):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_settings.url)
    await apps.start(reports_app(ReportSettings(nats=nats_settings, store={"url": store_url}, trace_to_bus=True)))
    await apps.start(remediator_app(remediator_settings(nats_settings, store_url, fleet)))
    await apps.start(detector(nats_settings))

    code, out, _ = await _cli(
        capsys, "silence", "add", "--node", "sim-node-02", "--for", "30m", "--reason", "driver upgrade", "--by", "alice"
    )
    assert code == 0 and "node sim-node-02" in out and "driver upgrade" in out
    silence_id = out.split()[2]

    node = fleet.node("sim-node-02")
    hung = node.inject_zombie(0)
    incident = await _open_incident(store_url)
    assert (incident.kind, incident.node_id, incident.silence_id) == ("zombie_job", "sim-node-02", silence_id)
    await asyncio.sleep(3.0)  # several detector ticks: still nothing may be done to the node
    assert node.ssh_commands == [] and node.process(hung.pid).alive

    code, out, _ = await _cli(capsys, "silence", "list", "--store", store_url)
    assert code == 0 and silence_id in out and "alice" in out and "driver upgrade" in out
    code, out, _ = await _cli(capsys, "incidents", incident.id[:8], "--store", store_url)
    assert f"silenced by {silence_id}" in out

    # A silence on a node nobody has heard of would silence nothing: refused, naming the nodes known.
    code, _, err = await _cli(capsys, "silence", "add", "--node", "sim-node-2", "--reason", "typo", "--store", store_url)
    assert code == 2 and "node sim-node-2 matches no node the store knows" in err and "sim-node-02" in err and "--unseen" in err
    code, _, err = await _cli(capsys, "silence", "add", "--match", "node=~gpu-.*", "--reason", "typo", "--store", store_url)
    assert code == 2 and "node=~gpu-.* matches no node" in err
    code, _, err = await _cli(capsys, "silence", "add", "--match", "node=~sim-node-0[23", "--reason", "x", "--store", store_url)
    assert code == 2 and "is not a regular expression" in err and len(err.strip().splitlines()) == 1
    # Several nodes by Alertmanager's matchers, previewed before anything is added.
    code, out, _ = await _cli(capsys, "silence", "add", "--match", "node=~sim-node-0[23]", "--match", "kind!=gpu_xid", "--preview",
                              "--reason", "rack 2 rewiring", "--store", store_url)
    assert code == 0 and "node=~sim-node-0[23], kind!=gpu_xid matches 1 known node(s): sim-node-02" in out  # known: sampled a whole minute, or in an incident
    assert f"{incident.id[:8]} zombie_job on sim-node-02 GPU 0" in out and "added" not in out
    code, out, _ = await _cli(capsys, "silence", "add", "--match", "node=~sim-node-0[23]", "--match", "kind=gpu_xid", "--preview",
                              "--reason", "rack 2 rewiring", "--store", store_url)
    assert code == 0 and "and 0 incident(s) not resolved now" in out
    code, _, err = await _cli(capsys, "silence", "remove", "0000dead", "--by", "alice", "--store", store_url)
    assert code == 2 and "no silence's id starts with '0000dead'" in err

    # A maintenance window that starts later is listed from its start and silences nothing yet.
    code, out, _ = await _cli(capsys, "silence", "add", "--node", "sim-node-02", "--starts", "2h", "--for", "1h",
                              "--reason", "driver upgrade tonight", "--by", "alice", "--store", store_url)
    assert code == 0 and " from " in out and "driver upgrade tonight" in out
    later = out.split()[2]
    listed = await _listed(capsys, store_url, later)
    starts = datetime.fromisoformat(listed["starts_at"])
    assert timedelta(minutes=119) < starts - datetime.now(UTC) <= timedelta(hours=2)
    assert datetime.fromisoformat(listed["ends_at"]) - starts == timedelta(hours=1)
    code, out, _ = await _cli(capsys, "silence", "remove", later[:8], "--by", "alice", "--store", store_url)
    assert code == 0

    # A weekly window: an hour from 2 h on, every 7 days for four weeks; listed until its last window ends.
    code, out, _ = await _cli(capsys, "silence", "add", "--node", "sim-node-02", "--starts", "2h", "--for", "1h", "--every", "7d",
                              "--repeat-until", "28d", "--reason", "weekly patching", "--by", "alice", "--store", store_url)
    assert code == 0 and "again every 7d" in out
    weekly = out.split()[2]
    listed = await _listed(capsys, store_url, weekly)
    first = datetime.fromisoformat(listed["starts_at"])
    assert listed["every_s"] == 7 * 86400
    assert datetime.fromisoformat(listed["last_ends_at"]) == first + timedelta(days=21, hours=1)
    code, out, _ = await _cli(capsys, "silence", "remove", weekly[:8], "--by", "alice", "--store", store_url)
    assert code == 0
    code, _, err = await _cli(capsys, "silence", "add", "--node", "sim-node-02", "--for", "2h", "--every", "1h", "--repeat-until", "1d",
                              "--reason", "x", "--store", store_url)
    assert code == 2 and "every_s must be at least the window's length" in err

    # Lifted by the start of its id, as `silence list` and `incidents` show ids.
    code, out, _ = await _cli(capsys, "silence", "remove", silence_id[:8], "--by", "alice", "--store", store_url)
    assert code == 0 and f"silence {silence_id} lifted by alice" in out
    resolved, timeline, _ = await wait_for_incident(store_url, "resolved")
    assert resolved.id == incident.id and resolved.resolution == "fixed"
    assert node.ssh_commands.count(f"kill -s TERM {hung.pid}") == 1
    code, out, _ = await _cli(capsys, "silence", "list", "--store", store_url)
    assert "no silence in force" in out
    code, out, _ = await _cli(capsys, "silence", "list", "--all", "--store", store_url)
    assert silence_id in out and "lifted by alice" in out

    # The operator decides afterwards it was not a zombie after all: the ledger counts it.
    code, out, _ = await _cli(
        capsys, "incidents", "mark", incident.id[:8], "--false-positive", "--reason", "a checkpoint pause", "--by", "bob",
        "--store", store_url,
    )
    assert code == 0 and "marked false positive by bob" in out
    code, out, _ = await _cli(capsys, "incidents", "--false-positives", "--store", store_url)
    (row,) = [line for line in out.splitlines() if "zombie_job" in line]
    assert row.split()[:4] == ["zombie-detector", "zombie_job", "1", "1"]
    code, out, _ = await _cli(capsys, "incidents", incident.id[:8], "--store", store_url)
    assert "marked false positive by bob" in out and "a checkpoint pause" in out

    # Someone says they look at it: every surface shows who and since when.
    code, out, _ = await _cli(capsys, "incidents", "ack", incident.id[:8], "--by", "carol", "--store", store_url)
    assert code == 0 and "acknowledged by carol: acknowledged; looking into it" in out
    code, out, _ = await _cli(capsys, "incidents", incident.id[:8], "--store", store_url)
    assert "acknowledged by carol at" in out and "marked false positive by bob" in out
    code, _, err = await _cli(capsys, "incidents", "ack", "--by", "carol", "--store", store_url)
    assert code == 2 and "usage: gpumedic incidents ack ID" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["silence", "add", "--for", "1h"], "say why with --reason"),
        (["silence", "add", "--reason", "x", "--for", "soon"], "'soon' is not a time"),
        (["silence", "add", "--reason", "x", "--for", "0s"], "longer than 0s"),
        (["silence", "add", "--reason", "x", "--node", "bad node; rm -rf /"], "node_id"),
        (["silence", "add", "--reason", "x", "--node", "sim-node-0[34]"], "several nodes: --match 'node=~REGEX'"),
        (["silence", "add", "--reason", "x", "--match", "host=sim-node-01"], "no label 'host'; a silence matches node, kind, gpu"),
        (["silence", "remove"], "name the silence to lift"),
        (["silence", "remove", "not-a-uuid", "--var", "/nonexistent"], "no stack has run under /nonexistent/"),
    ],
)
def test_silence_commands_say_what_was_wrong(argv, message, monkeypatch, capsys, nats_url):
    monkeypatch.setenv("GPUMEDIC_NATS_URL", nats_url)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


def test_silence_without_a_bus_says_how_to_reach_one(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv("GPUMEDIC_NATS_URL", raising=False)
    assert main(["silence", "add", "--reason", "x", "--var", str(tmp_path)]) == 2
    assert "no embedded stack runs under" in (err := capsys.readouterr().err) and "GPUMEDIC_NATS_URL" in err


def test_marking_an_unknown_incident_fails_and_marking_needs_a_reason(tmp_path, capsys):
    from gpumedic_store.migrate import upgrade

    url = f"sqlite+aiosqlite:///{tmp_path / 'gpumedic.db'}"
    upgrade(url)
    assert main(["incidents", "mark", "deadbeef", "--false-positive", "--reason", "x", "--store", url]) == 1
    assert "no incident whose id starts with 'deadbeef'" in capsys.readouterr().err
    assert main(["incidents", "mark", "deadbeef", "--store", url]) == 2
    assert "usage: gpumedic incidents mark ID --false-positive --reason" in capsys.readouterr().err
