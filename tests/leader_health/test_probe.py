"""leader-health's layered probe against real sockets on loopback: a dead daemon, a blocked event
loop and a healthy peer are told apart, and every bad answer is a finding with its reason."""

from __future__ import annotations

import asyncio
import contextlib
import json
import socket

import pytest

from leader_health.probe import MAX_ANSWER_BYTES, probe, probe_all

GOOD = {"node_id": "p1", "leader": "p1", "peers": ["p1", "p2"], "role": "leader", "voters": 2, "quorum": True}


def _http(status: int, body: bytes, headers: str = "") -> bytes:
    return f"HTTP/1.1 {status} X\r\nContent-Length: {len(body)}\r\nConnection: close\r\n{headers}\r\n".encode() + body


@contextlib.asynccontextmanager
async def peer(status_answer: bytes | None, health_answer: bytes | None = None, *, silent: bool = False):
    """A peer daemon on loopback: answers /health and /status as given; `silent` accepts TCP and says nothing."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            if silent:
                await reader.read()
                return
            head = await reader.readuntil(b"\r\n\r\n")
            path = head.split(b" ", 2)[1]
            answer = (health_answer if health_answer is not None else _http(404, b"")) if path == b"/health" else status_answer
            writer.write(answer or b"")
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/status"
    finally:
        server.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(server.wait_closed(), 1)


async def _probe(url: str, timeout_s: float = 10.0):
    """Patient by default: a loaded test machine can take over half a second to answer locally."""
    return await probe(url, connect_timeout_s=timeout_s, http_timeout_s=timeout_s)


async def test_a_healthy_peer_gives_its_status_with_or_without_a_health_endpoint():
    async with peer(_http(200, json.dumps(GOOD).encode()), _http(200, b"{}")) as url:
        answer = await _probe(url)
    assert answer.state == "ok" and answer.status.leader == "p1" and answer.status.peers == ("p1", "p2")
    async with peer(_http(200, json.dumps(GOOD).encode())) as url:  # /health: 404
        assert (await _probe(url)).state == "ok"


async def test_a_dead_daemon_a_blocked_event_loop_and_a_sick_one_are_told_apart():
    with socket.socket() as s:  # a port nobody listens on: the daemon crashed
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    down = await _probe(f"http://127.0.0.1:{port}/status")
    assert down.state == "down" and "refuses connections" in down.detail
    async with peer(None, silent=True) as url:
        blocked = await _probe(url, timeout_s=0.5)
    assert blocked.state == "blocked" and "accepts TCP but HTTP does not answer within 0.5s" in blocked.detail
    async with peer(_http(200, json.dumps(GOOD).encode()), _http(503, b"")) as url:
        sick = await _probe(url)
    assert (sick.state, sick.detail) == ("unhealthy", "/health answered HTTP 503")


@pytest.mark.parametrize(
    ("answer", "reason"),
    [
        (_http(200, b"{not json"), "/status is not JSON"),
        (_http(200, b"[1, 2]"), "/status is a JSON array, not an object"),
        (_http(200, json.dumps({"leader": "p1"}).encode()),
         "does not fit the policy's peer_status: node_id ('not_null(node_id, self.node_id, node)') found nothing, not a text"),
        (_http(200, json.dumps({**GOOD, "voters": -1}).encode()), "voters_alive ('not_null(voters_alive, alive_voters, voters.alive, voters)') "
         "found a JSON number -1, not a count of 0 or more"),
        (_http(302, b"", "Location: http://evil.example/status\r\n"), "/status redirects to 'http://evil.example/status'; redirects are not followed"),
        (_http(200, b"[" + b"0," * (MAX_ANSWER_BYTES // 2) + b"0]"), "the answer is larger than 1024 KiB"),
        (b"SSH-2.0-OpenSSH_9.2\r\n\r\n", "not an HTTP answer"),
        (_http(500, b"oops"), "/status answered HTTP 500"),
    ],
)
async def test_bad_answers_are_findings_with_their_reason(answer, reason):
    async with peer(answer) as url:
        result = await _probe(url)
    assert result.state == "bad_answer" and reason in result.detail and result.status is None


async def test_a_daemon_that_answers_chunked_and_keeps_its_connections_is_read_whole():
    """A real web framework may stream its JSON (Transfer-Encoding: chunked) and keep the connection
    for a next request: both are HTTP/1.1 as RFC 9112 has it, not bad answers."""
    body = json.dumps(GOOD).encode()
    chunks = b"".join(f"{len(body[i:i + 7]):x}\r\n".encode() + body[i:i + 7] + b"\r\n" for i in range(0, len(body), 7)) + b"0\r\n\r\n"
    connections = 0

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        nonlocal connections
        connections += 1
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                if head.split(b" ", 2)[1] == b"/health":
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n{}")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n" + chunks)
                await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    try:
        answer = await _probe(f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/status")
    finally:
        server.close()
    assert answer.state == "ok" and answer.status.leader == "p1", answer.detail
    assert connections == 3  # the TCP layer's own connect, then /health and /status asked together, each on its own


async def test_a_url_that_is_not_plain_http_is_refused_without_a_connection():
    result = await _probe("https://10.0.0.1/status")
    assert result.state == "bad_answer" and "only http://host:port/path status URLs are probed" in result.detail


async def test_many_peers_are_probed_at_a_bounded_concurrency_in_order():
    async with peer(_http(200, json.dumps(GOOD).encode())) as good, peer(None, silent=True) as blocked:
        answers = await probe_all([good, blocked, good] * 10, connect_timeout_s=1.5, http_timeout_s=1.5, concurrency=4)
    assert [a.state for a in answers] == ["ok", "blocked", "ok"] * 10


async def test_a_host_that_cannot_be_reached_is_unreachable_not_down():
    # .invalid never resolves (RFC 2606): no host to connect to, as with a dead host's timeout.
    result = await probe("http://peer.invalid:8770/status", connect_timeout_s=1.0, http_timeout_s=0.3)
    assert result.state == "unreachable" and "peer.invalid:8770" in result.detail
