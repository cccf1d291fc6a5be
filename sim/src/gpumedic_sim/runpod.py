"""RunPod's documented REST v1 pod endpoints on loopback (`POST /v1/pods`, `GET /v1/pods`,
`DELETE /v1/pods/{id}`, a bearer key), so the real RunPod provider code in the autoscaler and the
remediator talks to a simulated provider exactly as it would to RunPod.

`RunPodServer` is the HTTP side (parsing, the key, a log of requests, and two ways to answer
badly: `override` for GET /pods, `silent` to never answer); `SimRunPod` answers from a
`SimProvider`, which `gpumedic sim` rents its workers from. Loopback only, one request per
connection.
"""

from __future__ import annotations

import asyncio
import json
from datetime import datetime

from gpumedic_providers.base import ProviderError, Worker
from gpumedic_providers.sim import SimProvider


class RunPodServer:
    def __init__(self, key: str) -> None:
        self.key = key
        self.requests: list[tuple[str, str, dict | None]] = []
        self.override: tuple[int, bytes] | None = None
        """An answer for GET /pods instead of the pods (a provider that answers nonsense)."""
        self.silent = False
        """Never answer (a provider that times out)."""
        self._server: asyncio.Server | None = None

    @property
    def base_url(self) -> str:
        if self._server is None:
            raise RuntimeError("the server is not started")
        return f"http://127.0.0.1:{self._server.sockets[0].getsockname()[1]}/v1"

    async def start(self) -> str:
        self._server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return self.base_url

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            self._server = None

    async def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        """(HTTP status, JSON body) for an authorised request."""
        raise NotImplementedError

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = (await reader.readuntil(b"\r\n\r\n")).decode()
            method, path = head.split()[:2]
            headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)}
            length = int(headers.get("content-length") or 0)
            body = json.loads(await reader.readexactly(length)) if length else None
            self.requests.append((method, path, body))
            if self.silent:
                await asyncio.sleep(30)
            if headers.get("authorization") != f"Bearer {self.key}":
                status, payload = 401, json.dumps({"error": "invalid api key"}).encode()
            elif self.override is not None and method == "GET" and path == "/v1/pods":
                status, payload = self.override
            else:
                status, answer = await self.answer(method, path, body)
                payload = b"" if answer is None else json.dumps(answer).encode()
            writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                         % (status, len(payload), payload))
            await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError):
            pass  # a client that went away or sent garbage: nothing to answer
        finally:
            writer.close()


class SimRunPod(RunPodServer):
    """A SimProvider behind RunPod's API: its workers are pods, `spawning` ones RUNNING without a
    public IP or an SSH port yet, as RunPod shows a pod still starting."""

    def __init__(self, provider: SimProvider, key: str) -> None:
        super().__init__(key)
        self.provider = provider

    async def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        try:
            if method == "POST" and path == "/v1/pods" and isinstance(body, dict):
                worker = await self.provider.create(str(body.get("name", "")), str((body.get("gpuTypeIds") or [""])[0]),
                                                    int(body.get("gpuCount") or 1))
                return 201, pod(worker)
            if method == "GET" and path == "/v1/pods":
                return 200, [pod(w) for w in await self.provider.workers()]
            if method == "DELETE" and path.startswith("/v1/pods/"):
                await self.provider.terminate(path.rsplit("/", 1)[1])
                return 204, None
        except ProviderError as exc:
            return (404 if "no worker" in str(exc) else 400), {"error": str(exc)}
        return 404, {"error": f"no route {method} {path}"}


def pod(worker: Worker) -> dict:
    """A worker as RunPod lists a pod."""
    return {
        "id": worker.worker_id, "name": worker.name, "desiredStatus": "RUNNING", "costPerHr": worker.price_per_h,
        "gpu": {"id": worker.gpu_type, "count": worker.gpus},
        "lastStartedAt": _z(worker.created_at) if worker.created_at else None,
        "publicIp": worker.ssh.host if worker.ssh else None,
        "portMappings": {"22": worker.ssh.port} if worker.ssh else {},
    }


def _z(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")
