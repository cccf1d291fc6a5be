"""`gpumedic chaos` / `make chaos`: the embedded stack on a three-server NATS cluster fixing a
stream of zombie jobs while it is being broken: every `kill_every_s` a random control-plane
service is killed with SIGKILL, and every `bounce_every_s` one of the three nats-servers is
bounced (the stack's supervisor restarts both). A bounce is a restart by default (SIGTERM: the
server hands the leaderships of its streams and consumers to the others before it goes, as a
rolling upgrade does); `bounce_signal="kill"` makes it a crash (SIGKILL: what it led has no
leader until the others' election timeout, 4 to 9 s in nats-server, so with one every 5 s a
good share of the bus answers nothing at any moment). Afterwards it is audited from the
replicated streams and the store:

- every injected zombie has exactly one incident (lost: none; doubled: more than one) and was
  fixed by the end;
- no process was killed twice (a kill is the one side effect, counted on the nodes themselves);
- every incident and action on the bus is in the store (report-builder and the ledger);
- each killed service was ready again (its first `ready` heartbeat) within `resume_within_s`.

The counts are printed; the exit status says whether all four held.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import random
import signal
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from nats.js.api import DeliverPolicy

from gpumedic.stack import HEALTHY_AFTER_S, Stack, server_name, wind_down
from gpumedic_bus.streams import stream_of
from gpumedic_bus.topology import ADMIN, SIM_FLEET
from gpumedic_events import ActionCompleted, Event, IncidentKind, IncidentOpened, ServiceHeartbeat
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, GatePolicy, Kinds, RepeatPolicy, Step, ZombiePolicy, dump_policy
from gpumedic_incidents.state import fingerprint
from gpumedic_incidents.store import IncidentStates
from gpumedic_sim.runs.pace import demo_env
from gpumedic_sim.fleet.nodes import SimFleet

CONTROL_PLANE = ["zombie-detector", "leader-health", "autoscaler", "remediator", "report-builder"]
SAMPLE_INTERVAL_S = 1.0
REINJECT_AFTER_S = 2.0
"""A node gets its next zombie this long after its last incident closed."""
HEALTHY_FOR_S = HEALTHY_AFTER_S + 2.0
"""A service or server is a victim again only once it has run this long since its restart: the
supervisor backs off one that dies again sooner (a crash loop), and the resume time is measured
on a plain restart."""


def chaos_policy() -> Policy:
    """Zombies in seconds, and no limit meant for a real fleet in the way of a thousand of them:
    no fleet incident (they are independent faults), no cap on one node's actions, and no repeat
    offenders (the run puts many zombies on each node on purpose; counted, they drained most of
    the fleet mid-run)."""
    return Policy(
        fleet=FleetPolicy(hold_s=1, share=1.0),
        gate=GatePolicy(max_actions_per_node=100, node_window_s=60),
        kinds=Kinds(
            zombie_job=ZombiePolicy(
                idle_for_s=3 * SAMPLE_INTERVAL_S, action_timeout_s=120,
                ladder=(Step(action="kill_gpu_processes", attempts=3, verify_within_s=10),),
            ),
            repeat_offender=RepeatPolicy(rules=()),
        ),
    )


@dataclass
class Injected:
    node_id: str
    gpu: int
    pid: int
    at: datetime


@dataclass
class ChaosResult:
    injected: list[Injected] = field(default_factory=list)
    incidents: int = 0
    lost: list[Injected] = field(default_factory=list)
    doubled: list[Injected] = field(default_factory=list)
    unfixed: list[Injected] = field(default_factory=list)
    """Still running when the run ended: an incident that never got its action, or escalated."""
    spurious: int = 0
    killed_twice: list[int] = field(default_factory=list)
    actions: int = 0
    missing_incidents: int = 0
    missing_actions: int = 0
    service_kills: list[tuple[str, float]] = field(default_factory=list)
    resumes: dict[str, list[float]] = field(default_factory=dict)
    not_resumed: list[str] = field(default_factory=list)
    bounces: int = 0
    publish_failures: int = 0

    def ok(self, resume_within_s: float) -> bool:
        slow = [t for times in self.resumes.values() for t in times if t > resume_within_s]
        return not (self.lost or self.doubled or self.unfixed or self.killed_twice or self.missing_incidents or self.missing_actions
                    or self.not_resumed or slow)

    def render(self, resume_within_s: float) -> str:
        worst = max((t for times in self.resumes.values() for t in times), default=0.0)
        lines = [
            f"injected zombies          {len(self.injected):>6}",
            f"incidents opened          {self.incidents:>6}   (not matching an injection: {self.spurious})",
            f"lost (no incident)        {len(self.lost):>6}",
            f"doubled (two or more)     {len(self.doubled):>6}",
            f"not fixed by the end      {len(self.unfixed):>6}",
            f"actions completed         {self.actions:>6}",
            f"processes killed twice    {len(self.killed_twice):>6}",
            f"missing from the store    {self.missing_incidents:>6} incidents, {self.missing_actions} actions",
            f"services killed (SIGKILL) {len(self.service_kills):>6}   resumed within {worst:.1f}s at worst (goal {resume_within_s:g}s); "
            f"not resumed: {len(self.not_resumed)}",
            f"nats-servers bounced      {self.bounces:>6}",
            f"samples not published     {self.publish_failures:>6}   (during bounces; samples are disposable)",
        ]
        for service, times in sorted(self.resumes.items()):
            lines.append(f"  {service:<22} killed {len(times)}x, back in {', '.join(f'{t:.1f}' for t in times)} s")
        for what, zombies in (("lost", self.lost), ("doubled", self.doubled), ("not fixed", self.unfixed)):
            for z in zombies[:5]:  # where to start reading the logs
                lines.append(f"  {what}: {z.node_id} GPU {z.gpu} pid {z.pid}, injected {z.at:%H:%M:%S.%f}"[:-3])
        return "\n".join(lines)


async def run_chaos(
    var_dir: Path,
    *,
    nodes: int = 60,
    gpus: int = 2,
    incidents: int = 1000,
    rate_per_s: float = 6.0,
    kill_every_s: float = 4.0,
    bounce_every_s: float = 5.0,
    bounce_signal: str = "term",
    resume_within_s: float = 10.0,
    settle_s: float = 90.0,
    seed: int = 7,
    replicas: dict[str, int] | None = None,
    meanwhile: Callable[[Stack, ChaosResult], Awaitable[None]] | None = None,
    say=print,
) -> ChaosResult:
    """`kill_every_s` or `bounce_every_s` 0: none of that. `replicas`: processes per service
    (`Stack.instances`); `meanwhile`: what else to do to the stack while the zombies come (a test's
    own kill), awaited alongside the injection."""
    rng = random.Random(seed)
    result = ChaosResult()
    var_dir.mkdir(parents=True, exist_ok=True)
    fleet = SimFleet(nodes, gpus, var_dir / "fleet", jobs_per_gpu=0)
    supervisor_log = (var_dir / "supervisor.log").open("a")
    stack = Stack(var_dir, say=lambda line: print(f"{datetime.now(UTC):%H:%M:%S} {line}", file=supervisor_log, flush=True),
                  instances=dict(replicas or {}))
    tasks: list[asyncio.Task] = []
    connections = []
    try:
        say(f"[1/4] a three-server NATS cluster, the store, {nodes} nodes x {gpus} GPUs, the five control-plane services")
        stack.start_bus(sim_fleet=True, cluster=3)
        await stack.provision()
        stack.migrate()
        await fleet.start()
        stack.env = {
            **demo_env(fleet.control_plane_env(), fleet.workdir),
            "GPUMEDIC_REMEDIATOR_BREAKER_MAX_NODES": str(nodes),
            "GPUMEDIC_REMEDIATOR_BREAKER_MAX_SHARE": "1.0",
            "GPUMEDIC_REMEDIATOR_SSH_CHECK_INTERVAL_S": "0",  # a thousand kills, not a login storm
        }
        dump_policy(chaos_policy(), Path(stack.env["GPUMEDIC_POLICY_FILE"]))
        stack.start_services(CONTROL_PLANE)
        await stack.wait_ready(timeout_s=120)
        stack.start_supervising()

        # The run's own connections lose their server at every bounce, which it causes itself: a
        # line each time would bury the progress; the audit counts what the bounces cost.
        for user in (SIM_FLEET, ADMIN):
            logging.getLogger(f"gpumedic-{user}.bus").setLevel(logging.ERROR)
        fleet_nc = await stack.connect(SIM_FLEET)
        connections.append(fleet_nc)
        js = fleet_nc.jetstream()

        in_flight: set[asyncio.Task] = set()

        async def store(event: Event) -> None:
            try:
                await js.publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": str(event.event_id)}, timeout=2)
            except Exception:  # a server is being bounced: the node's next sample comes in a second
                result.publish_failures += 1

        async def publish(event: Event) -> None:
            # Not awaited: a node's sampling goes on while a bounced server's stream elects.
            task = asyncio.create_task(store(event))
            in_flight.add(task)
            task.add_done_callback(in_flight.discard)

        tasks.append(asyncio.create_task(fleet.run_samplers(publish, SAMPLE_INTERVAL_S)))
        say(f"[2/4] {incidents} zombie jobs at {rate_per_s:g}/s; "
            + (f"SIGKILL a service every {kill_every_s:g}s, " if kill_every_s > 0 else "no service killed at random, ")
            + (f"{'restart' if bounce_signal == 'term' else 'SIGKILL'} a nats-server every {bounce_every_s:g}s"
               if bounce_every_s > 0 else "no nats-server bounced"))
        admin = await stack.connect(ADMIN)
        connections.append(admin)
        ready_at: dict[str, float] = {}  # each service's last `ready` heartbeat (monotonic)

        async def on_heartbeat(msg) -> None:
            with contextlib.suppress(Exception):
                beat = ServiceHeartbeat.from_json(msg.data, subject=msg.subject)
                if beat.state == "ready":
                    ready_at[beat.service] = time.monotonic()

        await admin.subscribe(ServiceHeartbeat.subject_filter(), cb=on_heartbeat)
        stop = asyncio.Event()
        if kill_every_s > 0:
            tasks.append(asyncio.create_task(_kill_services(stack, rng, kill_every_s, ready_at, stop, result)))
        if meanwhile is not None:
            tasks.append(asyncio.create_task(meanwhile(stack, result)))
        if bounce_every_s > 0:
            how = {"term": signal.SIGTERM, "kill": signal.SIGKILL}[bounce_signal]
            tasks.append(asyncio.create_task(_bounce_servers(stack, rng, bounce_every_s, how, stop, result)))
        open_incidents = await IncidentStates.open(admin.jetstream())
        await _inject(fleet, open_incidents, rng, incidents, rate_per_s, result, say)
        stop.set()
        say(f"[3/4] chaos over; waiting up to {settle_s:.0f}s for every zombie to be fixed")
        deadline = time.monotonic() + settle_s
        while time.monotonic() < deadline and any(_alive(fleet, z) for z in result.injected):
            await asyncio.sleep(1)
        await asyncio.sleep(5)  # the last results reach report-builder
        say("[4/4] the audit: the replicated streams, the nodes' own command logs, the store")
        await _audit(stack, admin, fleet, result)
        return result
    finally:
        await wind_down(stack, tasks=tasks, connections=connections, parts=(fleet,))
        supervisor_log.close()


def _alive(fleet: SimFleet, zombie: Injected) -> bool:
    process = fleet.node(zombie.node_id).process(zombie.pid)
    return process is not None and process.alive


async def _inject(fleet: SimFleet, open_incidents: IncidentStates, rng: random.Random, count: int, rate_per_s: float,
                  result: ChaosResult, say) -> None:
    """`count` zombies at about `rate_per_s`, one per node at a time: a node is free again once its
    last zombie is gone and its incident closed (`REINJECT_AFTER_S` ago). (The gate runs one
    action on a node at a time, and a GPU that hangs again while its incident is still verifying
    the last kill is that same incident, not a new one: both right, neither what this run counts.)"""
    closed_at: dict[str, float] = {}
    holding: dict[str, Injected] = {}
    started = time.monotonic()
    give_up = started + 3 * count / rate_per_s + 60  # a stack that no longer fixes anything ends the run
    while len(result.injected) < count and time.monotonic() < give_up:
        now = time.monotonic()
        # Asked all at once, each bounded: one at a time, a bucket that elects (a server bounced)
        # held every round for its timeout per node, and the injection fell from 6/s to 0.5/s.
        fixed = [(node_id, zombie) for node_id, zombie in holding.items() if not _alive(fleet, zombie)]
        closed = await asyncio.gather(*(_closed(open_incidents, zombie) for _, zombie in fixed))
        for (node_id, _), done in zip(fixed, closed, strict=True):
            if done:
                closed_at[node_id] = now
                del holding[node_id]
        free = [n for n in fleet.nodes if n not in holding and now - closed_at.get(n, -REINJECT_AFTER_S) >= REINJECT_AFTER_S]
        if free:
            node_id = rng.choice(free)
            gpu = rng.randrange(len(fleet.node(node_id).gpus))
            process = fleet.node(node_id).inject_zombie(gpu)
            zombie = Injected(node_id, gpu, process.pid, datetime.now(UTC))
            holding[node_id] = zombie
            result.injected.append(zombie)
            if len(result.injected) % 100 == 0:
                say(f"      {len(result.injected)} injected after {time.monotonic() - started:.0f}s")
        await asyncio.sleep(1 / rate_per_s)


async def _closed(open_incidents: IncidentStates, zombie: Injected) -> bool:
    """No open zombie incident on the zombie's GPU (unknown while the bucket elects: not closed)."""
    try:
        async with asyncio.timeout(CLOSED_ASK_S):
            return await open_incidents.get(fingerprint(zombie.node_id, IncidentKind.ZOMBIE_JOB, zombie.gpu)) is None
    except Exception:  # noqa: BLE001 (asked again next round)
        return False


CLOSED_ASK_S = 1.0
"""How long the injection waits for the bucket's word on one zombie's incident before asking next round."""


def _running_for(stack: Stack, name: str, now: float, started: float) -> float:
    """How long the supervisor's `name` has run since it was last (re)started."""
    restart = stack.restarts.get(name)
    if restart is None:
        return now - started
    return -1.0 if restart.due is not None else now - restart.since


async def _kill_services(stack: Stack, rng: random.Random, every_s: float, ready_at: dict[str, float], stop: asyncio.Event,
                         result: ChaosResult) -> None:
    """SIGKILL a random service that is back: ready again since it was last killed (else the next
    kill would only stretch the last one's resume time) and running HEALTHY_FOR_S."""
    started = time.monotonic()
    killed_at: dict[str, float] = {}
    while not stop.is_set():
        await asyncio.sleep(every_s)
        now = time.monotonic()
        back = [s for s in CONTROL_PLANE
                if _running_for(stack, s, now, started) >= HEALTHY_FOR_S and stack.processes[s].poll() is None
                and ready_at.get(s, -1.0) > killed_at.get(s, 0.0)]
        if not back:
            continue
        victim = rng.choice(back)
        with contextlib.suppress(ProcessLookupError):
            os.kill(stack.processes[victim].pid, signal.SIGKILL)
            result.service_kills.append((victim, time.time()))
            killed_at[victim] = now


async def _bounce_servers(stack: Stack, rng: random.Random, every_s: float, how: signal.Signals, stop: asyncio.Event,
                          result: ChaosResult) -> None:
    started = time.monotonic()
    names = [server_name(n) for n in range(len(stack.servers))]
    bounced_at: dict[str, float] = {}
    while not stop.is_set():
        await asyncio.sleep(every_s)
        now = time.monotonic()
        # One at a time, the other two keeping the cluster's quorum: none may still be going down
        # (a SIGTERMed server takes a moment) or not yet restarted.
        if any(name not in stack.restarts or stack.restarts[name].since < at for name, at in bounced_at.items()):
            continue
        up = [n for n, name in enumerate(names) if _running_for(stack, name, now, started) >= HEALTHY_FOR_S]
        if not up:
            continue
        victim = rng.choice(up)
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.kill(stack.servers[victim].pid, how)
            result.bounces += 1
            bounced_at[names[victim]] = now


async def _read_all(js, event_type: type[Event]) -> list:
    """Every stored event of this type, from the start of its (replicated) stream: read until
    the consumer has nothing left (its pending count plus what it delivered already)."""
    stream = stream_of(event_type)
    sub = await js.subscribe(stream.stored_filter(event_type), stream=stream.name, ordered_consumer=True,
                             deliver_policy=DeliverPolicy.ALL)
    events = []
    try:
        while True:
            info = await sub.consumer_info()
            if len(events) >= (info.num_pending or 0) + (info.delivered.consumer_seq or 0):
                break
            msg = await sub.next_msg(timeout=10)
            events.append(event_type.from_json(msg.data, subject=msg.subject))
    finally:
        await sub.unsubscribe()
    return events


async def _audit(stack: Stack, admin, fleet: SimFleet, result: ChaosResult) -> None:
    from sqlalchemy import select

    from gpumedic_store import views
    from gpumedic_store.models import ActionRecord, Incident

    js = admin.jetstream()
    opened = [e for e in await _read_all(js, IncidentOpened) if e.kind == "zombie_job"]
    completed = await _read_all(js, ActionCompleted)
    result.incidents, result.actions = len({e.incident_id for e in opened}), len({e.action_id for e in completed})

    # each incident belongs to the last zombie injected on its GPU before it opened
    by_slot: dict[tuple[str, int], list[Injected]] = {}
    for zombie in result.injected:
        by_slot.setdefault((zombie.node_id, zombie.gpu), []).append(zombie)
    counts = {id(z): set() for z in result.injected}  # distinct incident ids (a re-published event is one)
    for incident in opened:
        earlier = [z for z in by_slot.get((incident.node_id, incident.gpu_index), []) if z.at <= incident.occurred_at]
        if earlier:
            counts[id(earlier[-1])].add(incident.incident_id)
        else:
            result.spurious += 1
    result.lost = [z for z in result.injected if not counts[id(z)]]
    result.doubled = [z for z in result.injected if len(counts[id(z)]) > 1]
    result.unfixed = [z for z in result.injected if _alive(fleet, z)]
    for zombie in result.injected:
        kills = fleet.node(zombie.node_id).ssh_commands.count(f"kill -s TERM {zombie.pid}")
        if kills > 1:
            result.killed_twice.append(zombie.pid)

    async with views.store_session(stack.store_url) as session:
        stored_incidents = set((await session.execute(select(Incident.id))).scalars())
        stored_actions = {str(a) for a in (await session.execute(select(ActionRecord.action_id))).scalars()}
    result.missing_incidents = sum(1 for e in opened if str(e.incident_id) not in {str(i) for i in stored_incidents})
    result.missing_actions = sum(1 for e in completed if str(e.action_id) not in stored_actions)

    beats = [b for b in await _read_all(js, ServiceHeartbeat) if b.state == "ready"]
    for service, killed_at in result.service_kills:
        after = [b.occurred_at.timestamp() for b in beats if b.service == service and b.occurred_at.timestamp() > killed_at]
        if after:
            result.resumes.setdefault(service, []).append(min(after) - killed_at)
        else:
            result.not_resumed.append(service)
