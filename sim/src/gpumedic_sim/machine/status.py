"""The simulated node's peer status endpoint: `GET /status` -> JSON, like a P2P job cluster's,
and `GET /health`.

A tiny asyncio HTTP server, no framework: it answers one request per connection. The node's
job count appears as `selfplay_jobs`, which the node-sampler's status probe reads; the rest is
the peer cluster as this node's daemon sees it (`gpumedic_sim.machine.cluster`), which leader-health probes. With the "blocked event loop" faults the port still
accepts TCP but never answers: in one the daemon takes the connection and says nothing, in the
other it never accepts it, and connections pile up in the kernel's queue.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import socket
from typing import Protocol

from gpumedic_sim.machine.cluster import PeerCluster

log = logging.getLogger(__name__)

_READ_TIMEOUT_S = 5.0
UNACCEPTED_BACKLOG = 128
"""The listen backlog of a daemon that stopped accepting (aiohttp's default): how many connections
wait before new ones are dropped."""


class DaemonNode(Protocol):
    """What the daemon's status endpoint reads of its node (`NodeState`'s)."""

    node_id: str
    cluster: PeerCluster
    status_blocked: bool
    status_lag_s: float

    @property
    def counted_jobs(self) -> int | None: ...


class StatusEndpoint:
    def __init__(self, node: DaemonNode) -> None:
        self.node = node
        self.port: int | None = None
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.StreamWriter] = set()
        self._handlers: set[asyncio.Task] = set()
        self._unaccepting: socket.socket | None = None
        """The port's socket while the daemon's loop accepts nothing (`stop_accepting`)."""

    def document(self) -> dict:
        """The runbooks' daemon's shape: `peers` keyed by node id (every member it knows, with
        whether it counts it alive, whether it votes, and the jobs and GPU % the cluster counts
        on it), voters alive of voters in all, and its own job count."""
        node, cluster = self.node, self.node.cluster
        status = cluster.status(node.node_id)
        alive = set(status["peers"])
        peers = {}
        for member in cluster.joined:
            if member == node.node_id:
                continue
            peers[member] = {"alive": member in alive, "is_voter": member in cluster.voters}
            load = cluster.loads(member) if cluster.loads is not None else None
            if load is not None:
                peers[member] |= {"gpu_percent": load[1]} | ({"selfplay_jobs": load[0]} if load[0] is not None else {})
        jobs = node.counted_jobs
        return {**status, "peers": peers} | ({"selfplay_jobs": jobs} if jobs is not None else {})

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> int:
        """Listen on `port` (0: any free one; a restarted daemon takes its old one back)."""
        self._close_unaccepting()
        self._server = await asyncio.start_server(self._handle, host, port, reuse_address=True)
        self.port = self._server.sockets[0].getsockname()[1]
        return self.port

    async def stop_accepting(self, host: str) -> None:
        """The daemon's event loop blocks before it calls accept() (runbook 002): the kernel still
        completes each handshake, so the port "accepts", and the connection waits in the socket's
        queue (ss -ltn's Recv-Q) until it is full and new ones are dropped. A restart listens again."""
        port = self.port
        await self.stop()
        plain = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        plain.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        plain.bind((host, port or 0))
        plain.listen(UNACCEPTED_BACKLOG)
        self._unaccepting = plain
        self.port = plain.getsockname()[1]

    def _close_unaccepting(self) -> None:
        """Its waiting connections are reset with it, as when a blocked daemon's process ends."""
        if self._unaccepting is not None:
            self._unaccepting.close()
            self._unaccepting = None

    async def stop(self) -> None:
        self._close_unaccepting()
        if self._server is None:
            return
        self._server.close()
        # A blocked endpoint holds connections open, and a client may have connected without asking
        # yet: close them all, and let each handler see the end and return. Python 3.11's
        # wait_closed does not wait for handlers, and one still running when the loop ends is
        # cancelled, which 3.11's stream callback reports as an error with a traceback.
        for writer in list(self._connections):
            writer.close()
        if self._handlers:
            await asyncio.wait(self._handlers, timeout=_READ_TIMEOUT_S)
        await self._server.wait_closed()
        self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._connections.add(writer)
        handler = asyncio.current_task()
        self._handlers.add(handler)
        try:
            if self.node.status_blocked:
                await reader.read()  # until the client gives up
                return
            try:
                head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT_S)
            except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, TimeoutError):
                return
            request = head.decode("latin-1").split("\r\n", 1)[0].split()
            if self.node.status_lag_s:
                await asyncio.sleep(self.node.status_lag_s)
            if len(request) != 3:
                writer.write(_response(400, {"error": "bad request"}))
            elif request[0] != "GET":
                writer.write(_response(405, {"error": "only GET"}))
            elif request[1].split("?", 1)[0] == "/health":
                writer.write(_response(200, {"healthy": True}))
            elif request[1].split("?", 1)[0] != "/status":
                writer.write(_response(404, {"error": "not found"}))
            else:
                writer.write(_response(200, self.document()))
            await writer.drain()
        except (ConnectionError, OSError):
            log.debug("%s: status client went away", self.node.node_id)
        finally:
            self._connections.discard(writer)
            self._handlers.discard(handler)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()


_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed"}


def _response(status: int, body: dict) -> bytes:
    payload = json.dumps(body).encode()
    head = (
        f"HTTP/1.1 {status} {_REASONS[status]}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(payload)}\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode("ascii") + payload
