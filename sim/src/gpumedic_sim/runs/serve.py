"""`gpumedic fleet`: a simulated fleet on the network, for a control plane that runs elsewhere
(compose's demo, deploy/compose.demo.yaml).

Each node's SSH and status servers listen on `listen` and are reached as `host`; each node's
sampler logs in to NATS as that node's own user, from the file `gpumedic init` wrote for it
(`deploy/secrets/nodes/NODE.env`), so the bus's per-node permissions hold as for real nodes. The
nodes accept the remediator's own key (its public half is derived here; the private key is not
copied anywhere). `inventory.yaml` and `known_hosts` for the remediator go to `workdir`, with
`policy.yaml`: the demo's policy, seconds instead of the runbooks' minutes.
"""

from __future__ import annotations

import asyncio
import contextlib
from pathlib import Path

import asyncssh
from gpumedic_bus.connect import connect
from gpumedic_bus.service import wait_for_nats
from gpumedic_bus.settings import NatsSettings
from gpumedic_bus.streams import stream_of
from gpumedic_events import Event
from gpumedic_incidents.policy import dump_policy

from gpumedic_sim.runs.pace import DEMO_POLICY
from gpumedic.deployment import read_env
from gpumedic_sim.fleet.nodes import SimFleet


class FleetSetupError(Exception):
    """What is missing or wrong before the fleet can start, in one line."""


def node_settings(path: Path) -> NatsSettings:
    """A node's NATS login from its `gpumedic init` file."""
    if not path.is_file():
        raise FleetSetupError(f"{path}: no credentials for this node (run `gpumedic init --node {path.stem}`)")
    values = {key: value for key, value, _ in read_env(path) if key}
    try:
        return NatsSettings(
            url=values["GPUMEDIC_NATS_URL"],
            user=values["GPUMEDIC_NATS_USER"],
            password=values["GPUMEDIC_NATS_PASSWORD"],
            tls_ca_file=values.get("GPUMEDIC_NATS_TLS_CA_FILE") or None,
        )
    except KeyError as exc:
        raise FleetSetupError(f"{path}: {exc.args[0]} is missing") from None
    except ValueError as exc:
        raise FleetSetupError(f"{path}: {exc}") from None


async def serve_fleet(
    workdir: Path,
    *,
    nodes: int,
    gpus: int,
    listen: str,
    host: str,
    client_key_file: Path,
    credentials: Path,
    interval_s: float,
    zombie_after_s: float | None,
    metrics_port: int | None = None,
    say=print,
) -> int:
    """Run until cancelled (SIGTERM, Ctrl-C); 2 when the fleet cannot start. With `metrics_port`,
    every node's GPU series are served on `listen:metrics_port/metrics` for Prometheus."""
    try:
        key = asyncssh.read_private_key(client_key_file)
    except (OSError, asyncssh.KeyImportError) as exc:
        raise FleetSetupError(f"{client_key_file}: not a private key the nodes can accept ({exc})") from None
    fleet = SimFleet(nodes, gpus, workdir, listen=listen, host=host, client_key=key)
    workdir.mkdir(parents=True, exist_ok=True)
    dump_policy(DEMO_POLICY, workdir / "policy.yaml")  # before the fleet's files: services wait for those
    logins = {node_id: node_settings(credentials / f"{node_id}.env") for node_id in fleet.nodes}
    connections = {}  # node -> its own NATS connection
    try:
        for node_id, settings in logins.items():
            await wait_for_nats(settings, node_id)
            connections[node_id] = await connect(settings, f"sim-{node_id}")
        await fleet.start()
        say(f"fleet: {nodes} nodes x {gpus} GPUs on {host} ({listen}); inventory and known_hosts in {workdir}")
        if metrics_port is not None:
            say(f"fleet: the nodes' GPU series on http://{await fleet.serve_metrics(listen, metrics_port)}/metrics")

        async def publish(event: Event) -> None:
            await connections[event.node_id].jetstream().publish(
                event.subject, event.to_json(), stream=stream_of(type(event)).name,
                headers={"Nats-Msg-Id": str(event.event_id)},
            )

        sampling = asyncio.create_task(fleet.run_samplers(publish, interval_s))
        if zombie_after_s is not None:
            await asyncio.sleep(zombie_after_s)
            target = list(fleet.nodes.values())[min(1, nodes - 1)]
            target.inject_zombie(0)
            say(f"fleet: injected a zombie job on {target.node_id} GPU 0 (it holds the GPU at 0% while the node claims a job)")
        await sampling
        return 0
    finally:
        for nc in connections.values():
            with contextlib.suppress(Exception):
                await nc.close()
        await fleet.stop()
