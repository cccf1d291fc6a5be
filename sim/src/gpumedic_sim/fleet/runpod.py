"""RunPod's documented REST v1 pod endpoints on loopback (`POST /v1/pods`, `GET /v1/pods`,
`DELETE /v1/pods/{id}`, `POST /v1/pods/{id}/restart`, a bearer key), so the real RunPod provider code in the autoscaler and the
remediator talks to a simulated provider exactly as it would to RunPod.

`RunPodServer` is the HTTP side (parsing, the key, a log of requests, and two ways to answer
badly: `override` for GET /pods, `silent` to never answer); `SimRunPod` answers from a
`SimProvider`, which `gpumedic sim` rents its workers from; `RentedFleet` serves the fleet's own
nodes as pods. Loopback only, one request per connection.
"""

from __future__ import annotations

import asyncio
import json
import secrets
from collections.abc import Mapping
from datetime import datetime
from pathlib import Path

from gpumedic.credentials import write_private
from gpumedic_providers.base import ProviderError, Worker
from gpumedic_providers.sim import SimProvider

from gpumedic_sim.machine.state import NodeState


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
        self.images: dict[str, str] = {}
        """The image each pod was created with (what RunPod lists as its `image`)."""
        self.rolled_out: str | None = None
        """An image rolled out to every pod (the scenario's), listed for each from then on."""

    async def answer(self, method: str, path: str, body: dict | None) -> tuple[int, object]:
        try:
            if method == "POST" and path == "/v1/pods" and isinstance(body, dict):
                worker = await self.provider.create(str(body.get("name", "")), str((body.get("gpuTypeIds") or [""])[0]),
                                                    int(body.get("gpuCount") or 1))
                self.images[worker.worker_id] = self.rolled_out or str(body.get("imageName") or "")
                return 201, pod(worker, self.images[worker.worker_id])
            if method == "GET" and path == "/v1/pods":
                return 200, [pod(w, self.rolled_out or self.images.get(w.worker_id, "")) for w in await self.provider.workers()]
            if method == "POST" and path.startswith("/v1/pods/") and path.endswith("/restart"):
                await self.provider.restart(path.split("/")[3])
                return 200, None
            if method == "DELETE" and path.startswith("/v1/pods/"):
                await self.provider.terminate(path.rsplit("/", 1)[1])
                return 204, None
        except ProviderError as exc:
            return (404 if "no worker" in str(exc) else 400), {"error": str(exc)}
        return 404, {"error": f"no route {method} {path}"}


def pod(worker: Worker, image: str = "") -> dict:
    """A worker as RunPod lists a pod (`image`: what it was created with)."""
    return {
        "id": worker.worker_id, "name": worker.name, "desiredStatus": "RUNNING", "costPerHr": worker.price_per_h,
        "gpu": {"id": worker.gpu_type, "count": worker.gpus},
        "lastStartedAt": _z(worker.started_at) if worker.started_at else None,
        "publicIp": worker.ssh.host if worker.ssh else None,
        "portMappings": {"22": worker.ssh.port} if worker.ssh else {},
        **({"machineId": worker.host_id} if worker.host_id else {}),
        **({"image": image} if image else {}),
    }


def _z(at: datetime) -> str:
    return at.isoformat(timespec="milliseconds").replace("+00:00", "Z")


class RentedFleet:
    """The simulated fleet's nodes as pods of a simulated RunPod, each named by its node id (the
    ids are RunPod-shaped): what the remediator restarts a node's whole pod through
    (`restart_worker`). A restart ends everything on the node, as a pod restart does."""

    def __init__(self, nodes: Mapping[str, NodeState], workdir: Path) -> None:
        self.workdir = Path(workdir)
        self._names: dict[str, str] = {}
        self.provider = SimProvider(spawn_s=0, on_restart=lambda pod_id: nodes[self._names[pod_id]].restart_pod())
        for n, (node_id, node) in enumerate(nodes.items(), 1):
            pod_id = f"simpod{n:05d}"
            self._names[pod_id] = node_id
            self.provider.adopt(pod_id, node_id, "H100", len(node.gpus))
        self.api = SimRunPod(self.provider, key=f"rpa_sim_{secrets.token_urlsafe(18)}")

    @property
    def key_path(self) -> Path:
        return self.workdir / "rented-fleet-key"

    async def start(self) -> None:
        self.workdir.mkdir(parents=True, exist_ok=True)
        write_private(self.key_path, self.api.key.encode())
        await self.api.start()

    async def stop(self) -> None:
        await self.api.stop()

    def env(self) -> dict[str, str]:
        """The remediator's provider (the autoscaler has none: these pods are no worker pool)."""
        config = {"kind": "runpod", "api_key_file": str(self.key_path), "image": "gpumedic/sim-node:1", "base_url": self.api.base_url,
                  "timeout_s": 5}
        return {"GPUMEDIC_REMEDIATOR_PROVIDER": json.dumps(config)}
