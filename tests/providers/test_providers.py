"""Providers: the simulated one on its own clock, and RunPod's REST API against a local server
that speaks it (create, list, terminate, with the bearer key), including every way it can answer
badly."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_providers.base import ProviderError, SshDetails
from gpumedic_providers.runpod import RunPodProvider
from gpumedic_providers.sim import SimProvider

from tests.fixtures.runpod import KEY

T0 = datetime(2026, 11, 23, 12, 0, tzinfo=UTC)


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
    with pytest.raises(ProviderError, match="no worker 'simw9999'"):
        await provider.terminate("simw9999")


# --- RunPod's API, served locally -----------------------------------------------------------------


@pytest.fixture
async def runpod(runpod_api):
    fake, base = runpod_api
    # A loaded test machine can take over half a second to answer locally; only the silent-API case waits out a short timeout.
    provider = RunPodProvider(KEY, image="ghcr.io/acme/selfplay:7", base_url=base, timeout_s=10.0)
    yield fake, provider, base
    await provider.close()


async def test_runpod_pods_are_created_listed_and_terminated_through_its_api(runpod):
    fake, provider, _ = runpod
    created = await provider.create("selfplay-1", "NVIDIA H100 80GB HBM3", 8)
    assert (created.status, created.gpus, created.price_per_h, created.ssh) == ("spawning", 8, 2.99, None)
    assert fake.requests[0][2] | {} == {
        "name": "selfplay-1", "imageName": "ghcr.io/acme/selfplay:7", "gpuTypeIds": ["NVIDIA H100 80GB HBM3"], "gpuCount": 8,
        "cloudType": "SECURE", "ports": ["22/tcp"], "supportPublicIp": True,
    }
    fake.pods[created.worker_id] |= {"publicIp": "203.0.113.7", "portMappings": {"22": 40122}, "machineId": "s7p2rdx9ke1q"}
    (listed,) = await provider.workers()
    assert listed.status == "running" and listed.ssh == SshDetails(host="203.0.113.7", port=40122)
    assert listed.host_id == "s7p2rdx9ke1q"  # the machine it runs on (RunPod's machineId), for its reliability
    assert listed.image == "ghcr.io/acme/selfplay:7"  # RunPod's `image`: what a fleet incident of its workers may share
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
    impatient = RunPodProvider(KEY, image="x", base_url=base, timeout_s=0.5)
    with pytest.raises(ProviderError, match="got no answer in time"):
        await impatient.workers()
    await impatient.close()
    wrong = RunPodProvider("rpa_wrong", image="x", base_url=base, timeout_s=10.0)
    fake.silent = False
    with pytest.raises(ProviderError, match=r"refused the API key .*HTTP 401") as caught:
        await wrong.workers()
    assert "rpa_wrong" not in str(caught.value)
    await wrong.close()
    closed = RunPodProvider(KEY, image="x", base_url="http://127.0.0.1:1/v1", timeout_s=0.5)
    with pytest.raises(ProviderError, match="unreachable"):
        await closed.workers()
    await closed.close()
