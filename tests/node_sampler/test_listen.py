"""The accept queue of the node's own daemon (runbook 002: "TCP connections succeed, HTTP requests
time out, connection backlog grows (26-33 pending connections)"), read from the real kernel over
sock_diag: a socket that listens and never accepts stands for a daemon whose event loop blocked."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time

import pytest

from gpumedic_events import ListenBacklogReported
from node_sampler.listen import ListenQueue
from node_sampler.sampler import Sampler
from tests.node_sampler.fakes import table_for_two_gpus, two_gpus


@pytest.fixture
def blocked_daemon():
    """A port that listens (backlog 16) and accepts nothing, and a way to connect to it."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(16)
    clients: list[socket.socket] = []

    def connect(n: int) -> None:
        for _ in range(n):
            clients.append(socket.create_connection(server.getsockname(), timeout=2))
        deadline = time.monotonic() + 2  # the kernel queues each once the handshake completes
        while ListenQueue(server.getsockname()[1]).read().waiting < len(clients) and time.monotonic() < deadline:
            time.sleep(0.01)

    yield server.getsockname()[1], connect, server
    for c in clients:
        c.close()
    server.close()


def test_the_queue_counts_the_connections_the_daemon_did_not_accept_on_its_own_port_only(blocked_daemon):
    port, connect, server = blocked_daemon
    other = socket.socket(socket.AF_INET6)
    other.bind(("::1", 0))
    other.listen(4)
    with other, socket.create_connection(("::1", other.getsockname()[1])):
        assert ListenQueue(port).read().waiting == 0 and ListenQueue(port).read().limit == 16
        connect(5)
        backlog = ListenQueue(port).read()
        assert (backlog.waiting, backlog.limit) == (5, 16)
        server.accept()[0].close()  # the loop runs once: one fewer waits
        assert ListenQueue(port).read().waiting == 4
        assert ListenQueue(other.getsockname()[1]).read().waiting == 1, "IPv6 sockets are read too"
    server.close()
    assert ListenQueue(port).read() is None, "nothing listens: the daemon is down, which the status probe says"


def test_only_a_loopback_status_url_names_a_queue_this_node_can_read():
    assert ListenQueue.of_status_url("http://127.0.0.1:8770/status").port == 8770
    assert ListenQueue.of_status_url("http://[::1]:8770/status").port == 8770
    assert ListenQueue.of_status_url("https://localhost/status").port == 443
    for url in ("http://10.0.0.9:8770/status", "http://gpu-node-07:8770/status", "http://127.0.0.1:99999/", None, ""):
        assert ListenQueue.of_status_url(url) is None, url
    with pytest.raises(ValueError, match="not a TCP port"):
        ListenQueue(0)


async def test_the_sampler_says_so_while_connections_pile_up_and_once_when_they_drained(blocked_daemon):
    port, connect, server = blocked_daemon
    published: list = []

    async def publish(event) -> None:
        published.append(event)

    def reports() -> list[ListenBacklogReported]:
        return [e for e in published if isinstance(e, ListenBacklogReported)]

    async def samples(n: int) -> None:
        seen = sum(1 for e in published if not isinstance(e, ListenBacklogReported))
        deadline = time.monotonic() + 10
        while sum(1 for e in published if not isinstance(e, ListenBacklogReported)) < seen + n and time.monotonic() < deadline:
            await asyncio.sleep(0.02)
        await asyncio.sleep(0.05)  # the immediate events go out beside the samples

    sampler = Sampler("gpu-node-07", two_gpus(), table_for_two_gpus(), [], 0.1, listen=ListenQueue(port))
    task = asyncio.create_task(sampler.run(publish))
    try:
        await samples(2)
        connect(1)
        await samples(2)
        assert reports() == [], "one connection waiting for an instant is any busy daemon"
        connect(11)
        await samples(2)
        first = reports()[0]
        assert (first.node_id, first.port, first.waiting, first.limit) == ("gpu-node-07", port, 12, 16)
        while True:
            try:
                server.setblocking(False)
                server.accept()[0].close()
            except BlockingIOError:
                break
        await samples(3)
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        sampler.close()
    said = [r.waiting for r in reports()]
    assert said[-1] == 0 and said.count(0) == 1 and all(w == 12 for w in said[:-1]), said
