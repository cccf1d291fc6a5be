"""`gpumedic demo` / `gpumedic up --demo`: the embedded stack on a simulated fleet, with one
zombie job injected, shown from detection to fix with its trace id.

The fleet's nodes run the real node-sampler code over simulated NVML and /proc, answer SSH on
loopback (the remediator's kill really travels over SSH with host keys verified) and serve a
peer status endpoint that leader-health probes.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from gpumedic.incidents import incident_text
from gpumedic.stack import Stack, services_here, wind_down
from gpumedic_bus.topology import OBSERVER, SIM_FLEET
from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    Event,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
)

from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_sim.runs.pace import ZOMBIE_AFTER_S, demo_env

SAMPLE_INTERVAL_S = 1.0


def _line(event: Event) -> str | None:
    match event:
        case IncidentOpened():
            return f"DETECTED  incident {str(event.incident_id)[:8]} on {event.node_id} GPU {event.gpu_index}: {event.summary}"
        case ActionRequested():
            return f"DECIDED   {event.operation.describe()} on {event.node_id} (attempt {event.attempt})"
        case ActionCompleted():
            return f"ACTED     {event.outcome.value}: {event.detail}"
        case IncidentResolved():
            return f"RESOLVED  ({event.resolution}) {event.summary}"
        case IncidentEscalated():
            return f"ESCALATED {event.reason}"
    return None


async def run_demo(
    var_dir: Path,
    *,
    nodes: int = 4,
    gpus: int = 2,
    duration_s: float = 180.0,
    keep_running: bool = False,
    stop_after_s: float | None = None,
    say=print,
    on_ready: Callable[[Stack], Awaitable[None]] | None = None,
    on_done: Callable[[Stack], Awaitable[None]] | None = None,
    cluster: int = 1,
    replicas: dict[str, int] | None = None,
) -> int:
    """Run the story; return 0 when the injected zombie was fixed and recorded, 1 otherwise.

    `duration_s` bounds the story. With `keep_running` the stack stays up afterwards, until
    `stop_after_s` from the start, or until Ctrl-C when that is None. `on_ready` is awaited once
    the stack is up, before the zombie is injected (where a test starts its own consumers);
    `on_done` once the story is told, while the stack is still up. `cluster`: that many
    nats-servers in one JetStream cluster; `replicas`, processes per service (`Stack.instances`).
    """
    started = time.monotonic()
    var_dir.mkdir(parents=True, exist_ok=True)
    fleet = SimFleet(nodes, gpus, var_dir / "fleet")
    stack = Stack(var_dir, say=say, instances=dict(replicas or {}))
    connections = []
    sampling = None
    try:
        say(f"[1/5] starting the bus and the store under {var_dir}/")
        stack.start_bus(sim_fleet=True, cluster=cluster)
        await stack.provision()
        stack.migrate()
        say(f"[2/5] starting a simulated fleet: {nodes} nodes x {gpus} GPUs (SSH and /status on loopback)")
        await fleet.start()
        stack.env = demo_env(fleet.control_plane_env(), fleet.workdir)
        if (theirs := os.environ.get("GPUMEDIC_POLICY_FILE")) and theirs != stack.env["GPUMEDIC_POLICY_FILE"]:
            say(f"      your GPUMEDIC_POLICY_FILE ({theirs}) is set aside: the demo runs its own policy, in seconds instead of "
                f"minutes ({stack.env['GPUMEDIC_POLICY_FILE']}); `gpumedic up` without --demo uses yours")
        services, problem = services_here()
        if problem:
            say(f"[3/5] starting five services, each on its own NATS user; not this machine's node-sampler: it has no usable "
                f"NVIDIA driver ({problem}), and the fleet is the simulated one")
        else:
            say("[3/5] starting the six services, each on its own NATS user (this machine's GPUs are sampled too)")
        stack.start_services(services)
        await stack.wait_ready()
        stack.start_supervising()  # a nats-server or service that dies is restarted, with a line saying so
        say(f"      console: {stack.console_url} (token in {stack.console_token_file})")

        if on_ready is not None:
            await on_ready(stack)
        # The simulated nodes publish as the fleet's user; the story is read as the observer.
        fleet_nc, observer = await stack.connect(SIM_FLEET), await stack.connect(OBSERVER)
        connections += [fleet_nc, observer]
        js = fleet_nc.jetstream()

        async def publish(event: Event) -> None:
            await js.publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": str(event.event_id)})

        sampling = asyncio.create_task(fleet.run_samplers(publish, SAMPLE_INTERVAL_S))
        gpu_series = await fleet.serve_metrics()
        stack.add_targets(gpu_series, {"service": "node-sampler", "fleet": "simulated"})
        say(f"      the simulated GPUs' series (dcgm-exporter's names, Hostname the node id) at http://{gpu_series}/metrics, "
            f"listed in {stack.var_dir / 'prometheus-targets.json'} for deploy/prometheus.yml")
        story: asyncio.Queue[Event] = asyncio.Queue()
        for event_type in (IncidentOpened, ActionRequested, ActionCompleted, IncidentResolved, IncidentEscalated):
            await observer.subscribe(event_type.subject_filter(), cb=_enqueue(event_type, story))

        target = list(fleet.nodes.values())[min(1, nodes - 1)]
        say(f"[4/5] fleet sampling every {SAMPLE_INTERVAL_S:.0f}s; injecting a zombie job on {target.node_id} GPU 0")
        target.inject_zombie(0)
        say(f"      (a process holds GPU 0 at 0% while the node claims a job; detection after {ZOMBIE_AFTER_S:.0f}s idle)")

        outcome = await _follow_story(story, started, duration_s, say)
        if outcome is None:
            say(f"no resolution within {duration_s:.0f}s; see the logs in {stack.logs}")
            return 1
        await asyncio.sleep(1.5)  # let report-builder record the last events and spans
        say(f"[5/5] the incident as report-builder recorded it (gpumedic incidents --var {var_dir} {str(outcome.incident_id)[:8]}):")
        say("")
        say((await incident_text(stack.store_url, str(outcome.incident_id)))[1])
        say("")
        if on_done is not None:
            await on_done(stack)
        if keep_running:
            say("the stack keeps running; Ctrl-C stops it")
            if stop_after_s is None:
                await asyncio.Event().wait()  # until Ctrl-C or SIGTERM cancels us
            await _sleep_until(started + stop_after_s)
        return 0 if isinstance(outcome, IncidentResolved) else 1
    finally:
        say("stopping: sampling, services, bus, fleet")
        await wind_down(stack, tasks=[sampling] if sampling is not None else [], connections=connections, parts=(fleet,))
        say("stopped; no process left behind")


def _enqueue(event_type, queue: asyncio.Queue):
    async def _cb(msg) -> None:
        with contextlib.suppress(Exception):
            queue.put_nowait(event_type.from_json(msg.data, subject=msg.subject))

    return _cb


async def _follow_story(story: asyncio.Queue, started: float, duration_s: float, say):
    while True:
        left = started + duration_s - time.monotonic()
        if left <= 0:
            return None
        try:
            event = await asyncio.wait_for(story.get(), left)
        except TimeoutError:
            return None
        line = _line(event)
        if line:
            say(f"      +{time.monotonic() - started:5.1f}s  {line}")
        if isinstance(event, IncidentResolved | IncidentEscalated):
            return event


async def _sleep_until(deadline: float) -> None:
    await asyncio.sleep(max(0.0, deadline - time.monotonic()))
