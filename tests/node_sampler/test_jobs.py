"""Job probes against a real tiny HTTP server, a proc root, and files that grow."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import subprocess
import sys
import uuid

import pytest

from node_sampler.jobs import OutputGrowthProbe, ProbeError, ProcessPatternProbe, StatusEndpointProbe, compile_jobs_path, count_at
from node_sampler.procs import ProcessInfo
from tests.node_sampler.fakes import FakeProcessTable


class TinyServer:
    """Answers every request with `self.answer` (raw bytes), or never answers if it is None."""

    def __init__(self) -> None:
        self.answer: bytes | None = b""
        self.requests: list[bytes] = []
        self._server: asyncio.Server | None = None
        self._writers: set[asyncio.StreamWriter] = set()

    async def __aenter__(self) -> TinyServer:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self

    async def __aexit__(self, *exc) -> None:
        self._server.close()
        for w in self._writers:
            w.close()
        await self._server.wait_closed()

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/status"

    def json(self, body, status: str = "200 OK") -> None:
        self.raw(json.dumps(body).encode(), status)

    def raw(self, payload: bytes, status: str = "200 OK") -> None:
        self.answer = (
            f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(payload)}\r\n\r\n".encode()
            + payload
        )

    async def _handle(self, reader, writer) -> None:
        self._writers.add(writer)
        try:
            self.requests.append(await reader.readuntil(b"\r\n\r\n"))
            if self.answer is None:
                await reader.read()
                return
            writer.write(self.answer)
            await writer.drain()
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


@pytest.fixture
async def server():
    async with TinyServer() as s:
        yield s


async def test_good_answer(server):
    server.json({"node_id": "n1", "selfplay_jobs": 3, "leader": None})
    reading = await StatusEndpointProbe(server.url).observe()
    assert (reading.running, reading.errors) == (3, ())
    assert server.requests[0].startswith(b"GET /status HTTP/1.1\r\n")
    assert b"Host: 127.0.0.1:" in server.requests[0]


async def test_nested_path(server):
    server.json({"p2p": {"jobs": [{"count": 7}]}})
    assert (await StatusEndpointProbe(server.url, "p2p.jobs[0].count").observe()).running == 7


async def test_malformed_answer(server):
    server.raw(b"{not json")
    reading = await StatusEndpointProbe(server.url).observe()
    assert reading.running is None
    assert reading.errors == (f"status probe {server.url}: answer is not JSON",)


@pytest.mark.parametrize("value", ["3", 2.5, True, None, -1, [1]])
async def test_non_integer_or_negative_value(server, value):
    server.json({"selfplay_jobs": value})
    reading = await StatusEndpointProbe(server.url).observe()
    assert reading.running is None
    assert len(reading.errors) == 1 and "selfplay_jobs" in reading.errors[0]


async def test_missing_key(server):
    server.json({"jobs": 1})
    reading = await StatusEndpointProbe(server.url).observe()
    assert reading.running is None and "no 'selfplay_jobs'" in reading.errors[0]


async def test_http_error_status(server):
    server.json({"selfplay_jobs": 1}, status="503 Service Unavailable")
    reading = await StatusEndpointProbe(server.url).observe()
    assert reading.running is None and reading.errors[0].endswith("HTTP 503")


async def test_timeout(server):
    server.answer = None  # accepts TCP, never answers: a blocked event loop
    loop = asyncio.get_running_loop()
    started = loop.time()
    reading = await StatusEndpointProbe(server.url, timeout_s=0.2).observe()
    assert loop.time() - started < 2
    assert reading.running is None
    assert reading.errors == (f"status probe {server.url}: no answer within 0.2s",)


async def test_chunked_answer(server):
    body = json.dumps({"selfplay_jobs": 12}).encode()
    server.answer = (
        b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
        + f"{5:x}\r\n".encode() + body[:5] + b"\r\n"
        + f"{len(body) - 5:x}\r\n".encode() + body[5:] + b"\r\n0\r\n\r\n"
    )
    assert (await StatusEndpointProbe(server.url).observe()).running == 12


async def test_nobody_listening():
    reading = await StatusEndpointProbe("http://127.0.0.1:1/status", timeout_s=1).observe()
    assert reading.running is None and len(reading.errors) == 1


def test_the_job_count_expression_finds_a_count_or_says_what_it_found():
    def count(document, path):
        return count_at(document, compile_jobs_path(path), path)

    with pytest.raises(ProbeError, match="no 'a\\[5\\]' in the answer"):
        count({"a": [1]}, "a[5]")
    with pytest.raises(ProbeError, match="is str, not an integer"):
        count({"a": "7"}, "a")
    with pytest.raises(ProbeError, match="is negative"):
        count({"a": -1}, "a")
    assert count({"peers": {"gpu.node-07": {"selfplay_jobs": 3}}}, 'peers."gpu.node-07".selfplay_jobs') == 3  # ids with dots
    assert count({"a": None, "b": 2}, "not_null(a, b)") == 2
    with pytest.raises(ValueError, match="is not a JMESPath expression"):
        compile_jobs_path("a.5")


async def test_process_pattern_counts_matching_command_lines():
    table = FakeProcessTable(
        {
            10: ProcessInfo(10, 1, "python -m selfplay --gpu 0"),
            11: ProcessInfo(11, 2, "python -m selfplay --gpu 1"),
            12: ProcessInfo(12, 3, "sshd: /usr/sbin/sshd -D"),
        }
    )
    reading = await ProcessPatternProbe(re.compile(r"-m selfplay\b"), table).observe()
    assert (reading.running, reading.errors) == (2, ())


async def test_process_pattern_on_the_real_proc():
    """Two processes started with a marker in their command line are counted, and only they: a scan
    that found nothing would fail here, not pass."""
    from node_sampler.procs import ProcFsTable

    marker = f"gpumedic-job-{uuid.uuid4().hex[:12]}"
    pattern = rf"{marker}-(one|two)\b"
    jobs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", f"{marker}-{n}"]) for n in ("one", "two")]
    try:
        assert (await ProcessPatternProbe(pattern, ProcFsTable()).observe()).running == 2
        jobs[0].kill()
        jobs[0].wait()
        assert (await ProcessPatternProbe(pattern, ProcFsTable()).observe()).running == 1
    finally:
        for job in jobs:
            job.kill()
            job.wait()
    assert (await ProcessPatternProbe(pattern, ProcFsTable()).observe()).running == 0


async def test_output_growth_on_files(tmp_path):
    out = tmp_path / "games"
    out.mkdir()
    (out / "a.jsonl").write_text("x" * 10)
    missing = tmp_path / "nope"
    probe = OutputGrowthProbe.for_paths([out, missing])

    first = await probe.observe()
    assert first.output_growing is None  # no baseline yet
    assert first.errors == (f"output probe: {missing}: missing",)
    assert (await probe.observe()).output_growing is False
    (out / "sub").mkdir()
    (out / "sub" / "b.jsonl").write_text("y")
    assert (await probe.observe()).output_growing is True
    assert (await probe.observe()).output_growing is False


async def test_output_probe_that_fails_says_so():
    def broken():
        raise PermissionError

    reading = await OutputGrowthProbe(broken).observe()
    assert reading.output_growing is None and reading.errors == ("output probe: PermissionError",)
