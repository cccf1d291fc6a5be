"""A simulated GPU node: the state, plus everything a real node answers on.

Below the node-sampler it stands where NVML and /proc would be (`nvml()`, `process_table()`);
on the network it runs an SSH server and a peer status endpoint on loopback. The real sampler,
the real remediator and the real leader-health probe all run unchanged against it.
"""

from __future__ import annotations

import asyncssh
from node_sampler.jobs import JobProbe, OutputGrowthProbe, StatusEndpointProbe
from node_sampler.sampler import Sampler

from gpumedic.sim.nvml import SimNvml
from gpumedic.sim.procs import SimProcessTable
from gpumedic.sim.ssh import SshEndpoint
from gpumedic.sim.state import NodeState
from gpumedic.sim.status import StatusEndpoint

LOOPBACK = "127.0.0.1"


class SimNode(NodeState):
    """`SimNode("sim-node-01", gpus=8)`: a node with 8 idle GPUs; `start_job(gpu)` to load one."""

    def __init__(self, node_id: str, gpus: int, *, seed: int | None = None) -> None:
        super().__init__(node_id, gpus, seed=seed)
        self.host = LOOPBACK
        self.host_key = asyncssh.generate_private_key("ssh-ed25519")
        self._ssh = SshEndpoint(self, self.host_key)
        self._status = StatusEndpoint(self)

    @property
    def ssh_port(self) -> int | None:
        return self._ssh.port

    @property
    def status_port(self) -> int | None:
        return self._status.port

    @property
    def status_url(self) -> str:
        if self._status.port is None:
            raise RuntimeError(f"{self.node_id} is not started")
        return f"http://{self.host}:{self._status.port}/status"

    def known_hosts_line(self) -> str:
        """This node's line in a known_hosts file (non-22 ports are written `[host]:port`)."""
        key_type, key_data = self.host_key.export_public_key("openssh").decode().split()[:2]
        return f"[{self.host}]:{self.ssh_port} {key_type} {key_data}"

    async def start(self, client_public_key: asyncssh.SSHKey) -> None:
        """Start the SSH server (accepting `client_public_key` for any user) and the status endpoint."""
        await self._ssh.start(client_public_key, self.host)
        await self._status.start(self.host)

    async def stop(self) -> None:
        await self._ssh.stop()
        await self._status.stop()

    # --- the node-sampler's sources --------------------------------------------------------

    def nvml(self) -> SimNvml:
        return SimNvml(self)

    def process_table(self) -> SimProcessTable:
        return SimProcessTable(self)

    def probes(self, *, status_timeout_s: float = 2.0) -> list[JobProbe]:
        """What a real node's sampler would be configured with: the status endpoint's job
        count, and output growth (measured on the simulated output instead of on disk)."""
        return [
            StatusEndpointProbe(self.status_url, "selfplay_jobs", timeout_s=status_timeout_s),
            OutputGrowthProbe(lambda: (self.output_bytes(), [])),
        ]

    def sampler(self, interval_s: float = 5.0, probes: list[JobProbe] | None = None) -> Sampler:
        """The real node-sampler's Sampler over this node."""
        return Sampler(self.node_id, self.nvml(), self.process_table(), self.probes() if probes is None else probes, interval_s)
