"""Incidents through Debian's real Alertmanager (its API v2 and its own routing): an open incident
arrives at a webhook receiver as a firing alert with the kind, node, GPU and severity as labels
and the summary, cause, next step and console link as annotations; it resolves there when the
incident is resolved; an Alertmanager silence on a node stops that node's notification and no
other; an incident under gpumedic's own silence is not sent at all; an Alertmanager that does not
answer costs a warning, not the round."""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import socket
import subprocess
import uuid
from datetime import UTC, datetime, timedelta

import httpx
from aiohttp import web

from gpumedic_events import IncidentOpened, IncidentResolved
from gpumedic_events.base import json_examples
from gpumedic_store import create_engine, session_factory, upgrade
from report_builder import repository
from report_builder.alertmanager import AlertmanagerPush
from tests.fixtures.real import needs

ALERTMANAGER = shutil.which("prometheus-alertmanager") or shutil.which("alertmanager")
pytestmark = needs(ALERTMANAGER, "Debian's prometheus-alertmanager (apt-get install prometheus-alertmanager; .ci/run does)")


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _event(cls, **fields):
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **fields})


async def _alertmanager(tmp_path, hook_port: int):
    """Alertmanager routing every alert, grouped per incident, to the test's webhook at once."""
    port = _port()
    config = tmp_path / "alertmanager.yml"
    config.write_text(f"""
route:
  receiver: hook
  group_by: [incident]
  group_wait: 0s
  group_interval: 1s
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: http://127.0.0.1:{hook_port}/hook
        send_resolved: true
""")
    process = subprocess.Popen(
        [ALERTMANAGER, f"--config.file={config}", f"--storage.path={tmp_path / 'am-data'}", f"--web.listen-address=127.0.0.1:{port}",
         "--cluster.listen-address="],
        stdout=subprocess.DEVNULL, stderr=(tmp_path / "alertmanager.log").open("w"),
    )
    url = f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient() as client:
        for _ in range(100):
            try:
                if (await client.get(f"{url}/-/ready")).status_code == 200:
                    return process, url
            except httpx.HTTPError:
                pass
            await asyncio.sleep(0.1)
    process.terminate()
    raise AssertionError((tmp_path / "alertmanager.log").read_text()[-2000:])


@contextlib.asynccontextmanager
async def hook_receiver():
    """A webhook receiver on loopback: yields its port and the bodies it received."""
    notified: list[dict] = []

    async def hook(request: web.Request) -> web.Response:
        notified.append(await request.json())
        return web.Response()

    app = web.Application()
    app.add_routes([web.post("/hook", hook)])
    runner = web.AppRunner(app)
    await runner.setup()
    port = _port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield port, notified
    finally:
        await runner.cleanup()


async def _until(condition, what: str, timeout_s: float = 15.0):
    for _ in range(int(timeout_s / 0.1)):
        if (found := condition()):
            return found
        await asyncio.sleep(0.1)
    raise AssertionError(f"no {what} within {timeout_s:g}s")


async def test_incidents_reach_a_webhook_through_alertmanager_and_resolve_there(tmp_path):
    async with hook_receiver() as (hook_port, notified):
        await _incidents_through_alertmanager(tmp_path, hook_port, notified)


async def _incidents_through_alertmanager(tmp_path, hook_port: int, notified: list[dict]) -> None:
    process, am_url = await _alertmanager(tmp_path, hook_port)
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    sessions = session_factory(engine)
    try:
        zombie = _event(IncidentOpened, incident_id=str(uuid.uuid4()), kind="zombie_job", node_id="gpu-node-07", gpu_index=3,
                        severity="warning", summary="GPU 3 at 0% for 10 min while the node reports 1 job",
                        recommended_action="kill the GPU's processes", occurred_at=datetime.now(UTC).isoformat())
        async with sessions() as session:
            await repository.record_event(session, event=zombie, subject=zombie.subject, trace_id=None)
            await session.commit()
        push = AlertmanagerPush(sessions, [am_url], console_url="https://gpumedic.example/", every_s=5)
        assert await push.round() == 1

        firing = await _until(lambda: [n for n in notified if n["status"] == "firing"], "firing notification")
        (alert,) = firing[0]["alerts"]
        assert alert["labels"] == {"alertname": "zombie_job", "node": "gpu-node-07", "gpu": "3", "severity": "warning",
                                   "incident": str(zombie.incident_id), "source": "gpumedic"}
        assert alert["annotations"]["summary"] == zombie.summary
        assert alert["annotations"]["next_step"] == "kill the GPU's processes"
        assert alert["annotations"]["console"] == f"https://gpumedic.example/incidents/{zombie.incident_id}"
        assert alert["generatorURL"] == alert["annotations"]["console"]

        # An Alertmanager silence on another node: that node's incident is held there, this one's not.
        async with httpx.AsyncClient() as client:
            now = datetime.now(UTC)
            silence = await client.post(f"{am_url}/api/v2/silences", json={
                "matchers": [{"name": "node", "value": "gpu-node-0[89]", "isRegex": True, "isEqual": True}],
                "startsAt": now.isoformat(), "endsAt": (now + timedelta(hours=1)).isoformat(), "createdBy": "test", "comment": "upgrade",
            })
            assert silence.status_code == 200, silence.text
        hushed = _event(IncidentOpened, incident_id=str(uuid.uuid4()), kind="gpu_xid", node_id="gpu-node-08", gpu_index=0,
                        severity="critical", summary="XID 79 on GPU 0", occurred_at=datetime.now(UTC).isoformat())
        ours = _event(IncidentOpened, incident_id=str(uuid.uuid4()), kind="orphan_gpu_holder", node_id="gpu-node-09", gpu_index=1,
                      severity="warning", summary="an orphan holds GPU 1", silence_id=str(uuid.uuid4()),
                      occurred_at=datetime.now(UTC).isoformat())
        async with sessions() as session:
            for event in (hushed, ours):
                await repository.record_event(session, event=event, subject=event.subject, trace_id=None)
            await session.commit()

        resolved = _event(IncidentResolved, incident_id=str(zombie.incident_id), kind="zombie_job", node_id="gpu-node-07", gpu_index=3,
                          resolution="fixed", summary="GPU 3 busy again after the kill", occurred_at=datetime.now(UTC).isoformat())
        async with sessions() as session:
            await repository.record_event(session, event=resolved, subject=resolved.subject, trace_id=None)
            await session.commit()
        assert await push.round() == 1
        ended = await _until(lambda: [n for n in notified if n["status"] == "resolved"], "resolved notification")
        assert ended[0]["alerts"][0]["labels"]["incident"] == str(zombie.incident_id)

        async with httpx.AsyncClient() as client:
            held = (await client.get(f"{am_url}/api/v2/alerts", params={"filter": 'node="gpu-node-08"'})).json()
            assert [a["status"]["state"] for a in held] == ["suppressed"]  # Alertmanager has it, and its silence holds it
            everything = (await client.get(f"{am_url}/api/v2/alerts")).json()
        assert "gpu-node-09" not in {a["labels"]["node"] for a in everything}  # under gpumedic's own silence: never sent
        await asyncio.sleep(2)  # a notification for the silenced node would have come by now (group_interval 1 s)
        told = {a["labels"]["node"] for n in notified for a in n["alerts"]}
        assert told == {"gpu-node-07"}

        # An Alertmanager that does not answer: the round goes on to the next one.
        push.urls = [f"http://127.0.0.1:{_port()}", am_url]
        assert await push.round() == 1
    finally:
        process.terminate()
        process.wait(10)
        await engine.dispose()
