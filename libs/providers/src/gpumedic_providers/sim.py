"""A simulated provider: workers that take `spawn_s` to come up, prices per GPU type, and the
failure the runbook fights by hand: every `never_ssh_every`-th spawn never gets SSH details (it
stays `spawning` and bills). The clock comes in, so tests and the simulated fleet drive time."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from gpumedic_providers.base import ProviderError, SshDetails, Worker

PRICES_PER_GPU_H = {"H100": 2.49, "A100": 1.19, "RTX4090": 0.34}
"""$/h per GPU by type, the order of magnitude rented GPUs cost."""


def machine_id(number: int) -> str:
    """The id of the provider's `number`-th machine, from 1 (with `hosts`, rentals land on these in turn)."""
    return f"sim-host-{number:03d}"


@dataclass
class _Rented:
    worker_id: str
    name: str
    gpu_type: str
    gpus: int
    created_at: datetime
    never_ssh: bool
    terminated_at: datetime | None = None
    started_at: datetime | None = None
    host_id: str = ""


class SimProvider:
    name = "simulated provider"

    def __init__(
        self,
        *,
        prices: dict[str, float] | None = None,
        spawn_s: float = 60.0,
        never_ssh_every: int = 0,
        ssh_for: Callable[[str], SshDetails] | None = None,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        on_restart: Callable[[str], None] | None = None,
        hosts: int = 0,
    ) -> None:
        """`ssh_for(worker_id)` says where a worker's SSH is once it is up (the simulated fleet
        hands out its nodes); by default a made-up address. With `hosts`, workers land on that many
        machines in turn (`host_id` sim-host-N), so a machine is rented again; 0: each its own."""
        self.prices = dict(PRICES_PER_GPU_H if prices is None else prices)
        self.spawn_s = spawn_s
        self.never_ssh_every = never_ssh_every
        self._ssh_for = ssh_for or (lambda worker_id: SshDetails(host=f"{worker_id}.sim.invalid", port=22))
        self._clock = clock
        self.on_restart = on_restart
        """Called with a worker's id when it restarts (the simulated fleet ends what ran on it)."""
        self.hosts = hosts
        self._rented: dict[str, _Rented] = {}
        self.calls: list[str] = []
        """Every call, in order ('create H100x8', 'terminate simw0001'): what was billed or ended."""

    async def create(self, name: str, gpu_type: str, gpus: int) -> Worker:
        if gpu_type not in self.prices:
            raise ProviderError(f"{self.name}: no GPU type {gpu_type!r} (offers {', '.join(sorted(self.prices))})")
        if not 1 <= gpus <= 8:
            raise ProviderError(f"{self.name}: {gpus} GPUs per worker is not offered (1-8)")
        number = len(self._rented) + 1
        rented = _Rented(
            f"simw{number:04d}", name, gpu_type, gpus, self._clock(),  # a RunPod-shaped id: served as one by the sim
            never_ssh=bool(self.never_ssh_every) and number % self.never_ssh_every == 0,
            host_id=machine_id((number - 1) % self.hosts + 1) if self.hosts else f"sim-host-w{number:04d}",
        )
        self._rented[rented.worker_id] = rented
        self.calls.append(f"create {gpu_type}x{gpus}")
        return self._worker(rented)

    def adopt(self, worker_id: str, name: str, gpu_type: str, gpus: int) -> None:
        """A worker rented before this provider's story starts (up already): a fleet's own pods."""
        self._rented[worker_id] = _Rented(worker_id, name, gpu_type, gpus, self._clock() - timedelta(seconds=self.spawn_s), never_ssh=False,
                                          host_id=f"sim-host-{worker_id}")

    async def terminate(self, worker_id: str) -> None:
        rented = self._rented.get(worker_id)
        if rented is None:
            raise ProviderError(f"{self.name}: no worker {worker_id!r}")
        rented.terminated_at = self._clock()
        self.calls.append(f"terminate {worker_id}")

    async def restart(self, worker_id: str) -> None:
        rented = self._rented.get(worker_id)
        if rented is None or rented.terminated_at is not None:
            raise ProviderError(f"{self.name}: no worker {worker_id!r}")
        rented.started_at = self._clock()
        self.calls.append(f"restart {worker_id}")
        if self.on_restart is not None:
            self.on_restart(worker_id)

    async def workers(self) -> list[Worker]:
        return [self._worker(r) for r in self._rented.values() if r.terminated_at is None]

    def is_live(self, worker_id: str) -> bool:
        """Rented and not ended: a simulated worker stops the moment it is ended."""
        rented = self._rented.get(worker_id)
        return rented is not None and rented.terminated_at is None

    def rented(self) -> dict[str, bool]:
        """Every worker rented so far -> whether it is one that never comes up."""
        return {w.worker_id: w.never_ssh for w in self._rented.values()}

    def ended(self) -> dict[str, datetime]:
        """Every worker ended so far -> when (its bill stops there)."""
        return {w.worker_id: w.terminated_at for w in self._rented.values() if w.terminated_at is not None}

    async def close(self) -> None:
        """Nothing to let go of: the simulated provider lives in this process."""

    def _worker(self, rented: _Rented) -> Worker:
        up = self._clock() - rented.created_at >= timedelta(seconds=self.spawn_s) and not rented.never_ssh
        return Worker(
            worker_id=rented.worker_id,
            name=rented.name,
            status="running" if up else "spawning",
            gpu_type=rented.gpu_type,
            gpus=rented.gpus,
            price_per_h=round(self.prices[rented.gpu_type] * rented.gpus, 4),
            ssh=self._ssh_for(rented.worker_id) if up else None,
            created_at=rented.created_at,
            started_at=rented.started_at or rented.created_at,
            host_id=rented.host_id,
        )
