"""`gpumedic sim`: the embedded stack on a simulated fleet of N nodes, with the faults of a
scenario injected on schedule, and a score of what the system saw against what was injected.

Every fault reaches the services through the interfaces a real node offers: samples and
immediate events from the real node-sampler code (over simulated NVML, /proc, kernel log and
Docker engine), SSH, and the peer status endpoint. The score compares the incidents detectors
opened with each injection's answer key (`gpumedic_sim.runs.scoring`): benign behaviour scripted beside
the faults must open none.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, replace
from datetime import datetime
from pathlib import Path
from typing import Any

from gpumedic_sim.runs.pace import demo_env
from gpumedic_sim.machine.busy import Busy
from gpumedic_sim.fleet.nodes import SimFleet
from gpumedic_sim.runs.pager import Pager
from gpumedic_sim.fleet.runpod import RentedFleet
from gpumedic_sim.runs.scenario import FaultSpec, Scenario, merged
from gpumedic_sim.runs.scoring import Observed, render, score
from gpumedic_sim.machine.node import checks_every_s
from gpumedic_sim.machine.parts import JOB_UNIT, PEER_UNIT, SAMPLER_UNIT, TRAIN_UNIT
from gpumedic_sim.fleet.plan import POOL_NODE
from gpumedic_sim.fleet.workers import SimWorkerPool
from gpumedic_sim.runs.pool_judge import judge
from gpumedic.stack import Stack, services_here, wind_down
from gpumedic_bus.topology import OBSERVER, SIM_FLEET
from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    CapacityEvaluated,
    Event,
    IncidentCosted,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
)
from gpumedic_incidents import Policy
from gpumedic_incidents.policy import (
    Actions,
    AdminEndpoint,
    AdminPolicy,
    FlappingPolicy,
    CheckFailedPolicy,
    FileMissingPolicy,
    LogPatternPolicy,
    FleetPolicy,
    IdleJobsPolicy,
    JobHungPolicy,
    JobRestart,
    KillPolicy,
    Kinds,
    NoLeaderPolicy,
    OrphanPolicy,
    PartitionPolicy,
    PhantomPolicy,
    RestartJobPolicy,
    RestartWorkerPolicy,
    StuckPolicy,
    BlockedPeerPolicy,
    PeerPolicy,
    SlowPeerPolicy,
    RestartPolicy,
    Step,
    TargetPolicy,
    UnitRule,
    ZombiePolicy,
    dump_policy,
)


OBSERVED: tuple[type[Event], ...] = (
    IncidentOpened,
    IncidentUpdated,
    IncidentResolved,
    IncidentEscalated,
    ActionRequested,
    ActionCompleted,
    CapacityEvaluated,
    IncidentCosted,
)
"""What the score is built from: the incidents detectors opened (and the fleet incidents they
joined later); reported beside it, the actions taken and how each incident ended, and the
autoscaler's decisions (for a worker pool)."""
NOTIFY_WAIT_S = 2.0
"""The sim's report-builder waits this long after an escalation before paging (its group wait)."""


SIM_BREAKER_MAX_NODES = 20
SIM_BREAKER_MAX_SHARE = 0.5
"""The built-in faults scenario acts on 8 nodes within two minutes; the shipped breaker allows 5
nodes and a quarter of the fleet."""


SPARE_PEERS = 3
"""The sim's peer target is the fleet less this many."""
FELL_BEHIND_SHARE = 0.01
"""Above this share of sampling ticks skipped, the fleet (every simulated node's sampler in this one
process) could not keep up on this machine, and the run says so beside its score."""


def fell_behind(skipped: int, ticks: float, nodes: int) -> str | None:
    """What to say when the fleet's samplers skipped more than FELL_BEHIND_SHARE of their ticks."""
    if ticks <= 0 or skipped <= FELL_BEHIND_SHARE * ticks:
        return None
    return (f"the simulated fleet fell behind: its samplers skipped {skipped:,} of about {ticks:,.0f} sampling ticks "
            f"({skipped / ticks:.0%}). This machine does not run {nodes} simulated nodes in time, so a miss above may be "
            "the fleet's, not a detector's: run fewer --nodes")


def sim_policy(interval_s: float, n_nodes: int = 0, pool: SimWorkerPool | None = None, operator: Mapping[str, Any] | None = None) -> Policy:
    """The shipped policy with a run's seconds instead of the runbooks' minutes (a zombie after
    six sample intervals idle, so a short dip of a few intervals is not one), and what an operator
    of the simulated peer cluster would add: its daemon's unit, its election endpoint and its
    target (every node but a spare few: a peer restarting is no shortfall); with a worker pool,
    its actions and its checks' thresholds; and the scenario's own changes (`operator`) over all that."""
    policy = _fleet_policy(interval_s, n_nodes).model_dump(mode="json")
    if pool is not None:
        policy = merged(policy, pool.policy())
    return Policy.model_validate(merged(policy, operator or {}))


def _fleet_policy(interval_s: float, n_nodes: int) -> Policy:
    return Policy(
        fleet=FleetPolicy(hold_s=2 * interval_s),
        actions=Actions(
            restart_unit=RestartPolicy(units={SAMPLER_UNIT: UnitRule(), PEER_UNIT: UnitRule()}),
            restart_job=RestartJobPolicy(jobs={"selfplay": JobRestart(unit=JOB_UNIT), "train": JobRestart(unit=TRAIN_UNIT)}),
            restart_worker=RestartWorkerPolicy(back_within_s=12 * interval_s, poll_s=interval_s),
            stop_job=KillPolicy(grace_s=2.0),
            http_admin=AdminPolicy(endpoints={
                "force_election": AdminEndpoint(url="http://127.0.0.1:8770/force_election"),
                "reset_job_count": AdminEndpoint(
                    url="http://127.0.0.1:8770/admin/reset_node_jobs", target="leader", body={"node_id": "{node_id}"}
                ),
            }),
        ),
        kinds=Kinds(
            zombie_job=ZombiePolicy(
                idle_for_s=6 * interval_s,
                restart_job="selfplay",  # the work starts again once the kill is verified
                action_timeout_s=60,
                ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=4 * interval_s),),
            ),
            orphan_gpu_holder=OrphanPolicy(
                action_timeout_s=60 + 30 * interval_s,  # a kill that fails takes its grace and the verify timeout
                ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=4 * interval_s),
                        Step(action="restart_worker", verify_within_s=6 * interval_s)),
            ),
            phantom_jobs=PhantomPolicy(idle_for_s=6 * interval_s, ladder=(Step(action="http_admin", verify_within_s=6 * interval_s),)),
            idle_jobs=IdleJobsPolicy(idle_for_s=6 * interval_s),
            # the node that stopped drained, the job's ranks stopped everywhere, then its agents restarted on
            # its other nodes: it starts again without that node
            job_hung=JobHungPolicy(idle_for_s=8 * interval_s, restart_job="train",
                                   ladder=(Step(action="drain_node", verify_within_s=4 * interval_s),
                                           Step(action="stop_job", verify_within_s=12 * interval_s))),
            stuck_process=StuckPolicy(idle_for_s=6 * interval_s),
            no_leader=NoLeaderPolicy(grace_s=2 * interval_s, ladder=(Step(action="http_admin", attempts=2, verify_within_s=6 * interval_s),)),
            peer_blocked=BlockedPeerPolicy(after_checks=2, daemon_unit=PEER_UNIT, ladder=(Step(action="restart_unit", verify_within_s=6 * interval_s),)),
            peer_down=PeerPolicy(after_checks=2, daemon_unit=PEER_UNIT, ladder=(Step(action="restart_unit", verify_within_s=6 * interval_s),)),
            slow_peer=SlowPeerPolicy(daemon_unit=PEER_UNIT, ladder=(Step(action="restart_unit", verify_within_s=6 * interval_s),)),
            leader_flapping=FlappingPolicy(max_changes=4, window_s=12 * interval_s),
            peer_partitioned=PartitionPolicy(for_s=4 * interval_s),
            file_missing=FileMissingPolicy(for_s=4 * interval_s),
            check_failed=CheckFailedPolicy(for_s=2.5 * checks_every_s(interval_s)),  # a blip is one run of the check
            log_pattern=LogPatternPolicy(count=3, window_s=12 * interval_s),
            peers_below_target=TargetPolicy(target=max(0, n_nodes - SPARE_PEERS), for_s=3 * interval_s),
        ),
    )


class Observer:
    """Collects the incidents opened and the actions taken, from the bus."""

    def __init__(self) -> None:
        self.incidents: dict[str, Observed] = {}
        self.actions: dict[str, int] = {}
        """"requested", then each ActionCompleted outcome -> how many."""
        self.endings: dict[str, str] = {}
        """incident id -> "fixed", "cleared" or "escalated" (the first ending seen)."""
        self.fixed_after_s: dict[str, float] = {}
        """incident id -> seconds from its opening to its verified fix."""
        self.escalated_at: dict[str, datetime] = {}
        self.resolved_at: dict[str, datetime] = {}
        """incident id -> when it closed, whatever came before (a person's incident closes too)."""
        self.received = 0
        self.undecodable = 0
        self.decisions: list[tuple[datetime, str, int]] = []
        """The autoscaler's capacity decisions: (when, decision, GPUs in service)."""
        self.costs: dict[str, IncidentCosted] = {}
        """incident id -> what report-builder said it cost, once it closed."""

    def take(self, event: Event) -> None:
        self.received += 1
        match event:
            case IncidentOpened():
                self.incidents.setdefault(str(event.incident_id), Observed.from_event(event))
            case IncidentUpdated(related_incident_id=related) if related is not None:
                seen = self.incidents.get(str(event.incident_id))
                if seen is not None and seen.related_to is None:
                    self.incidents[seen.incident_id] = replace(seen, related_to=str(related))
            case IncidentResolved():
                incident_id = str(event.incident_id)
                self.endings.setdefault(incident_id, event.resolution)
                self.resolved_at.setdefault(incident_id, event.occurred_at)
                if event.resolution == "fixed" and (seen := self.incidents.get(incident_id)) is not None:
                    self.fixed_after_s.setdefault(incident_id, (event.occurred_at - seen.at).total_seconds())
            case IncidentEscalated():
                self.endings.setdefault(str(event.incident_id), "escalated")
                self.escalated_at.setdefault(str(event.incident_id), event.occurred_at)
            case ActionRequested():
                self.actions["requested"] = self.actions.get("requested", 0) + 1
            case ActionCompleted():
                self.actions[event.outcome.value] = self.actions.get(event.outcome.value, 0) + 1
            case CapacityEvaluated():
                self.decisions.append((event.occurred_at, event.decision, event.gpus_total))
            case IncidentCosted():
                self.costs.setdefault(str(event.incident_id), event)

    def actions_line(self) -> str:
        done = ", ".join(f"{n} {outcome}" for outcome, n in sorted(self.actions.items()) if outcome != "requested")
        return f"actions: {self.actions.get('requested', 0)} requested" + (f" ({done})" if done else "")

    def to_page(self) -> set[str]:
        """Escalated incidents a person should be paged for: all but those part of a fleet incident
        (paged once, as the fleet incident), those of `info` severity (below report-builder's
        default threshold), and those closed within the notify wait (a worker on a bad machine
        ended meanwhile: nobody need be told). A silenced incident never escalates while silenced."""
        return {
            i for i, how in self.endings.items()
            if how == "escalated"
            and (seen := self.incidents.get(i)) is not None
            and seen.related_to is None
            and seen.severity != "info"
            and not (i in self.resolved_at and (self.resolved_at[i] - self.escalated_at[i]).total_seconds() < NOTIFY_WAIT_S)
        }

    def outcomes(self, paged: set[str]) -> dict[str, dict[str, float | None]]:
        """Per incident kind: how many were fixed and verified, cleared, escalated, paged, still open,
        and the median and 99th percentile of the time from opening to verified fix."""
        table: dict[str, dict] = {}
        fix_times: dict[str, list[float]] = {}
        for incident_id, seen in self.incidents.items():
            row = table.setdefault(seen.kind, {"fixed": 0, "cleared": 0, "escalated": 0, "paged": 0, "open": 0})
            row[self.endings.get(incident_id, "open")] += 1
            row["paged"] += incident_id in paged
            if incident_id in self.fixed_after_s:
                fix_times.setdefault(seen.kind, []).append(self.fixed_after_s[incident_id])
        for kind, row in table.items():
            times = sorted(fix_times.get(kind, ()))
            row["fix_p50_s"] = round(percentile(times, 0.50), 2) if times else None
            row["fix_p99_s"] = round(percentile(times, 0.99), 2) if times else None
        return dict(sorted(table.items()))


def percentile(ordered: list[float], q: float) -> float:
    """The nearest-rank percentile of sorted values."""
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def render_outcomes(outcomes: dict[str, dict]) -> str:
    if not outcomes:
        return "outcomes: no incident"
    lines = [f"{'incident kind':<20} {'fixed':>5} {'cleared':>7} {'escalated':>9} {'paged':>5} {'open':>4}  open -> fixed p50 / p99"]
    for kind, row in outcomes.items():
        fix = f"{row['fix_p50_s']:.1f}s / {row['fix_p99_s']:.1f}s" if row["fix_p50_s"] is not None else "-"
        lines.append(
            f"{kind:<20} {row['fixed']:>5} {row['cleared']:>7} {row['escalated']:>9} {row['paged']:>5} {row['open']:>4}  {fix}"
        )
    return "\n".join(lines)


async def run_simulation(
    var_dir: Path,
    *,
    nodes: int,
    gpus: int,
    scenario: Callable[[list[str], int], Scenario],
    duration_s: float | None = None,
    interval_s: float = 5.0,
    json_path: Path | None = None,
    env: dict[str, str] | None = None,
    busy: Busy | None = None,
    say=print,
) -> int:
    """Run the fleet with the scenario's faults; print the score. 0 when the run completed and met
    what the scenario expects (`expect:`, and every pool check where it runs a pool), 1 when not."""
    started = time.monotonic()
    var_dir.mkdir(parents=True, exist_ok=True)
    fleet = SimFleet(nodes, gpus, var_dir / "fleet")
    plan = scenario(list(fleet.nodes), gpus)
    pool = SimWorkerPool(plan.pool, var_dir / "pool", interval_s=interval_s, fleet=fleet) if plan.pool else None
    # Without a worker pool the fleet's nodes are rented pods (restart_worker restarts them); with
    # one, the pool's provider is the remediator's.
    rented = RentedFleet(fleet.nodes, var_dir / "fleet") if pool is None else None
    duration = duration_s if duration_s is not None else (plan.duration_s or _default_duration(plan, interval_s))
    stack = Stack(var_dir, say=say)
    pager = Pager()
    connections = []
    tasks: list[asyncio.Task] = []
    fleet_log: logging.Handler | None = None
    root_level = logging.getLogger().level  # the fleet's log lowers it to INFO; given back at the end
    try:
        say(f"[1/5] starting the bus and the store under {var_dir}/")
        stack.start_bus(sim_fleet=True)
        fleet_log = _log_fleet_to(stack.logs / "fleet.log")
        await stack.provision()
        stack.migrate()
        say(f"[2/5] starting a simulated fleet: {nodes} nodes x {gpus} GPUs")
        await fleet.start()
        if rented is not None:
            await rented.start()
        if pool is not None:
            await pool.start()
            say(f"      and a rented worker pool: tasks on a demand curve in {pool.db_path}, the simulated provider "
                f"at {pool.api.base_url} (RunPod's API)")
        pager.start()
        stack.env = {
            **demo_env(fleet.control_plane_env(), fleet.workdir),
            "GPUMEDIC_SAMPLER_INTERVAL_S": str(interval_s),
            # The on-call person is a webhook receiver on loopback: every escalation should reach it.
            "GPUMEDIC_REPORTS_WEBHOOK_URL": pager.url,
            "GPUMEDIC_REPORTS_NOTIFY_WAIT_S": str(NOTIFY_WAIT_S),
            # A scenario crams a fault of every kind into two minutes, more nodes than the shipped
            # breaker's 5 (and a quarter of the fleet) in 10 minutes: raised, so that every ladder
            # shows (said below).
            "GPUMEDIC_REMEDIATOR_BREAKER_MAX_NODES": str(SIM_BREAKER_MAX_NODES),
            "GPUMEDIC_REMEDIATOR_BREAKER_MAX_SHARE": str(SIM_BREAKER_MAX_SHARE),
            **(pool.env() if pool is not None else {}),
            **(rented.env() if rented is not None else {}),
            **(env or {}),
        }
        dump_policy(sim_policy(interval_s, len(fleet.nodes), pool, plan.policy), Path(stack.env["GPUMEDIC_POLICY_FILE"]))
        services, no_gpu = services_here()
        say(
            f"[3/5] starting the {'five' if no_gpu else 'six'} services (the remediator's breaker raised to "
            f"{stack.env['GPUMEDIC_REMEDIATOR_BREAKER_MAX_NODES']} nodes and "
            f"{float(stack.env['GPUMEDIC_REMEDIATOR_BREAKER_MAX_SHARE']):.0%} of the fleet in 10 minutes, for a scenario's burst)"
            + (f"; not this machine's node-sampler: it has no usable NVIDIA driver ({no_gpu}), and the fleet is the simulated one"
               if no_gpu else "")
        )
        stack.start_services(services)
        await stack.wait_ready()

        # The simulated nodes publish as the fleet's user; the score is read as the observer.
        fleet_nc, observer_nc = await stack.connect(SIM_FLEET), await stack.connect(OBSERVER)
        connections += [fleet_nc, observer_nc]
        js = fleet_nc.jetstream()
        observer = Observer()
        for event_type in OBSERVED:
            await observer_nc.subscribe(event_type.subject_filter(), cb=_collect(event_type, observer))

        async def publish(event: Event) -> None:
            await js.publish(event.subject, event.to_json(), headers={"Nats-Msg-Id": str(event.event_id)})

        tasks.append(asyncio.create_task(fleet.run_samplers(publish, interval_s, busy=busy)))
        sampling_since = time.monotonic()
        say(
            f"[4/5] scenario {plan.name!r}: {len(plan.faults)} injection(s) over {duration:.0f}s, "
            f"samples every {interval_s:g}s" + (", every node busy (its sampler late and bursty, its CPUs pressed)" if busy else "")
        )
        tasks.append(asyncio.create_task(_inject_on_schedule(fleet, plan.faults, time.monotonic(), say)))
        pool_run = None
        if pool is not None:
            say(f"      worker pool: {pool.plan.demand_s:.0f}s of demand, then until the queue is empty and quiet a while (at most {duration:.0f}s in all)")
            pool_run = asyncio.create_task(pool.run(publish, drain_s=max(0.0, duration - pool.plan.demand_s)))
            tasks.append(pool_run)
        deadline = time.monotonic() + duration
        while time.monotonic() < deadline and not (pool_run is not None and pool_run.done()):
            await asyncio.sleep(min(1.0, max(0.0, deadline - time.monotonic())))
            for task in tasks:
                if task.done() and not task.cancelled() and task.exception() is not None:
                    raise task.exception()
            stack.check_alive()

        await _wait_for_pages(observer, pager)
        await _wait_for_costs(observer)
        on_pool = {POOL_NODE, *pool.provider.rented()} if pool is not None else set()
        result = score(fleet.injected, [i for i in observer.incidents.values() if i.node_id not in on_pool])
        paged = pager.incidents() & observer.incidents.keys()
        outcomes = observer.outcomes(paged)
        skipped = sum(s.skipped_ticks for s in fleet.samplers.values())
        ticks = nodes * (time.monotonic() - sampling_since) / interval_s
        behind = fell_behind(skipped, ticks, nodes)
        late = sum(b.late_wakeups for b in fleet.busy_nodes.values())
        bursts = sum(b.bursts for b in fleet.busy_nodes.values())
        say(f"[5/5] score after {time.monotonic() - started:.0f}s ({observer.received} events observed):")
        say("")
        say(render(result))
        say(f"ticks skipped: {skipped:,} of about {ticks:,.0f} ({skipped / max(ticks, 1):.0%})" + (
            f"; busy nodes: {late:,} late wake-ups, {bursts:,} bursts" if busy else ""))
        if behind:
            say(behind)
        say(observer.actions_line())
        say("")
        say(render_outcomes(outcomes))
        unpaged = observer.to_page() - paged
        say(f"paged: {len(paged)} escalation(s) reached the on-call webhook" + (f"; {len(unpaged)} did not" if unpaged else ""))
        pool_document = None
        if pool is not None:
            figures = pool.figures()
            checks = judge(figures, pool.plan, [i for i in observer.incidents.values() if i.node_id in on_pool], observer.decisions,
                           burn_in_within_s=pool.burn_in_within_s, interval_s=interval_s,
                           costs=[c for c in observer.costs.values() if c.node_id in on_pool])
            say("")
            say(f"worker pool ({len(figures.rented)} worker(s) rented; the fleet's score above leaves out the pool's incidents):")
            for ok, line in checks:
                say(f"  {'ok  ' if ok else 'FAIL'} {line}")
            pool_document = {**asdict(figures), "checks": [{"ok": ok, "check": line} for ok, line in checks]}
        shortfalls = None
        if plan.expect is not None:
            shortfalls = plan.expect.shortfalls(result) + [f"pool check failed: {line}" for ok, line in (checks if pool is not None else ()) if not ok]
            say("")
            say("expectations: " + ("met" if not shortfalls else "NOT met: " + "; ".join(shortfalls)))
        if json_path is not None:
            document = {**result.to_dict(), "actions": observer.actions, "outcomes": outcomes, "paged": len(paged), "unpaged": len(unpaged),
                        "ticks_skipped": skipped, "ticks": round(ticks), "busy": busy is not None,
                        **({"pool": pool_document} if pool_document is not None else {}),
                        **({"expectations": shortfalls} if shortfalls is not None else {})}
            json_path.write_text(json.dumps(document, indent=2, default=str) + "\n")
            say(f"\nscore written to {json_path}")
        return 1 if shortfalls else 0
    finally:
        say("stopping: sampling, services, bus, fleet")
        await wind_down(stack, tasks=tasks, connections=connections, parts=(fleet, pool, rented))
        pager.stop()
        if fleet_log is not None:
            logging.getLogger().removeHandler(fleet_log)
            logging.getLogger().setLevel(root_level)
            fleet_log.close()
        say("stopped; no process left behind")


async def _wait_for_pages(observer: Observer, pager: Pager, timeout_s: float = NOTIFY_WAIT_S + 10) -> None:
    """Escalations near the end of the run are paged after the notify wait: give them that long."""
    deadline = time.monotonic() + timeout_s
    while observer.to_page() - pager.incidents() and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


async def _wait_for_costs(observer: Observer, timeout_s: float = 20.0) -> None:
    """report-builder prices each incident as it closes: those closed near the end get that long.
    A cost still missing after it is one the score reports as missing."""
    deadline = time.monotonic() + timeout_s
    while set(observer.resolved_at) - set(observer.costs) and time.monotonic() < deadline:
        await asyncio.sleep(0.2)


def _log_fleet_to(path: Path) -> logging.Handler:
    """The simulated nodes' samplers log what real ones would (an OOM kill, a lost GPU): to a
    file beside the services' logs, so the terminal shows the run and its score."""
    handler = logging.FileHandler(path)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    for chatty in ("asyncssh", "nats"):
        logging.getLogger(chatty).setLevel(logging.WARNING)
    return handler


async def _inject_on_schedule(fleet: SimFleet, faults: tuple[FaultSpec, ...], start: float, say) -> None:
    for spec in faults:
        await asyncio.sleep(max(0.0, start + spec.at_s - time.monotonic()))
        where = spec.node if spec.gpu is None else f"{spec.node} GPU {spec.gpu}"
        try:
            await fleet.inject(spec.fault, spec.node, spec.gpu, **dict(spec.params))
        except (ValueError, KeyError) as exc:
            say(f"      +{spec.at_s:5.0f}s  NOT injected {spec.fault} on {where}: {exc}")
            continue
        say(f"      +{spec.at_s:5.0f}s  injected {spec.fault} on {where}")


def _collect(event_type: type[Event], observer: Observer):
    async def _cb(msg) -> None:
        try:
            event = event_type.from_json(msg.data, subject=msg.subject)
        except ValueError:
            observer.undecodable += 1
            return
        observer.take(event)

    return _cb


def _default_duration(plan: Scenario, interval_s: float) -> float:
    """Long enough after the last fault for detection (idle window + verification), and for a
    worker pool's queue to empty after its demand curve."""
    last = max((f.at_s for f in plan.faults), default=0.0)
    pool = plan.pool.demand_s + max(120.0, 4 * plan.pool.task) if plan.pool else 0.0
    return max(last + max(60.0, 6 * interval_s), pool)
