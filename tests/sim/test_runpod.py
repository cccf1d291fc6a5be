"""The simulated provider served over RunPod's REST API, read by the real RunPod provider: what
`gpumedic sim` rents its workers from."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from gpumedic_sim.fleet.runpod import SimRunPod
from gpumedic_providers.base import ProviderError, SshDetails
from gpumedic_providers.runpod import RunPodProvider
from gpumedic_providers.sim import SimProvider


async def test_the_runpod_provider_rents_watches_and_ends_simulated_workers():
    now = [datetime(2026, 11, 23, tzinfo=UTC)]
    sim = SimProvider(prices={"H100": 2.49}, spawn_s=60, never_ssh_every=2, clock=lambda: now[0],
                      ssh_for=lambda w: SshDetails(host="127.0.0.1", port=2201))
    server = SimRunPod(sim, "rpa_sim")
    base = await server.start()
    provider = RunPodProvider("rpa_sim", image="sim/worker:1", base_url=base, timeout_s=2)
    try:
        first = await provider.create("w1", "H100", 2)
        second = await provider.create("w2", "H100", 2)
        assert (first.worker_id, first.status, first.price_per_h, first.gpus) == ("simw0001", "spawning", 4.98, 2)
        now[0] += timedelta(seconds=61)
        listed = {w.worker_id: w for w in await provider.workers()}
        assert listed["simw0001"].status == "running" and listed["simw0001"].ssh == SshDetails(host="127.0.0.1", port=2201)
        assert listed[second.worker_id].status == "spawning"  # the second spawn never gets SSH
        assert listed["simw0001"].created_at == datetime(2026, 11, 23, tzinfo=UTC)
        await provider.terminate(second.worker_id)
        assert [w.worker_id for w in await provider.workers()] == ["simw0001"]
        with pytest.raises(ProviderError, match="no such pod"):
            await provider.terminate("simw0099")
        with pytest.raises(ProviderError, match="HTTP 400"):
            await provider.create("w3", "RTX9999", 1)  # a type the provider does not offer
        bad_key = RunPodProvider("rpa_wrong", image="sim/worker:1", base_url=base, timeout_s=2)
        with pytest.raises(ProviderError, match="refused the API key"):
            await bad_key.workers()
        await bad_key.close()
    finally:
        await provider.close()
        await server.stop()
