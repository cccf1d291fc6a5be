"""RunPod through its documented REST API (https://rest.runpod.io/v1): `POST /pods` to create,
`DELETE /pods/{podId}` to terminate, `POST /pods/{podId}/restart` to restart the whole pod,
`GET /pods` to list. A restart is known to answer 200 without restarting now and then (RunPod's
issue runpod-python#450), so whoever restarts checks `lastStartedAt` moved on.

A pod is `running` for gpumedic once RunPod says RUNNING and gives a public IP and a mapping for
port 22 (before that it is `spawning`, which is how "stuck in spawning" shows); EXITED is
`stopped`, TERMINATED `terminated`, anything else `error`. RunPod documents `costPerHr` as a
number and shows it as a string in its examples: both are read. `machineId` names the host machine
the pod runs on (its reliability is kept by machine). The API key goes in the
Authorization header only; errors name RunPod and the HTTP status, never the key.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any

import httpx
from pydantic import ValidationError

from gpumedic_providers.base import ProviderError, SshDetails, Worker, WorkerStatus

BASE_URL = "https://rest.runpod.io/v1"
POD_ID = re.compile(r"^[a-z0-9]{1,64}$")
STATUSES: dict[str, WorkerStatus] = {"EXITED": "stopped", "TERMINATED": "terminated"}


class RunPodProvider:
    name = "RunPod"

    def __init__(
        self, api_key: str, *, image: str, base_url: str = BASE_URL, cloud_type: str = "SECURE",
        timeout_s: float = 15.0, client: httpx.AsyncClient | None = None,
    ) -> None:
        self.image = image
        self.cloud_type = cloud_type
        self._client = client or httpx.AsyncClient(
            base_url=base_url, timeout=timeout_s, follow_redirects=False, headers={"Authorization": f"Bearer {api_key}"}
        )

    async def create(self, name: str, gpu_type: str, gpus: int) -> Worker:
        body = {
            "name": name, "imageName": self.image, "gpuTypeIds": [gpu_type], "gpuCount": gpus,
            "cloudType": self.cloud_type, "ports": ["22/tcp"], "supportPublicIp": True,
        }
        return self._worker(await self._call("POST", "/pods", json=body), "the created pod")

    async def terminate(self, worker_id: str) -> None:
        if not POD_ID.fullmatch(worker_id):
            raise ProviderError(f"RunPod: {worker_id[:80]!r} is not a pod id")
        await self._call("DELETE", f"/pods/{worker_id}")

    async def restart(self, worker_id: str) -> None:
        if not POD_ID.fullmatch(worker_id):
            raise ProviderError(f"RunPod: {worker_id[:80]!r} is not a pod id")
        await self._call("POST", f"/pods/{worker_id}/restart")

    async def workers(self) -> list[Worker]:
        pods = await self._call("GET", "/pods")
        if not isinstance(pods, list):
            raise ProviderError(f"RunPod: GET /pods answered a JSON {type(pods).__name__}, not a list of pods")
        return [self._worker(pod, f"pod {i}") for i, pod in enumerate(pods)]

    async def close(self) -> None:
        await self._client.aclose()

    async def _call(self, method: str, path: str, **kw: Any) -> Any:
        try:
            response = await self._client.request(method, path, **kw)
        except httpx.TimeoutException:
            raise ProviderError(f"RunPod: {method} {path} got no answer in time") from None
        except httpx.HTTPError as exc:
            raise ProviderError(f"RunPod: {method} {path} unreachable ({type(exc).__name__})") from None
        if response.status_code in (401, 403):
            raise ProviderError(f"RunPod refused the API key for {method} {path} (HTTP {response.status_code})")
        if response.status_code == 404:
            raise ProviderError(f"RunPod: {method} {path}: no such pod (HTTP 404)")
        if not response.is_success:
            raise ProviderError(f"RunPod: {method} {path} answered HTTP {response.status_code}")
        if method == "DELETE" or not response.content or path.endswith("/restart"):
            return None
        try:
            return response.json()
        except ValueError:
            raise ProviderError(f"RunPod: {method} {path} answered something that is not JSON") from None

    @staticmethod
    def _worker(pod: Any, what: str) -> Worker:
        if not isinstance(pod, dict) or not isinstance(pod.get("id"), str):
            raise ProviderError(f"RunPod: {what} has no pod id")
        gpu = pod.get("gpu") if isinstance(pod.get("gpu"), dict) else {}
        machine = pod.get("machine") if isinstance(pod.get("machine"), dict) else {}
        ports = pod.get("portMappings") if isinstance(pod.get("portMappings"), dict) else {}
        desired, ip, ssh_port = pod.get("desiredStatus"), pod.get("publicIp"), ports.get("22")
        ssh = None
        status: WorkerStatus = STATUSES.get(desired, "error")
        if desired == "RUNNING":
            status = "spawning"
            if isinstance(ip, str) and ip and isinstance(ssh_port, int):
                status, ssh = "running", {"host": ip, "port": ssh_port}
        try:
            return Worker(
                worker_id=pod["id"], name=pod.get("name") or "", status=status,
                gpu_type=gpu.get("id") or machine.get("gpuTypeId") or "", gpus=gpu.get("count") or 0,
                price_per_h=float(pod.get("costPerHr")), ssh=SshDetails(**ssh) if ssh else None,
                created_at=_time(pod.get("lastStartedAt")), started_at=_time(pod.get("lastStartedAt")),
                host_id=pod["machineId"][:128] if isinstance(pod.get("machineId"), str) and pod["machineId"] else None,
                image=pod["image"][:512] if isinstance(pod.get("image"), str) and pod["image"] else None,
            )
        except (TypeError, ValueError, ValidationError) as exc:
            problem = exc.errors(include_url=False)[0]["msg"] if isinstance(exc, ValidationError) else str(exc)
            raise ProviderError(f"RunPod: {what} ({pod['id'][:64]}) is not a pod gpumedic can use: {problem[:200]}") from None


def _time(value: object) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
