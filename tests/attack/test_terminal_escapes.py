"""The fourth attack's fifth hole: `gpumedic incidents ID` printed a hostile container name's raw
escape sequences (clear screen, window title) on three lines, the summary, the evidence and the
timeline; C1 controls and bidi overrides passed everywhere. Every command now prints through one
path that escapes them; checked on the bytes a terminal would get, from a real process."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from datetime import UTC, datetime
from pathlib import Path

from gpumedic_store import create_engine, session_factory, upgrade
from gpumedic_store.models import Incident, TimelineEntry

GPUMEDIC = Path(sys.executable).parent / "gpumedic"
NAME = "job\x1b[2J\x1b]0;pwned\x07-\x9b31m\x9d0;t\x07-\u202eexe.txt"
RAW = (b"\x1b", b"\x07", "\x9b".encode(), "\x9d".encode(), "\u202e".encode())
NOW = datetime(2026, 12, 7, 9, 0, tzinfo=UTC)


async def _store(tmp_path) -> tuple[str, str]:
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    incident_id = str(uuid.uuid4())
    engine = create_engine(url)
    async with session_factory(engine)() as session:
        session.add(Incident(id=incident_id, node_id="gpu-node-07", kind="container_died", gpu_index=None, fingerprint="f",
                             status="open", summary=f"container {NAME} exited 137", opened_at=NOW, updated_at=NOW,
                             evidence={"container": NAME, "exit_code": 137}, detector="zombie-detector", severity="warning",
                             occurrences=1))
        session.add(TimelineEntry(event_id=str(uuid.uuid4()), incident_id=incident_id, occurred_at=NOW, event_type="IncidentOpened",
                                  subject="gpumedic.v1.incident.opened", source="zombie-detector", summary=f"opened: {NAME} died",
                                  payload={}))
        await session.commit()
    await engine.dispose()
    return url, incident_id


def _gpumedic(*argv: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([str(GPUMEDIC), *argv], capture_output=True, timeout=60)


async def test_an_incidents_detail_list_and_json_carry_no_raw_control_byte(tmp_path):
    url, incident_id = await _store(tmp_path)
    detail = _gpumedic("incidents", incident_id[:8], "--store", url)
    assert detail.returncode == 0, detail.stderr
    listed = _gpumedic("incidents", "--store", url)
    as_json = _gpumedic("incidents", incident_id[:8], "--store", url, "--json")
    for result in (detail, listed, as_json):
        assert not any(raw in result.stdout or raw in result.stderr for raw in RAW), result.stdout
    # Shown, escaped: a person sees what the name holds.
    assert detail.stdout.count(b"\\x1b[2J") >= 3 and b"\\u202eexe.txt" in detail.stdout and b"\\u009b31m" in detail.stdout
    # The JSON is still JSON, and says the same name.
    assert json.loads(as_json.stdout)["incident"]["evidence"]["container"] == NAME


def test_one_printing_path_escapes_every_control_but_lines_and_tabs(capsys):
    from gpumedic.printable import printable_output

    with printable_output():
        print(f"a\tb {NAME}\r\n", end="")
        print("error: \x1b[31mred\x1b[0m", file=sys.stderr)
    out = capsys.readouterr()
    assert out.out == "a\tb job\\x1b[2J\\x1b]0;pwned\\x07-\\u009b31m\\u009d0;t\\x07-\\u202eexe.txt\\x0d\n"
    assert out.err == "error: \\x1b[31mred\\x1b[0m\n"  # into a pipe, colours too are text


def test_on_a_terminal_only_the_tables_own_colours_pass():
    import io

    from gpumedic.output import table
    from gpumedic.printable import PrintableStream

    terminal = io.StringIO()
    PrintableStream(terminal, colour=True).write(table(["NODE", "STATUS"], [["gpu-01", "failed"]], colour=True) + "\x1b[30;40mhidden\x1b[8m")
    shown = terminal.getvalue()
    assert "\x1b[31mfailed" in shown  # the table's red
    assert shown.endswith("\\x1b[30;40mhidden\\x1b[8m")  # black on black and concealed text are text
