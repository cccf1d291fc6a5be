"""The runbooks' own peer daemon, written from the runbooks' commands alone (`curl -s
http://leader:8770/status | jq '.peers["NODE_ID"]'`, "Voters: 5/8 (quorum OK)", "Leader: None",
`curl -X POST http://localhost:8770/force_election`), not from the simulated fleet: one real HTTP
server per peer on loopback. `peers` is an object keyed by node id, each value that peer's jobs
and GPU %; quorum is the voters'."""

from __future__ import annotations

import asyncio
import contextlib
import json

# The log's peers: 18 listed, the voters among them, names with dots as rented hosts have them.
PEERS = [
    "hetzner-cpu1", "hetzner-cpu2", "hetzner-cpu3", "lambda-gh200-1", "lambda-gh200-2", "lambda-gh200-3", "lambda-gh200-4",
    "mac-studio", "local-mac", "nebius-h100-1", "nebius.h100-3", "vast-29118471", "vast-29126088", "vultr-a100-20gb",
    "macbook-pro-3", "macbook-pro-4", "nebius-backbone-1", "test",
]
VOTERS = ["hetzner-cpu1", "hetzner-cpu2", "hetzner-cpu3", "nebius.h100-3", "vultr-a100-20gb", "mac-studio", "local-mac", "lambda-gh200-1"]


def runbook_status(node: str, *, answering: list[str], leader: str | None, voters_alive: int, voters_total: int = 8) -> dict:
    """A daemon's /status as the runbooks read it."""
    return {
        "node_id": node,
        "role": "leader" if leader == node else "follower",
        "leader_id": leader,
        "voters_alive": voters_alive,
        "voters_total": voters_total,
        "quorum_ok": voters_alive >= voters_total // 2 + 1,
        "uptime_seconds": 1500.0,
        "peers": {
            peer: {"alive": peer in answering, "is_voter": peer in VOTERS, "selfplay_jobs": 2 if peer.startswith("lambda") else 0,
                   "gpu_percent": 3.5 if peer.startswith("lambda") else 0.0}
            for peer in PEERS if peer != node
        },
        "idle_detection_stats": {"zombie_nodes": []},
    }


class RunbookCluster:
    """One daemon per answering peer on loopback; the rest refuse connections (their P2P is down)."""

    def __init__(self) -> None:
        self.documents: dict[str, object] = {}
        self.lag_s: dict[str, float] = {}
        """Per node: how long its event loop lags before each answer."""
        self.ports: dict[str, int] = {}
        self.resets: list[tuple[str, dict, str | None]] = []
        """The job-count resets the daemons took: (on which daemon, its body, its Authorization header)."""
        self._servers: dict[str, asyncio.Server] = {}

    async def start(self) -> list[str]:
        for node in PEERS:
            server = await asyncio.start_server(lambda r, w, node=node: self._answer(node, r, w), "127.0.0.1", 0)
            self.ports[node] = server.sockets[0].getsockname()[1]
            self._servers[node] = server
        return [f"http://127.0.0.1:{self.ports[n]}/status" for n in PEERS]

    async def _answer(self, node: str, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, asyncio.IncompleteReadError):
            head = await reader.readuntil(b"\r\n\r\n")
            await asyncio.sleep(self.lag_s.get(node, 0.0))
            document = self.documents[node]
            method, path = head.split(b" ", 2)[:2]
            if method == b"POST" and path == b"/admin/reset_node_jobs":
                # the runbook's Option 3: `curl -X POST http://leader:8770/admin/reset_node_jobs -d '{"node_id": "..."}'`
                headers = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:] if ": " in line)
                asked = json.loads(await reader.readexactly(int(headers.get("Content-Length", "0"))))
                self.resets.append((node, asked, headers.get("Authorization")))
                for other in self.documents.values():
                    if asked.get("node_id") in other["peers"]:
                        other["peers"][asked["node_id"]]["selfplay_jobs"] = 0
            body = json.dumps(document).encode() if path == b"/status" else b'{"status": "ok"}'
            writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n" % len(body) + body)
            await writer.drain()
        writer.close()

    async def stop(self) -> None:
        for server in self._servers.values():
            server.close()
            await server.wait_closed()

    async def state(self, answering: list[str], *, leader: str | None, voters_alive: int, voters_total: int = 8) -> None:
        """The peers not answering have their daemon down: nothing listens on their port any more."""
        self.documents = {n: runbook_status(n, answering=answering, leader=leader, voters_alive=voters_alive, voters_total=voters_total)
                          for n in answering}
        for node in set(PEERS) - set(answering):
            self._servers[node].close()


ANSWERING = ["hetzner-cpu1", "hetzner-cpu2", "lambda-gh200-2", "nebius-h100-1", "nebius.h100-3", "vast-29118471", "vast-29126088", "vultr-a100-20gb"]
