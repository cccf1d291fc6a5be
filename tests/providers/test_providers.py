"""Providers: the simulated one on its own clock, and RunPod's REST API against a local server
that speaks it (create, list, terminate, with the bearer key), including every way it can answer
badly."""

from __future__ import annotations

import asyncio
import json
from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_providers.base import ProviderError, SshDetails
from gpumedic_providers.runpod import RunPodProvider
from gpumedic_providers.sim import SimProvider

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)
KEY = "rpa_TESTKEY_not_a_real_one"


class Clock:
    def __init__(self) -> None:
        self.now = T0

    def __call__(self) -> datetime:
        return self.now


async def test_the_simulated_provider_spawns_slowly_bills_by_gpu_type_and_leaves_some_spawns_without_ssh():
    clock = Clock()
    provider = SimProvider(spawn_s=60, never_ssh_every=3, clock=clock)
    made = [await provider.create(f"w{i}", "H100", 8) for i in range(3)]
    assert {w.status for w in made} == {"spawning"} and made[0].price_per_h == pytest.approx(19.92)
    clock.now += timedelta(seconds=61)
    listed = {w.worker_id: w for w in await provider.workers()}
    assert [listed[w.worker_id].status for w in made] == ["running", "running", "spawning"]  # the third never gets SSH
    assert listed[made[0].worker_id].ssh is not None and listed[made[2].worker_id].ssh is None
    await provider.terminate(made[2].worker_id)
    assert made[2].worker_id not in {w.worker_id for w in await provider.workers()}
    with pytest.raises(ProviderError, match="no GPU type 'B300'"):
        await provider.create("w", "B300", 1)
    with pytest.raises(ProviderError, match="no worker 'sim-w-9999'"):
        await provider.terminate("sim-w-9999")


# --- RunPod's API, served locally -----------------------------------------------------------------


class FakeRunPod:
    """Speaks RunPod's documented REST v1 pod endpoints; `override` makes GET /pods answer badly."""

    def __init__(self) -> None:
        self.pods: dict[str, dict] = {}
        self.requests: list[tuple[str, str, dict | None]] = []
        self.override: tuple[int, bytes] | None = None
        self.silent = False

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        head = (await reader.readuntil(b"\r\n\r\n")).decode()
        method, path = head.split()[:2]
        headers = {k.lower(): v.strip() for k, _, v in (line.partition(":") for line in head.split("\r\n")[1:] if line)}
        body = json.loads(await reader.readexactly(int(headers.get("content-length", 0)))) if headers.get("content-length") else None
        self.requests.append((method, path, body))
        if self.silent:
            await asyncio.sleep(30)
        status, payload = self.answer(method, path, body, headers.get("authorization"))
        writer.write(b"HTTP/1.1 %d X\r\nContent-Type: application/json\r\nContent-Length: %d\r\nConnection: close\r\n\r\n%s"
                     % (status, len(payload), payload))
        await writer.drain()
        writer.close()

    def answer(self, method: str, path: str, body: dict | None, auth: str | None) -> tuple[int, bytes]:
        if auth != f"Bearer {KEY}":
            return 401, b'{"error": "invalid api key"}'
        if method == "POST" and path == "/v1/pods":
            pod_id = f"pod{len(self.pods) + 1:03d}xq"
            self.pods[pod_id] = {
                "id": pod_id, "name": body["name"], "desiredStatus": "RUNNING", "costPerHr": "2.99",
                "gpu": {"id": body["gpuTypeIds"][0], "count": body["gpuCount"], "displayName": "H100 80GB"},
                "lastStartedAt": "2026-11-23T12:00:00.000Z", "publicIp": None, "portMappings": {},
            }
            return 201, json.dumps(self.pods[pod_id]).encode()
        if method == "GET" and path == "/v1/pods":
            return self.override or (200, json.dumps(list(self.pods.values())).encode())
        if method == "DELETE" and path.startswith("/v1/pods/"):
            return (204, b"") if self.pods.pop(path.rsplit("/", 1)[1], None) else (404, b'{"error": "pod not found"}')
        return 404, b"{}"


@pytest.fixture
async def runpod():
    fake = FakeRunPod()
    server = await asyncio.start_server(fake.handle, "127.0.0.1", 0)
    base = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1"
    provider = RunPodProvider(KEY, image="ghcr.io/acme/selfplay:7", base_url=base, timeout_s=0.5)
    yield fake, provider, base
    await provider.close()
    server.close()


async def test_runpod_pods_are_created_listed_and_terminated_through_its_api(runpod):
    fake, provider, _ = runpod
    created = await provider.create("selfplay-1", "NVIDIA H100 80GB HBM3", 8)
    assert (created.status, created.gpus, created.price_per_h, created.ssh) == ("spawning", 8, 2.99, None)
    assert fake.requests[0][2] | {} == {
        "name": "selfplay-1", "imageName": "ghcr.io/acme/selfplay:7", "gpuTypeIds": ["NVIDIA H100 80GB HBM3"], "gpuCount": 8,
        "cloudType": "SECURE", "ports": ["22/tcp"], "supportPublicIp": True,
    }
    fake.pods[created.worker_id] |= {"publicIp": "203.0.113.7", "portMappings": {"22": 40122}}
    (listed,) = await provider.workers()
    assert listed.status == "running" and listed.ssh == SshDetails(host="203.0.113.7", port=40122)
    await provider.terminate(created.worker_id)
    assert await provider.workers() == []
    with pytest.raises(ProviderError, match="no such pod"):
        await provider.terminate(created.worker_id)
    with pytest.raises(ProviderError, match="is not a pod id"):
        await provider.terminate("pod; rm -rf /")


async def test_runpod_answering_badly_is_a_clear_error_without_the_key(runpod):
    fake, provider, base = runpod
    await provider.create("selfplay-1", "NVIDIA H100 80GB HBM3", 1)
    bad = [
        ((200, b"<html>maintenance</html>"), "not JSON"),
        ((200, b'{"pods": []}'), "answered a JSON dict, not a list of pods"),
        ((200, b'[{"name": "x"}]'), "pod 0 has no pod id"),
        ((200, b'[{"id": "abc", "desiredStatus": "RUNNING", "costPerHr": "free", "gpu": {"id": "H100", "count": 1}}]'), "is not a pod gpumedic can use"),
        ((200, b'[{"id": "abc", "desiredStatus": "RUNNING", "costPerHr": -3, "gpu": {"id": "H100", "count": 1}}]'), "greater than or equal to 0"),
        ((503, b"{}"), "answered HTTP 503"),
        ((429, b"{}"), "answered HTTP 429"),
    ]
    for answer, problem in bad:
        fake.override = answer
        with pytest.raises(ProviderError, match=problem) as caught:
            await provider.workers()
        assert KEY not in str(caught.value)
    fake.override = None
    fake.silent = True
    with pytest.raises(ProviderError, match="got no answer in time"):
        await provider.workers()
    wrong = RunPodProvider("rpa_wrong", image="x", base_url=base, timeout_s=0.5)
    fake.silent = False
    with pytest.raises(ProviderError, match=r"refused the API key .*HTTP 401") as caught:
        await wrong.workers()
    assert "rpa_wrong" not in str(caught.value)
    await wrong.close()
    closed = RunPodProvider(KEY, image="x", base_url="http://127.0.0.1:1/v1", timeout_s=0.5)
    with pytest.raises(ProviderError, match="unreachable"):
        await closed.workers()
    await closed.close()
