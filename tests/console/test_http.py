"""The console over HTTP, on a real SQLite store migrated to head: every page, what a hostile
string in the store becomes on a page, bad input, and the operations with their token, session,
CSRF token and origin checks. The bus is the edge here: a silence is handed to `publish` (the
browser test in test_browser.py sends one over the real bus)."""

from __future__ import annotations

import asyncio
import json
import re
import uuid
from datetime import UTC, datetime, timedelta

import httpx
import pytest

from gpumedic_events import CapacityEvaluated, ClusterChecked, IncidentEscalated, IncidentOpened, SilenceAdded, SilenceRemoved, SpanRecord
from gpumedic_events.base import json_examples
from gpumedic_store import ActionRecord, IncidentMark, breaker, create_engine, session_factory, upgrade
from report_builder import repository
from report_builder.console import Console, ConsoleConfig
from report_builder.console.auth import LOGIN_COOKIE

TOKEN = "console-token-for-the-tests-0123"
HOSTILE = "<script>alert('x')</script>"
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


def _charts(html: str) -> list[dict]:
    """The chart data a page hands its script (one JSON block per group of charts)."""
    return [c for block in re.findall(r'<script type="application/json" class="chart-data">(.*?)</script>', html, re.S) for c in json.loads(block)]


def _event(cls, **overrides):
    return cls.model_validate({**json_examples(cls)[0], "event_id": str(uuid.uuid4()), **overrides})


@pytest.fixture
async def store(tmp_path):
    url = f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"
    upgrade(url)
    engine = create_engine(url)
    yield session_factory(engine)
    await engine.dispose()


@pytest.fixture
async def seeded(store):
    """A zombie incident whose evidence holds markup, a container death, a trace, an action, a
    cluster's and the pool's history, and an open breaker."""
    now = datetime.now(UTC)
    zombie = _event(IncidentOpened, occurred_at=now.isoformat(), evidence={"note": HOSTILE, "gpu_util_pct": 0})
    died = _event(
        IncidentOpened, incident_id=str(uuid.uuid4()), kind="container_died", node_id="gpu-node-09", severity="warning",
        occurred_at=(now - timedelta(minutes=5)).isoformat(), summary="container trainer exited 137: cgroup oom",
        evidence={"container": "trainer", "exit_code": 137, "oom_killed": True, "last_lines": "CUDA out of memory"},
        diagnosis={"cause": "cgroup_oom", "confidence": 0.9, "explanation": "the engine says OOMKilled",
                   "remedies": ["raise the container's memory limit"]},
    )
    t0 = now - timedelta(seconds=30)
    spans = [
        SpanRecord(trace_id=TRACE, span_id="a" * 16, parent_span_id=None, name="detect", service="zombie-detector",
                   started_at=t0, ended_at=t0 + timedelta(seconds=3), status="OK"),
        SpanRecord(trace_id=TRACE, span_id="b" * 16, parent_span_id="a" * 16, name="kill_gpu_processes", service="remediator",
                   started_at=t0 + timedelta(seconds=1), ended_at=t0 + timedelta(seconds=2), status="ERROR"),
    ]
    async with store() as session:
        for event in (zombie, died):
            await repository.record_event(session, event=event, subject=event.subject, trace_id=TRACE)
        await repository.record_spans(session, spans=spans)
        session.add(ActionRecord(
            action_id=str(uuid.uuid4()), incident_id=str(zombie.incident_id), node_id=zombie.node_id, attempt=1,
            operation={"operation": "kill_gpu_processes"}, requested_by="zombie-detector", reason="GPU idle with a job",
            status="succeeded", detail="killed pid 4242", steps=[], requested_at=now, started_at=now, finished_at=now,
            audit=[{"command": "kill -TERM 4242", "exit_status": 0, "output_sha256": "ab" * 32, "at_ms": 1.0, "took_ms": 2.0}],
        ))
        for minutes, leader in ((50, "peer-1"), (30, None), (10, "peer-2")):
            rows = [{"url": "http://10.0.0.2:8770/status", "state": "ok", "node_id": "peer-2", "role": "leader", "voter": True,
                     "answer_ms": 12.0, "jobs": 2, "gpu_percent": 3.5},
                    {"url": "http://10.0.0.9:8770/status", "state": "blocked", "answer_ms": 3000.0}] if leader == "peer-2" else []
            check = _event(ClusterChecked, occurred_at=(now - timedelta(minutes=minutes)).isoformat(), leader=leader, peers=rows)
            await repository.record_cluster_check(session, event=check)
        for minutes, queued in ((20, 12), (10, 3)):
            await repository.record_capacity_check(session, event=_event(
                CapacityEvaluated, occurred_at=(now - timedelta(minutes=minutes)).isoformat(), queued=queued, in_progress=2,
                cost_per_h=1.5, workers=2, worker_rows=[
                    {"worker_id": f"pod-{minutes}", "status": "running", "record_status": "active", "heartbeat_age_s": 42.0,
                     "host": "203.0.113.7:22041", "gpu_type": "H100", "gpus": 1, "price_per_h": 1.5, "task": HOSTILE, "in_service": True},
                ],
            ))
        await breaker.trip(session=session, reason="6 nodes needed action within 600s", now=now)
        await session.commit()
    return {"zombie": zombie, "died": died}


class Browser:
    """An HTTP client that keeps cookies and reads the forms' hidden fields, as a browser would."""

    def __init__(self, client: httpx.AsyncClient) -> None:
        self.client = client

    async def hidden(self, path: str, name: str) -> str:
        page = await self.client.get(path)
        found = re.search(rf'name="{name}" value="([^"]+)"', page.text)
        assert found, f"no {name} field on {path}"
        return found.group(1)

    async def login(self, token: str = TOKEN, name: str = "alice") -> httpx.Response:
        check = await self.hidden("/", "login_check")
        return await self.client.post("/login", data={"login_check": check, "token": token, "name": name, "back": "/ledger"})


@pytest.fixture
async def console(store):
    published = []

    async def publish(event):
        published.append(event)

    console = Console(store, ConsoleConfig(port=0, token=TOKEN), publish=publish)
    console.published = published
    await console.start()
    yield console
    await console.stop()


@pytest.fixture
async def browser(console):
    async with httpx.AsyncClient(base_url=console.url, follow_redirects=False, timeout=10) as client:
        yield Browser(client)


async def test_every_page_answers_with_what_the_store_holds(seeded, console, browser):
    zombie, died = seeded["zombie"], seeded["died"]
    get = browser.client.get
    fleet = await get("/")
    assert fleet.status_code == 200 and "gpu-node-07" in fleet.text and 'class="tile warning"' in fleet.text
    incidents = await get("/incidents")
    assert str(zombie.incident_id)[:8] in incidents.text and str(died.incident_id)[:8] in incidents.text
    page = await get(f"/incidents/{zombie.incident_id}")
    assert page.status_code == 200
    for text in ("kill -TERM 4242", "killed pid 4242", "GPU idle with a job", "kill_gpu_processes · remediator", TRACE):
        assert text in page.text
    assert page.text.count("<rect") == 2  # the waterfall: one bar per span
    # a time axis with five ticks, every bar at least 4 px wide, each span's attributes a click away
    assert page.text.count('<line class="grid"') == 5 and re.search(r'class="axis"[^>]*>0\.0 ms<', page.text)
    assert all(float(w) >= 4 for w in re.findall(r'<rect [^>]*width="([0-9.]+)"', page.text))
    assert page.text.count('<details class="span-detail">') == 2 and "UNSET" not in page.text
    postmortem = await get(f"/incidents/{died.incident_id}")
    assert "Container post-mortem" in postmortem.text and "cgroup oom (90% sure)" in postmortem.text
    assert "raise the container&#39;s memory limit" in postmortem.text
    cluster = await get("/cluster")
    assert "no leader" in cluster.text and "peer-2" in cluster.text
    (peers,) = _charts(cluster.text)
    assert [s["label"] for s in peers["series"]] == ["answering", "in all", "with a leader"] and peers["unit"] == "peers"
    assert len(peers["times"]) == len(peers["series"][0]["values"]) > 1
    assert "longest without a leader</dt><dd>20 min</dd>" in cluster.text and "% of 40 min</dd>" in cluster.text  # never 0:20:00
    # the latest check's per-peer table: state, role, vote, answer time, the leader's count of jobs and GPU %
    assert "<td>peer-2</td><td>ok</td><td>leader</td><td>yes</td><td>12 ms</td><td>2</td><td>3.5</td>" in cluster.text
    assert "<td>http://10.0.0.9:8770/status</td><td>blocked</td><td>-</td><td>-</td><td>3000 ms</td>" in cluster.text
    capacity = await get("/capacity")
    assert "$1.50/h now" in capacity.text
    assert [(c["id"], c["unit"]) for c in _charts(capacity.text)] == [("queue", "tasks"), ("gpus", "GPUs"), ("cost", "$/h")]
    assert "3 queued, 2 in progress" in capacity.text and "?" not in capacity.text.split("<h1>Capacity</h1>")[1].split("<form")[0]
    assert "no provider is configured" not in capacity.text
    # the latest round's workers table (runbook 001's): the worker, its heartbeat, host and task, escaped
    workers = capacity.text.split('id="workers"')[1].split("</table>")[0]
    assert "pod-10" in workers and "pod-20" not in workers and "42s ago" in workers and "203.0.113.7:22041" in workers
    assert "&lt;script&gt;" in workers and "<script>" not in workers
    ledger = await get("/ledger")
    assert "OPEN" in ledger.text and "6 nodes needed action within 600s" in ledger.text
    assert "reset the breaker" not in ledger.text  # no session: no operation offered


async def test_markup_in_the_store_is_shown_as_text_and_nothing_runs_but_the_console_script(seeded, console, browser):
    page = await browser.client.get(f"/incidents/{seeded['zombie'].incident_id}")
    assert HOSTILE not in page.text and "&lt;script&gt;alert(&#39;x&#39;)&lt;/script&gt;" in page.text
    # the console's script and the charting library it vendored, both from the console itself; chart data is inert JSON
    scripts = re.findall(r"<script[^>]*>", page.text)
    assert [s for s in scripts if "application/json" not in s] == [
        '<script src="/static/vendor/uPlot.iife.min.js" defer>', '<script src="/static/console.js" defer>',
    ]
    policy = page.headers["Content-Security-Policy"]
    assert "script-src 'self'" in policy and "default-src 'none'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"


async def test_the_incident_report_is_one_file_to_hand_on(seeded, console, browser):
    zombie = seeded["zombie"]
    report = await browser.client.get(f"/incidents/{zombie.incident_id}/report.html")
    assert report.status_code == 200
    assert report.headers["Content-Disposition"] == f'attachment; filename="gpumedic-incident-{str(zombie.incident_id)[:8]}-zombie_job.html"'
    assert "<script" not in report.text.replace("&lt;script", "") and "<style>" in report.text and "/static/" not in report.text
    assert "kill -TERM 4242" in report.text and str(zombie.incident_id) in report.text


async def test_the_list_filters_pages_and_says_what_is_wrong_with_a_filter(store, console, browser):
    base = datetime(2026, 11, 20, tzinfo=UTC)
    async with store() as session:
        for n in range(60):
            event = _event(IncidentOpened, incident_id=str(uuid.uuid4()), node_id=f"node-{n % 3}", kind="zombie_job" if n % 2 else "gpu_xid",
                           occurred_at=(base + timedelta(minutes=n)).isoformat())
            await repository.record_event(session, event=event, subject=event.subject, trace_id=None)
        await session.commit()
    first = await browser.client.get("/incidents")
    assert first.text.count("<tr class=") == 50 and 'rel="next"' in first.text
    second = await browser.client.get("/incidents?page=2")
    assert second.text.count("<tr class=") == 10 and 'rel="next"' not in second.text
    narrowed = await browser.client.get("/incidents?kind=gpu_xid&node=node-0")
    assert narrowed.text.count("<tr class=") == 10  # n even and n % 3 == 0
    window = await browser.client.get("/incidents?since=2026-11-20T00:10&until=2026-11-20T00:15")
    assert window.text.count("<tr class=") == 5
    for query, message in (("status=closed", "status must be one of open, resolved, escalated"),
                           ("since=last+week", "since must be a date and time"), ("page=two", "page must be a whole number")):
        bad = await browser.client.get(f"/incidents?{query}")
        assert bad.status_code == 400 and message in bad.text, query
    missing = await browser.client.get(f"/incidents/{uuid.uuid4()}")
    assert missing.status_code == 404 and "no incident" in missing.text
    assert (await browser.client.get("/incidents/..%2F..%2Fetc")).status_code in (400, 404)


async def test_without_a_session_nothing_can_be_changed(seeded, console, browser):
    for path in ("/breaker/reset", "/silences", f"/incidents/{seeded['zombie'].incident_id}/false-positive"):
        refused = await browser.client.post(path, data={"csrf": "guess", "reason": "r", "minutes": "5"})
        assert refused.status_code == 403 and "log in" in refused.text, path
    wrong = await browser.login(token="not-the-token-at-all")
    assert wrong.status_code == 403 and "wrong token" in wrong.text and TOKEN not in wrong.text
    async with store_open(console) as session:
        assert await breaker.open_trip(session=session) is not None
    assert console.published == []


def store_open(console):
    return console._db()


async def test_a_logged_in_operator_resets_the_breaker_marks_and_silences(seeded, console, browser):
    assert (await browser.login()).status_code == 303
    for page in ("/", "/incidents", "/cost"):  # while the breaker is open, every page says no action runs, and why
        text = (await browser.client.get(page)).text
        assert "No action runs on any node" in text and "6 nodes needed action within 600s" in text, page
    csrf = await browser.hidden("/ledger", "csrf")
    no_csrf = await browser.client.post("/breaker/reset", data={})
    assert no_csrf.status_code == 403 and "CSRF" in no_csrf.text
    for origin in ("https://evil.example", "null"):
        elsewhere = await browser.client.post("/breaker/reset", data={"csrf": csrf}, headers={"Origin": origin})
        assert elsewhere.status_code == 403 and "another origin" in elsewhere.text, origin
    reset = await browser.client.post("/breaker/reset", data={"csrf": csrf, "back": "/ledger"})
    assert reset.status_code == 303 and reset.headers["Location"].startswith("/ledger?done=breaker+reset")
    async with store_open(console) as session:
        assert await breaker.open_trip(session=session) is None
    assert "No action runs on any node" not in (await browser.client.get("/")).text  # gone at once

    zombie = seeded["zombie"]
    marked = await browser.client.post(f"/incidents/{zombie.incident_id}/false-positive", data={"csrf": csrf, "reason": "a benchmark's warm-up"})
    assert marked.status_code == 303
    async with store_open(console) as session:
        mark = await session.get(IncidentMark, (str(zombie.incident_id), "false_positive"))
    assert (mark.marked_by, mark.reason) == ("alice", "a benchmark's warm-up")

    for form, message in (({"minutes": "0", "reason": "x"}, "minutes must be above 0"),
                          ({"minutes": "soon", "reason": "x"}, "the silence was not set"),
                          ({"minutes": "30", "reason": "x", "kind": "not_a_kind"}, "kind"),
                          ({"minutes": "30", "reason": "x", "node": "bad node; rm -rf /"}, "node_id"),
                          ({"minutes": "30", "reason": "x", "matchers": "node=~gpu-0[7"}, "is not a regular expression")):
        bad = await browser.client.post("/silences", data={"csrf": csrf, **form})
        assert bad.status_code == 400 and message in bad.text, form
    assert console.published == []
    silenced = await browser.client.post("/silences", data={"csrf": csrf, "node": "gpu-node-07", "kind": "zombie_job", "minutes": "90",
                                                            "reason": "driver upgrade"})
    assert silenced.status_code == 303
    [added] = console.published
    assert isinstance(added, SilenceAdded) and (added.node_id, added.kind.value, added.created_by) == ("gpu-node-07", "zombie_job", "alice")
    assert timedelta(minutes=89) < added.ends_at - added.starts_at <= timedelta(minutes=90)
    lifted = await browser.client.post(f"/silences/{added.silence_id}/remove", data={"csrf": csrf})
    assert lifted.status_code == 303 and isinstance(console.published[-1], SilenceRemoved)
    racks = await browser.client.post("/silences", data={"csrf": csrf, "matchers": "node=~gpu-node-0[78] kind!=gpu_xid", "minutes": "30",
                                                         "reason": "rack 2 rewiring"})
    assert racks.status_code == 303
    assert [str(m) for m in console.published[-1].matchers] == ["node=~gpu-node-0[78]", "kind!=gpu_xid"]
    async with store_open(console) as session:
        await repository.record_silence(session, event=console.published[-1])
        await session.commit()
    assert "<code>node=~gpu-node-0[78]</code> <code>kind!=gpu_xid</code>" in (await browser.client.get("/ledger")).text

    out = await browser.client.post("/logout", data={"csrf": csrf})
    assert out.status_code == 303
    again = await browser.client.post("/breaker/reset", data={"csrf": csrf})
    assert again.status_code == 403


async def test_a_form_cannot_send_the_browser_elsewhere_after_it(seeded, console, browser):
    await browser.login()
    csrf = await browser.hidden("/ledger", "csrf")
    for back in ("https://evil.example/", "//evil.example/x", "javascript:alert(1)", "/\\evil.example/x", "\\\\evil.example/x",
                 "/\t/evil.example/x", "/%0a/x\n//evil.example"):
        done = await browser.client.post("/breaker/reset", data={"csrf": csrf, "back": back})
        assert done.headers["Location"].startswith("/ledger?done="), back


async def test_the_live_stream_says_when_something_changed(console, browser):
    async with browser.client.stream("GET", "/live", timeout=10) as stream:
        assert stream.headers["Content-Type"].startswith("text/event-stream")
        lines = stream.aiter_lines()
        console.changes.bump()
        got = await asyncio.wait_for(_next_event(lines), 5)
    assert got == "change"


async def _next_event(lines) -> str:
    async for line in lines:
        if line.startswith("event: "):
            return line.removeprefix("event: ")
    return ""


async def test_a_read_only_console_offers_no_login(store):
    console = Console(store, ConsoleConfig(port=0), publish=lambda e: None)
    await console.start()
    try:
        async with httpx.AsyncClient(base_url=console.url) as client:
            page = await client.get("/ledger")
            assert "read-only" in page.text and 'action="/login"' not in page.text
            refused = await client.post("/login", data={"token": "x", "name": "alice"})
            assert refused.status_code in (400, 403)
    finally:
        await console.stop()


async def test_a_port_in_use_stops_the_start_with_what_to_do(store, console):
    port = int(console.url.rsplit(":", 1)[1].strip("/"))
    second = Console(store, ConsoleConfig(port=port), publish=lambda e: None)
    with pytest.raises(RuntimeError, match=f"cannot listen on 127.0.0.1:{port}.*GPUMEDIC_REPORTS_CONSOLE_PORT"):
        await second.start()


async def test_a_service_that_lost_a_consumer_shows_as_a_banner_on_every_page_until_it_is_back(console, browser):
    from gpumedic_events import ServiceHeartbeat

    beat = ServiceHeartbeat(source="zombie-detector", service="zombie-detector", instance_id=uuid.uuid4(), state="ready",
                            consumers_missing=("zombie-detector-GpuXidReported",))
    await console.on_heartbeat(beat)
    for path in ("/", "/incidents", "/ledger"):
        page = await browser.client.get(path)
        assert "zombie-detector receives nothing of zombie-detector-GpuXidReported" in page.text, path
        assert "gpumedic provision" in page.text
    await console.on_heartbeat(beat.model_copy(update={"consumers_missing": (), "event_id": uuid.uuid4()}))
    assert "receives nothing" not in (await browser.client.get("/")).text
    stale = beat.model_copy(update={"occurred_at": datetime.now(UTC) - timedelta(minutes=5)})
    await console.on_heartbeat(stale)  # an old heartbeat says nothing about now
    assert "receives nothing" not in (await browser.client.get("/")).text


async def test_token_guesses_are_throttled_per_client_however_many_come_at_once(console, browser):
    check = await browser.hidden("/ledger", "login_check")

    async def guess(n: int) -> int:
        answer = await browser.client.post("/login", data={"login_check": check, "token": f"guess-{n}", "name": "mallory"})
        return answer.status_code

    statuses = await asyncio.gather(*(guess(n) for n in range(40)))
    assert statuses.count(403) == 5 and statuses.count(429) == 35  # five tries a minute, not 40 at once
    held = await browser.client.post("/login", data={"login_check": check, "token": TOKEN, "name": "alice"})
    assert held.status_code == 429 and int(held.headers["Retry-After"]) > 0


def test_the_throttle_holds_each_client_and_slows_wrong_tokens_from_everywhere_and_forgets_after_its_window():
    from report_builder.console.auth import LoginThrottle

    now = [0.0]
    throttle = LoginThrottle(per_client=2, in_total=3, window_s=60, delay_s=0.5, flood_delay_s=5, clock=lambda: now[0])
    assert [throttle.admit("a"), throttle.admit("a")] == [0.0, 0.0]
    assert throttle.admit("a") == 60.0  # its own limit
    assert [throttle.admit("b"), throttle.admit("c"), throttle.admit("d")] == [0.0, 0.0, 0.0]  # the total refuses no one
    assert [throttle.wrong() for _ in range(4)] == [0.5, 0.5, 0.5, 5.0]  # past the total, wrong tokens are slowed
    now[0] = 61.0
    assert throttle.admit("a") == 0.0 and throttle.wrong() == 0.5
    throttle.succeeded("a")  # a login that worked forgets its address's tries
    assert throttle.admit("a") == 0.0


async def test_logout_without_a_session_goes_back_to_the_fleet(console, browser):
    out = await browser.client.post("/logout", data={"csrf": "whatever"})
    assert out.status_code == 303 and out.headers["Location"].startswith("/?done=")
    await browser.login()
    csrf = await browser.hidden("/ledger", "csrf")
    assert (await browser.client.post("/logout", data={"csrf": "wrong"})).status_code == 403  # a live session still needs its form
    assert (await browser.client.post("/logout", data={"csrf": csrf})).status_code == 303


@pytest.mark.parametrize(
    ("config", "headers", "secure"),
    [
        ({}, {}, False),
        ({"public_url": "https://gpumedic.example.org"}, {}, True),  # behind a TLS-terminating proxy
        ({"trusted_proxies": ("127.0.0.1",)}, {"X-Forwarded-Proto": "https"}, True),
        ({}, {"X-Forwarded-Proto": "https"}, False),  # a header anyone can send is not believed
    ],
)
async def test_cookies_are_secure_whenever_the_console_is_reached_over_https(store, config, headers, secure):
    console = Console(store, ConsoleConfig(port=0, token=TOKEN, **config), publish=lambda e: None)
    await console.start()
    try:
        async with httpx.AsyncClient(base_url=console.url, headers=headers) as client:
            page = await client.get("/ledger")
            check = re.search(r'name="login_check" value="([^"]+)"', page.text).group(1)
            # (a Secure cookie is not sent back over plain http, so the test hands it back itself)
            client.cookies.set(LOGIN_COOKIE, check)
            answer = await client.post("/login", data={"login_check": check, "token": TOKEN, "name": "alice"})
        cookies = [v for k, v in answer.headers.multi_items() if k.lower() == "set-cookie"]
        assert answer.status_code == 303 and cookies
        assert all(("; secure" in c.lower()) == secure for c in cookies), cookies
    finally:
        await console.stop()


def test_durations_read_as_a_person_says_them():
    from report_builder.console.format import duration

    assert [duration(timedelta(seconds=s)) for s in (0, 12, 90.002, 252, 3600, 5400, 90061)] == [
        "0 s", "12 s", "1 min 30 s", "4 min 12 s", "1 h", "1 h 30 min", "1 d 1 h"]
    assert duration(None) == "-"


async def test_a_node_page_shows_its_last_sample_history_incidents_and_actions(store, tmp_path):
    """The node page reads the node's last sample (here handed in as the bus would), its history
    from the store, and its incidents; a hostile command line or disk path is text in the page and
    inert in the chart data; an unknown or malformed node is said to be so."""
    from gpumedic_events import DiskUsage, GpuProcess, GpuSample, HostSample, JobTag, NodeSampled, TopProcess
    from gpumedic_store import history

    now = datetime.now(UTC).replace(second=0, microsecond=0)
    hostile_disk = "/data</script><script>alert(1)</script>"

    def sample(at: datetime) -> NodeSampled:
        return NodeSampled(
            source="test", occurred_at=at, node_id="gpu-node-09", interval_s=5.0,
            gpus=(GpuSample(index=0, name="NVIDIA H100 80GB HBM3", utilization_gpu_pct=97, memory_used_mib=70_000, memory_total_mib=81_559,
                            temperature_c=71, power_w=650.0, power_limit_w=700.0, sm_clock_mhz=1980,
                            processes=(GpuProcess(pid=4242, command=f"python train.py {HOSTILE}", user="ml", age_s=5400.0,
                                                  container_id="ab" * 32, used_memory_mib=69_000,
                                                  job=JobTag(id="torchelastic:run-7", rank=3, world_size=16, nodes=2)),)),),
            host=HostSample(memory_total_mib=512_000, memory_available_mib=12_000, swap_total_mib=0, swap_used_mib=0, load_1m=40.0,
                            load_5m=38.0, load_15m=30.0, cpus=64,
                            disks=(DiskUsage(path=hostile_disk, total_bytes=10, used_bytes=9, available_bytes=1, used_pct=90.0),),
                            top_processes=(TopProcess(pid=4242, command=f"python train.py {HOSTILE}", user="ml", container_id="ab" * 32,
                                                      cpu_pct=390.0, memory_rss_mib=480_000),)),
        )

    async with store() as session, session.begin():
        for m in range(90, 0, -1):
            folder = history.MinuteFolder(now - timedelta(minutes=m))
            folder.add(sample(now - timedelta(minutes=m)))
            await history.write(session, {"gpu-node-09": [folder.minute_figures()]})
        died = _event(IncidentOpened, incident_id=str(uuid.uuid4()), kind="container_died", node_id="gpu-node-09", severity="warning",
                      occurred_at=(now - timedelta(minutes=5)).isoformat(), summary="container trainer exited 137: host oom")
        await repository.record_event(session, event=died, subject=died.subject, trace_id=None)

    latest = {"gpu-node-09": sample(now)}

    async def read_latest(node: str):
        return latest.get(node)

    console = Console(store, ConsoleConfig(port=0), publish=lambda e: asyncio.sleep(0), latest=read_latest)
    await console.start()
    try:
        async with httpx.AsyncClient(base_url=console.url.rstrip("/")) as client:
            page = await client.get("/nodes/gpu-node-09?window=6h")
            assert page.status_code == 200
            text = page.text
            assert "NVIDIA H100 80GB HBM3" in text and "650 / 700 W" in text and "1980 MHz" in text
            assert "68.4 GiB of 79.6 GiB" in text and "1 h 30 min" in text and "abababababab" in text  # a process: memory, age, container
            assert '<span title="job torchelastic:run-7">rank 3 of 16 on 2 nodes</span>' in text  # and the job it is a rank of
            assert "488.3 GiB used of 500.0 GiB" in text and "40.0, 38.0, 30.0 on 64 CPUs" in text
            assert HOSTILE not in text and "</script><script>alert(1)" not in text
            assert "1 container death(s)" in text and died.summary in text
            charts = {c["id"]: c for c in _charts(text)}
            assert list(charts) == ["gpu_util", "gpu_memory", "gpu_temperature", "gpu_power", "gpu_clock", "host_memory", "host_load", "disks"]
            assert charts["disks"]["series"][0]["label"] == hostile_disk  # inert data: JSON-escaped inside the script element
            assert [v for v in charts["gpu_util"]["series"][0]["values"] if v is not None] == [97.0] * 90  # the rest are gaps
            assert "390%" in text and "468.8 GiB" in text  # the busiest processes over the window

            # 90 minutes of history and no window asked for: 6 h, not 24 h of mostly empty chart
            fitted = (await client.get("/nodes/gpu-node-09")).text
            assert "<option selected>6h</option>" in fitted
            fitted_times = {c["id"]: c for c in _charts(fitted)}["gpu_util"]["times"]
            assert fitted_times[-1] - fitted_times[0] <= 6 * 3600

            as_json = (await client.get("/nodes/gpu-node-09/history.json?window=1h")).json()
            assert as_json["step_s"] == 60 and as_json["top_processes"][0]["pid"] == 4242
            assert len(as_json["times"]) == 60

            incident = await client.get(f"/incidents/{died.incident_id}")
            assert "gpu-node-09 around it" in incident.text and "Busiest processes from the hour before" in incident.text
            around = {c["id"]: c for c in _charts(incident.text)}
            assert list(around)[:2] == ["host_memory", "gpu_util"] and around["host_memory"]["marks"][0]["label"] == "opened"
            report = await client.get(f"/incidents/{died.incident_id}/report.html")
            assert "<script" not in report.text and "peak over the window" in report.text

            latest.clear()  # the samples stream no longer has it: the store still does
            gone = await client.get("/nodes/gpu-node-09")
            assert gone.status_code == 200 and "No sample of gpu-node-09 in the samples stream" in gone.text
            assert (await client.get("/nodes/nosuch-node")).status_code == 404
            bad = await client.get("/nodes/a.b*")
            assert bad.status_code == 400 and "is not a node id" in bad.text
            assert "window must be one of" in (await client.get("/nodes/gpu-node-09?window=5y")).text
    finally:
        await console.stop()


async def test_an_escalated_incident_reads_the_same_on_every_surface(store, console, browser, tmp_path):
    """Its severity and state as the detector and the escalation set them, and who acknowledged it:
    on its page, its node's tile, in `gpumedic report` and at Alertmanager; never promoted to
    critical, never 'closed'."""
    from gpumedic.report import Sources, build_report
    from report_builder.alertmanager import AlertmanagerPush

    now = datetime.now(UTC)
    opened = _event(IncidentOpened, node_id="gpu-node-05", kind="node_silent", severity="warning", occurred_at=(now - timedelta(minutes=3)).isoformat())
    escalated = _event(IncidentEscalated, incident_id=str(opened.incident_id), node_id="gpu-node-05", kind="node_silent",
                       occurred_at=now.isoformat(), reason="no sample for 3 min; a person must look")
    async with store() as session:
        for event in (opened, escalated):
            await repository.record_event(session, event=event, subject=event.subject, trace_id=None)
        await session.commit()
    fleet = (await browser.client.get("/")).text
    assert 'class="tile escalated"' in fleet and "node_silent (warning, escalated)" in fleet and "critical" not in fleet
    page = (await browser.client.get(f"/incidents/{opened.incident_id}")).text
    assert '<span class="pill escalated">escalated</span> <span class="pill warning">warning</span>' in page
    assert "<dt>escalated</dt>" in page and "<dt>closed</dt>" not in page

    await browser.login()
    csrf = await browser.hidden(f"/incidents/{opened.incident_id}", "csrf")
    acked = await browser.client.post(f"/incidents/{opened.incident_id}/acknowledge", data={"csrf": csrf, "reason": ""})
    assert acked.status_code == 303
    page = (await browser.client.get(f"/incidents/{opened.incident_id}")).text
    assert "acknowledged by alice at" in page and "looking into it" in page
    report = await build_report(Sources(store_url=f"sqlite+aiosqlite:///{tmp_path}/gpumedic.db"))
    (problem,) = report.problems
    assert (problem["severity"], problem["status"], problem["acknowledged_by"]) == ("warning", "escalated", "alice")
    (alert,) = await AlertmanagerPush(store, ["http://127.0.0.1:9"]).alerts()
    assert alert["labels"]["severity"] == "warning" and alert["annotations"]["acknowledged_by"] == "alice"
    assert alert["annotations"]["acknowledged_note"] == "acknowledged; looking into it"


async def test_a_fleet_operation_is_asked_of_the_remediator_behind_the_token_and_its_report_shown(seeded, console, browser):
    """The console's button for `gpumedic rollout`: nothing without a session, bad input refused
    before the bus, the request as the form says it, the report as the remediator answers (the bus
    and the remediator are the edge here; tests/e2e/test_rollout.py runs them for real)."""
    from gpumedic_events import ROLLOUT_SUBJECT, RolloutReport, RolloutRequest, RolloutStep

    form = {"operation": "restart_unit", "unit": "p2p-node.service", "nodes": "gpu-node-07, group:lambda", "batch": "2", "dry_run": "on"}
    refused = await browser.client.post("/rollouts", data={"csrf": "guess", **form})
    assert refused.status_code == 403 and "log in" in refused.text
    assert (await browser.login(name="alice smith")).status_code == 303
    csrf = await browser.hidden("/ledger", "csrf")
    assert 'id="rollout-form"' in (await browser.client.get("/ledger")).text
    unwired = await browser.client.post("/rollouts", data={"csrf": csrf, **form})
    assert unwired.status_code == 503 and "gpumedic rollout" in unwired.text

    asked: list[RolloutRequest] = []

    async def remediator(subject: str, body: bytes, timeout_s: float) -> bytes:
        assert subject == ROLLOUT_SUBJECT and timeout_s >= 600
        request = RolloutRequest.from_json(body)
        asked.append(request)
        steps = (RolloutStep(batch=1, node_id="gpu-node-07", status="succeeded", detail=f"restarted {HOSTILE}"),
                 RolloutStep(batch=2, node_id="gpu-node-08", status="failed", detail="is failed, not active"))
        return RolloutReport(rollout_id=uuid.uuid4(), operation=request.operation, dry_run=request.dry_run,
                             batches=(("gpu-node-07",), ("gpu-node-08",)), steps=steps,
                             stopped="after batch 2 of 2: gpu-node-08 failed").to_json()

    console._ask = remediator
    page = await browser.client.post("/rollouts", data={"csrf": csrf, **form})
    assert page.status_code == 200, page.text
    (request,) = asked
    assert (request.operation, request.unit, request.nodes, request.batch, request.dry_run, request.requested_by) == (
        "restart_unit", "p2p-node.service", ("gpu-node-07", "group:lambda"), 2, True, "alice-smith")
    assert "restart_unit on 2 node(s) in 2 batch(es): a dry run, nothing ran" in page.text
    assert "stopped</strong>: after batch 2 of 2: gpu-node-08 failed" in page.text and HOSTILE not in page.text
    for bad, why in (({"operation": "reboot_everything"}, "operation"), ({"unit": ""}, "restart_unit needs unit"),
                     ({"nodes": "n" * 201}, "not a node selector"), ({"batch": "many"}, "")):
        wrong = await browser.client.post("/rollouts", data={"csrf": csrf, **form, **bad})
        assert wrong.status_code == 400 and "nothing ran" in wrong.text and why in wrong.text, bad
    assert len(asked) == 1 and console.published == []


async def test_the_cluster_page_draws_who_sees_whom_and_marks_a_pair_seen_one_way(store, console, browser):
    """Runbook 002's asymmetric connectivity: lambda-1 sees the Hetzner peers, they do not see it."""
    rows = [
        {"url": "http://h1:8770/status", "state": "ok", "node_id": "hetzner-1", "answer_ms": 9.0, "sees": ["hetzner-2"]},
        {"url": "http://h2:8770/status", "state": "ok", "node_id": "hetzner-2", "answer_ms": 9.0, "sees": ["hetzner-1"]},
        {"url": "http://l1:8770/status", "state": "ok", "node_id": "lambda-1", "answer_ms": 9.0, "sees": ["hetzner-1", "hetzner-2"]},
        {"url": "http://l2:8770/status", "state": "blocked", "answer_ms": 3000.0},
    ]
    async with store() as session:
        await repository.record_cluster_check(session, event=_event(ClusterChecked, occurred_at=datetime.now(UTC).isoformat(), peers=rows))
        await session.commit()
    page = (await browser.client.get("/cluster")).text
    assert "Who sees whom" in page
    matrix = page[page.index("Who sees whom"):page.index("<h2>Leaders")]
    lambda_row = re.search(r"<tr><th>lambda-1</th>(.*?)</tr>", matrix).group(1)
    assert lambda_row.count('class="warning">&rarr;') == 2  # it sees both, neither sees it
    hetzner_row = re.search(r"<tr><th>hetzner-1</th>(.*?)</tr>", matrix).group(1)
    assert "&#10003;" in hetzner_row and "&middot;" in hetzner_row and "&rarr;" not in hetzner_row
