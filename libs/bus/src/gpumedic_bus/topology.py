"""Who may do what on the bus, derived from one table of the contract.

`PRODUCERS` says which service publishes each event; `DURABLES` lists every durable consumer
(its name, the service that owns it, the event it carries, pull or push); `KV_ACCESS` says which
service reads or writes which key-value bucket. Everything else is derived from these tables:

- what `provision` creates (streams, buckets, consumers), with an admin identity, once;
- the NATS permissions of each user (`permissions_for`): its own subjects, the JetStream API
  calls for its own durables and acks, its own inbox, and nothing else. No service can create,
  update or delete a stream or a consumer; a node-sampler can publish only its own node's facts;
- the producers and consumers in `proto/`.

A service that needs a new subject or consumer changes these tables; nothing else grants it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    CapacityEvaluated,
    ClusterChecked,
    ContainerExited,
    Event,
    GpuLost,
    GpuXidReported,
    IncidentCosted,
    IncidentEscalated,
    IncidentKind,
    IncidentMarked,
    IncidentOpened,
    IncidentResolved,
    IncidentUpdated,
    MessageRejected,
    NodeFindings,
    NodeSampled,
    NodeDrained,
    NodeRetired,
    NodeSshChecked,
    NodeUndrained,
    ListenBacklogReported,
    ProcessOomKilled,
    ServiceHeartbeat,
    SilenceAdded,
    SilenceRemoved,
    SpansExported,
    SubjectToken,
)
from gpumedic_events.preflight import PREFLIGHT_SUBJECT
from gpumedic_events.logs import LOGS_SUBJECT
from gpumedic_events.rollout import ROLLOUT_SUBJECT
from gpumedic_bus.streams import INCIDENT_STATE, INCIDENTS, LEASES, PARTITIONS, RULE_MEMORY, stream_of

SERVICES: tuple[str, ...] = (
    "node-sampler",
    "zombie-detector",
    "leader-health",
    "autoscaler",
    "remediator",
    "report-builder",
)

NODE_FACTS: tuple[type[Event], ...] = (NodeSampled, GpuXidReported, GpuLost, ProcessOomKilled, ContainerExited, ListenBacklogReported)
"""What a node reports about itself, routed by its node id."""


@dataclass(frozen=True)
class Durable:
    """One durable consumer: provisioned by the admin, bound (never created) by its service."""

    name: SubjectToken
    service: str
    event: type[Event]
    delivery: Literal["pull", "paced"] = "pull"
    """pull: fetched a few at a time, each acknowledged (`EventConsumer`); paced: disposable samples,
    asked for in batches on a pace and acknowledged once a batch (`PacedConsumer`)."""
    more: tuple[type[Event], ...] = ()
    """Further events of the same stream it reads (a detector cell's node events, one consumer)."""
    partition: int | None = None
    """Reads only this partition's nodes (`streams.PARTITIONS`) of a partitioned stream."""

    @property
    def events(self) -> tuple[type[Event], ...]:
        return (self.event, *self.more)

    @property
    def stream(self) -> str:
        return stream_of(self.event).name

    @property
    def filter_subjects(self) -> tuple[str, ...]:
        """What it reads of its stream: every stored message of its events (of its partition)."""
        stream = stream_of(self.event)
        if any(stream_of(e) is not stream for e in self.more):
            raise ValueError(f"{self.name}: one consumer reads one stream")
        if self.partition is None:
            return tuple(stream.stored_filter(e) for e in self.events)
        return tuple(stream.partition_filter(e, self.partition) for e in self.events)

    @property
    def filter_subject(self) -> str:
        """Its one filter (a consumer of one event)."""
        if self.more:
            raise ValueError(f"{self.name} reads {len(self.events)} events: use filter_subjects")
        return self.filter_subjects[0]

    def published_subject(self, stored: str) -> str:
        """The subject a message it reads was published on (a partitioned stream stores it with its partition)."""
        return stream_of(self.event).as_published(stored)


DETECTORS: tuple[str, ...] = ("zombie-detector", "leader-health", "autoscaler")
"""The services that open incidents and ask the remediator to act on them."""

NODE_INCIDENT_INPUTS: tuple[type[Event], ...] = (
    GpuXidReported, GpuLost, ProcessOomKilled, ContainerExited, NodeSshChecked, NodeRetired, ClusterChecked,
)
"""The events the node-incident detector reads besides samples and action results (the cluster
check: the leader's count of each node's jobs). With detector cells, the decider reads them all
still (a retirement closes what is open on the node) and its rules judge what compares nodes."""

CELL_EVENTS: tuple[type[Event], ...] = (GpuXidReported, GpuLost, ProcessOomKilled, ContainerExited, NodeSshChecked, NodeRetired)
"""The node events a detector cell reads with its nodes' samples: every node-incident input but the
cluster check (one message about many nodes: the decider reads it)."""


def cell_durables(partition: int) -> tuple[Durable, Durable]:
    """A detector cell's two consumers of one partition: its nodes' samples (paced, as the
    detector's own) and their node events (pull, one consumer for all of them, in order)."""
    return (
        Durable(f"zombie-detector-cell-samples-p{partition:02d}", "zombie-detector", NodeSampled, "paced", partition=partition),
        Durable(f"zombie-detector-cell-events-p{partition:02d}", "zombie-detector", CELL_EVENTS[0], more=CELL_EVENTS[1:],
                partition=partition),
    )


DURABLES: tuple[Durable, ...] = (
    Durable("zombie-detector-samples", "zombie-detector", NodeSampled, "paced"),
    *(item for partition in range(PARTITIONS) for item in cell_durables(partition)),
    Durable("zombie-detector-actions", "zombie-detector", ActionCompleted),
    Durable("zombie-detector-findings", "zombie-detector", NodeFindings),
    *(Durable(f"zombie-detector-{event.__name__}", "zombie-detector", event) for event in NODE_INCIDENT_INPUTS),
    Durable("leader-health-actions", "leader-health", ActionCompleted),
    # a peer daemon's accept queue as its own node sees it: a blocked event loop, and one whose
    # full queue makes its host look down
    Durable("leader-health-ListenBacklogReported", "leader-health", ListenBacklogReported),
    Durable("autoscaler-samples", "autoscaler", NodeSampled, "paced"),
    Durable("autoscaler-actions", "autoscaler", ActionCompleted),
    Durable("remediator-actions", "remediator", ActionRequested),
    *(
        Durable(f"report-builder-{event.__name__}", "report-builder", event)
        for event in (
            IncidentOpened,
            IncidentUpdated,
            IncidentResolved,
            IncidentEscalated,
            ActionRequested,
            ActionCompleted,
            SilenceAdded,
            SilenceRemoved,
            IncidentMarked,
        )
    ),
    Durable("report-builder-spans", "report-builder", SpansExported),
    Durable("report-builder-ClusterChecked", "report-builder", ClusterChecked),
    Durable("report-builder-CapacityEvaluated", "report-builder", CapacityEvaluated),
)

LIVE: Mapping[str, tuple[type[Event], ...]] = {
    # The console's fleet page: each node's latest sample, in memory; its banner: a service that
    # lost a consumer, from its heartbeat. Every report-builder instance serves a console, so each
    # reads every sample and heartbeat. The samples also become each node's history (one instance
    # writes it: ONE_INSTANCE_LOOPS).
    "report-builder": (NodeSampled, ServiceHeartbeat),
    # where an admin endpoint the policy calls on a cluster's leader goes: the leader leader-health
    # reports, never the one a request names
    "remediator": (ClusterChecked,),
    # how far behind each sample consumer is (their heartbeats): one incident when a service falls behind
    "zombie-detector": (ServiceHeartbeat,),
}
"""Events a service reads live, as plain NATS subscribers: every instance gets every message as it
is published, nothing is acknowledged or kept for it, and what does not validate is skipped (the
durable consumers of the same subject dead-letter it)."""

PACED_READS: Mapping[str, tuple[type[Event], ...]] = {
    # every console's samples, 2,000 a second at 10,000 nodes: delivered one by one, each woke the
    # process on its own (gpumedic_bus.follow.PacedReader)
    "report-builder": (NodeSampled,),
}
"""Of the events a service reads live, those it reads a batch at a time from their stream instead
(a batched direct get every fifth of a second, no consumer: every instance still reads every
message, from the newest stored when it starts), rather than subscribing to them."""

LOOKUPS: Mapping[str, tuple[type[Event], ...]] = {
    # the console's node page: the node's whole latest sample, read from the stream when the page is
    # asked for (the fleet page keeps only a few figures per node in memory)
    "report-builder": (NodeSampled,),
    # the newest cluster check at start (then LIVE), so that a leader is known at once
    "remediator": (ClusterChecked,),
}
"""Events a service reads one at a time from their stream, the latest for one key (a node)."""

REPLAYS: Mapping[str, tuple[type[Event], ...]] = {
    "zombie-detector": (SilenceAdded, SilenceRemoved),
    "leader-health": (SilenceAdded, SilenceRemoved),
    # every incident opened, counted against its host (repeat offenders) unless found while the
    # control plane was behind (its resolution ends that) or marked false by a person
    "autoscaler": (NodeDrained, NodeUndrained, SilenceAdded, SilenceRemoved, IncidentOpened, IncidentResolved, IncidentMarked),
}
"""Events a service reads from the start of their stream whenever it starts, then follows (the few
facts that make its state, such as the silences in force): read one stored message at a time
(`gpumedic_bus.follow`), so no service needs a right to create or delete consumers."""

CONSUMING_SERVICES: tuple[str, ...] = tuple(s for s in SERVICES if any(d.service == s for d in DURABLES))

PRODUCERS: Mapping[type[Event], tuple[str, ...]] = {
    NodeSampled: ("node-sampler",),
    GpuXidReported: ("node-sampler",),
    GpuLost: ("node-sampler",),
    ProcessOomKilled: ("node-sampler",),
    ContainerExited: ("node-sampler",),
    ListenBacklogReported: ("node-sampler",),
    NodeSshChecked: ("remediator",),
    NodeDrained: ("remediator",),
    NodeUndrained: ("remediator",),
    NodeRetired: ("remediator",),
    IncidentOpened: DETECTORS,
    IncidentUpdated: DETECTORS,
    IncidentResolved: DETECTORS,
    IncidentEscalated: DETECTORS,
    ActionRequested: DETECTORS,
    ActionCompleted: ("remediator",),
    # A node-sampler's liveness is its own node's samples (node_silent), on its own subject: a node's
    # login may not speak for the others on one shared heartbeat subject.
    ServiceHeartbeat: tuple(s for s in SERVICES if s != "node-sampler"),
    ClusterChecked: ("leader-health",),
    CapacityEvaluated: ("autoscaler",),
    MessageRejected: CONSUMING_SERVICES,
    SpansExported: SERVICES,
    # A person silences from the CLI (the operator's login) or the console (report-builder's).
    SilenceAdded: ("operator", "report-builder"),
    SilenceRemoved: ("operator", "report-builder"),
    # The console (report-builder) keeps its own verdicts; the CLI's come as events to their owner.
    IncidentMarked: ("operator",),
    # report-builder prices a closed incident: it holds the store and the inventory's prices.
    IncidentCosted: ("report-builder",),
    # A detector cell's findings, for the decider (both zombie-detector's own instances).
    NodeFindings: ("zombie-detector",),
}
"""Which services (or the operator's tools) publish each event. A new event must be added here,
or `proto` fails."""

_K = IncidentKind
OPENS: Mapping[str, tuple[IncidentKind, ...]] = {
    "zombie-detector": (
        _K.ZOMBIE_JOB, _K.ORPHAN_GPU_HOLDER, _K.GPU_XID, _K.GPU_LOST, _K.CONTAINER_DIED, _K.DISK_PRESSURE,
        _K.HOST_MEMORY_PRESSURE, _K.NODE_SILENT, _K.NVML_UNAVAILABLE, _K.SSH_UNREACHABLE, _K.PHANTOM_JOBS, _K.IDLE_JOBS,
        _K.STUCK_PROCESS, _K.GPU_THERMAL, _K.GPU_THROTTLED, _K.ECC_ERRORS, _K.ROW_REMAP, _K.PCIE_DEGRADED,
        _K.NVLINK_DEGRADED, _K.NIC_DEGRADED, _K.NIC_FLAPPING, _K.GPU_STRAGGLER, _K.JOB_HUNG, _K.CONTROL_PLANE_BEHIND,
        _K.SAMPLES_LOST, _K.FILE_MISSING, _K.CHECK_FAILED, _K.LOG_PATTERN,
    ),
    "leader-health": (
        _K.NO_LEADER, _K.QUORUM_LOST, _K.SPLIT_BRAIN, _K.LEADER_FLAPPING, _K.PEER_BLOCKED, _K.PEER_DOWN,
        _K.SLOW_PEER, _K.PEER_PARTITIONED, _K.PEERS_BELOW_TARGET, _K.UNKNOWN_PEER,
    ),
    "autoscaler": (
        _K.CAPACITY_SHORT, _K.CAPACITY_SURPLUS, _K.QUEUE_STALLED, _K.STUCK_SPAWNING, _K.STALE_HEARTBEAT,
        _K.ORPHANED_TASKS, _K.UNRECORDED_WORKER, _K.VANISHED_WORKER, _K.BURN_IN, _K.BURN_IN_FAILED, _K.REPEAT_OFFENDER,
        _K.BLACK_HOLE, _K.FAILURE_JUMP,
    ),
}
"""Which detector opens which incident kind: each kind has exactly one owner. A detector's NATS
user may write the incident state of its own kinds only, and the remediator's gate refuses an
action for an incident whose state names another detector than its kind's owner. A detector also
opens the fleet incident (`fleet_anomaly`) that groups one of its own kinds."""

FLEET_NODE = "fleet"
"""The node id of fleet incidents (`fleet/fleet_anomaly/node/<kind>`): they are on no one node."""
CONTROL_PLANE_NODE = "control-plane"
"""The node id of incidents about gpumedic's own services (`control-plane/control_plane_behind/node/<service>`)."""


def owner_of(kind: IncidentKind | str, key: str | None = None) -> str | None:
    """The detector that may open incidents of `kind` (for a fleet incident: the owner of the kind it
    groups, its `key`); None for a kind no detector owns."""
    kind = IncidentKind(kind)
    if kind is IncidentKind.FLEET_ANOMALY:
        return owner_of(key) if key in {k.value for k in IncidentKind if k is not kind} else None
    return next((detector for detector, kinds in OPENS.items() if kind in kinds), None)


KV_ACCESS: Mapping[str, Mapping[str, Literal["read", "write"]]] = {
    "zombie-detector": {INCIDENT_STATE.bucket: "write", RULE_MEMORY.bucket: "write"},
    "leader-health": {INCIDENT_STATE.bucket: "write"},
    "autoscaler": {INCIDENT_STATE.bucket: "write"},
    "remediator": {INCIDENT_STATE.bucket: "read"},
}
"""Which service may read or write which key-value bucket. Detectors own the incident state;
the remediator's gate reads it and can change nothing in it. zombie-detector alone keeps its
rules' memory."""

ONE_ACTIVE = frozenset({"zombie-detector", "leader-health", "autoscaler"})
"""Services of which one instance acts at a time, the others standing by (gpumedic_bus.lease):
they decide from what they hold in memory. The remediator and report-builder share the work of
all their instances instead (shared durable consumers, the gate's lock, rows keyed by event)."""

ONE_INSTANCE_LOOPS: Mapping[str, tuple[str, ...]] = {
    # every node's minute of history written once, and incidents posted to Alertmanager once a round
    "report-builder": ("history", "alertmanager"),
}
"""Background loops of a shared service that run in one of its instances at a time, each on a
lease of its own (key `<service>.<loop>`)."""

SHARED_LOOPS: Mapping[str, tuple[str, ...]] = {
    # every node's SSH login checked once a round, each instance checking the nodes of its partitions
    "remediator": ("ssh-health",),
    # the node rules over the partitions' samples and node events, each cell on its own (`zombie_detector.cell`)
    "zombie-detector": ("cells",),
}
"""Per-node work of a shared service that its live instances split by the nodes' partitions
(`gpumedic_bus.shares`: keys `<service>.<work>.p<k>` and `<service>.<work>.member.<instance>`)."""


@dataclass(frozen=True)
class Request:
    """A core-NATS request-reply subject: one service answers (its instances in a queue group), and
    only the users named may ask. Nothing is stored: the asker waits for the answer."""

    subject: str
    service: str
    askers: tuple[str, ...]


def durable(name: str) -> Durable:
    for item in DURABLES:
        if item.name == name:
            return item
    raise LookupError(f"no durable consumer {name!r} is declared in gpumedic_bus.topology.DURABLES")


def subject_matches(pattern: str, subject: str) -> bool:
    """Whether NATS delivers `subject` to a subscription on `pattern` (`*` one token, `>` the rest)."""
    want, have = pattern.split("."), subject.split(".")
    for i, token in enumerate(want):
        if token == ">":
            return len(have) > i
        if i >= len(have) or (token != "*" and token != have[i]):
            return False
    return len(have) == len(want)


def durable_reading(service: str, subject: str) -> Durable | None:
    """The durable consumer of `service` that reads `subject`, if it has one."""
    return next((d for d in DURABLES if d.service == service and any(subject_matches(f, subject) for f in d.filter_subjects)), None)


def consumers() -> dict[str, tuple[type[Event], ...]]:
    """Which service consumes which events (over durable consumers, or live)."""
    result: dict[str, tuple[type[Event], ...]] = {}
    pairs = [(item.service, event) for item in DURABLES for event in item.events] + [(s, e) for s, events in LIVE.items() for e in events]
    for service, event in pairs:
        if event not in result.get(service, ()):
            result[service] = (*result.get(service, ()), event)
    return result


# --- users and their permissions -----------------------------------------------------------

ADMIN = "admin"
"""Provisions streams, buckets and consumers (`gpumedic provision`); no service runs as admin."""
CONTROL_ACCOUNT = "GPUMEDIC"
"""The NATS account of the control plane: the services, the nodes, the operator's tools."""
OBSERVERS_ACCOUNT = "OBSERVERS"
"""The observer's own account: every event flows into it (it imports the control plane's
`gpumedic.v1.>`) and it has a JetStream of its own, so an outside consumer can keep its own stream
and durable consumers, while nothing it publishes or creates reaches the control plane."""
OBSERVER = "observer"
"""Reads every event and nothing else, from its own account: your own consumers (examples/), and
the operator's tools (`gpumedic up` waiting for heartbeats, the demo's story, `gpumedic sim`'s score)."""
OBSERVER_STREAMS: tuple[str, ...] = (INCIDENTS.name,)
"""The streams an outside consumer may keep in the observers' JetStream, by name (the account's
limits allow no more streams than these). Each is named as gpumedic's own: gpumedic publishes with
Nats-Expected-Stream, so a stream of that name stores only its events, whatever subjects it lists.
So your pager can keep the incidents for a restart, and no observer can keep a lasting copy of
everything else (the samples, the action requests)."""
OPERATOR = "operator"
"""A person's tools that tell the system something (`gpumedic silence`): publishes what
`PRODUCERS` names it for, and reads every event."""
SIM_FLEET = "sim-fleet"
"""The simulated fleet's many samplers over one connection: node facts for any node. Only the
embedded stack creates this user, and only when it runs a simulated fleet."""
LAUNCHER = "launcher"
"""Job launchers: may ask for a pre-flight check of a node's GPUs and read the answer, nothing else."""
NODE_USER_PREFIX = "node-"

REQUESTS: tuple[Request, ...] = (
    Request(PREFLIGHT_SUBJECT, "remediator", (LAUNCHER, OPERATOR)),
    # acting on many nodes is a person's: the operator's tools, and the console behind its token
    Request(ROLLOUT_SUBJECT, "remediator", (OPERATOR, "report-builder")),
    Request(LOGS_SUBJECT, "remediator", (OPERATOR,)),  # a node's log, for a person: runbook 001's fetch_worker_logs
)
"""Request-reply subjects. The answering service subscribes; NATS lets it reply to the asker's
inbox (`allow_responses`) without any other publish right."""

CONTROL_USERS: tuple[str, ...] = (ADMIN, OBSERVER, OPERATOR, LAUNCHER, *(s for s in SERVICES if s != "node-sampler"))
"""Every NATS user of the control plane (GPU nodes add one user each)."""


def account_of(user: str) -> str:
    return OBSERVERS_ACCOUNT if user == OBSERVER else CONTROL_ACCOUNT


def node_user(node_id: str) -> str:
    """The NATS user of one GPU node's sampler: it may publish that node's facts only."""
    return f"{NODE_USER_PREFIX}{node_id}"


def inbox_prefix(user: str) -> str:
    """Each user gets replies on its own inbox subtree, which no other user may read."""
    return f"_INBOX.{user}"


@dataclass(frozen=True)
class Permissions:
    publish: tuple[str, ...]
    subscribe: tuple[str, ...]
    responds: bool = False
    """May reply to the requests it receives (NATS `allow_responses`), and to nothing else."""


def _asks(user: str) -> tuple[str, ...]:
    return tuple(r.subject for r in REQUESTS if user in r.askers)


def permissions_for(user: str) -> Permissions | None:
    """The allow-lists of one user; None means unrestricted (the admin)."""
    if user == ADMIN:
        return None
    if user == OBSERVER:
        # JetStream's API, acks and flow control reach the observers' own JetStream only, and there
        # only the streams it may keep and their consumers.
        jetstream = ["$JS.API.INFO", "$JS.API.STREAM.NAMES", "$JS.API.STREAM.LIST"]
        for stream in OBSERVER_STREAMS:
            jetstream += [
                *(f"$JS.API.STREAM.{verb}.{stream}" for verb in ("CREATE", "INFO", "DELETE")),
                f"$JS.API.CONSUMER.*.{stream}",  # listing, and an unnamed consumer
                f"$JS.API.CONSUMER.*.{stream}.>",  # a named consumer's create, info, delete
                f"$JS.API.CONSUMER.DURABLE.CREATE.{stream}.>",
                f"$JS.API.CONSUMER.MSG.NEXT.{stream}.>",
                f"$JS.ACK.{stream}.>",
                f"$JS.FC.{stream}.>",
            ]
        return Permissions(publish=tuple(jetstream), subscribe=("gpumedic.v1.>", f"{inbox_prefix(user)}.>"))
    if user == OPERATOR:
        published = tuple(e.subject_filter() for e, producers in PRODUCERS.items() if OPERATOR in producers)
        return Permissions(publish=(*published, *_asks(user)), subscribe=("gpumedic.v1.>", f"{inbox_prefix(user)}.>"))
    if user == LAUNCHER:
        return Permissions(publish=_asks(user), subscribe=(f"{inbox_prefix(user)}.>",))
    if user == SIM_FLEET:
        return _node_sampler(user, "*")
    if user.startswith(NODE_USER_PREFIX):
        return _node_sampler(user, user.removeprefix(NODE_USER_PREFIX))
    if user in SERVICES and user != "node-sampler":
        return _service(user)
    raise LookupError(
        f"no NATS user {user!r}: services are {', '.join(SERVICES[1:])}; tools are {OBSERVER}, {OPERATOR}, {LAUNCHER}; "
        f"nodes are {NODE_USER_PREFIX}<node-id>"
    )


def _node_sampler(user: str, node: str) -> Permissions:
    publish = [f"{event.subject_prefix}.{node}" for event in NODE_FACTS]
    if node != "*":  # its spans on its own subject, so no node adds spans in another's name (the sim's fleet sends none)
        publish.append(SpansExported.subject_for(node_user(node)))
    return Permissions(publish=tuple(publish), subscribe=(f"{inbox_prefix(user)}.>",))


def _service(service: str) -> Permissions:
    publish: list[str] = []
    subscribe: list[str] = [f"{inbox_prefix(service)}.>"]
    for event, producers in PRODUCERS.items():
        if service not in producers:
            continue
        if event.subject_key == "service":
            publish.append(event.subject_for(service))
        else:
            publish.append(event.subject_filter())
    for item in DURABLES:
        if item.service != service:
            continue
        api = f"$JS.API.CONSUMER.%s.{item.stream}.{item.name}"
        publish.append(api % "INFO")
        publish.append(f"$JS.ACK.{item.stream}.{item.name}.>")
        publish.append(api % "MSG.NEXT")  # its messages come to its own inbox
        # whether a dead letter's replay for another consumer repeats a stored message (consume.REPLAY_FOR)
        publish.append(f"$JS.API.STREAM.MSG.GET.{item.stream}")
    paced = PACED_READS.get(service, ())
    subscribe += [event.subject_filter() for event in LIVE.get(service, ()) if event not in paced]
    publish += sorted({f"$JS.API.DIRECT.GET.{stream_of(event).name}" for event in paced})  # a batch of stored messages at a time
    # read one stored message at a time (gpumedic_bus.follow, .latest; where a paced read starts)
    for stream in sorted({stream_of(event).name for event in (*REPLAYS.get(service, ()), *LOOKUPS.get(service, ()), *paced)}):
        publish.append(f"$JS.API.STREAM.MSG.GET.{stream}")
    subscribe += [event.subject_filter() for event in REPLAYS.get(service, ())]  # woken up by new ones
    answers = [r.subject for r in REQUESTS if r.service == service]
    subscribe += answers
    publish += _asks(service)  # its replies come to its own inbox
    leases = [service] if service in ONE_ACTIVE else [f"{service}.{loop}" for loop in ONE_INSTANCE_LOOPS.get(service, ())]
    leases += [f"{service}.{work}.>" for work in SHARED_LOOPS.get(service, ())]  # its partitions' keys and its instances'
    if leases:  # its own lease keys, and reading who holds them
        stream = f"KV_{LEASES.bucket}"
        publish += [
            *(f"$KV.{LEASES.bucket}.{key}" for key in leases),
            f"$JS.API.STREAM.INFO.{stream}",
            f"$JS.API.STREAM.MSG.GET.{stream}",  # reads go to the leader (streams.LEASES: direct=False)
        ]
    for bucket, access in KV_ACCESS.get(service, {}).items():
        stream = f"KV_{bucket}"
        publish += [
            f"$JS.API.STREAM.INFO.{stream}",  # also how a detector lists the keys (the stream's subjects)
            f"$JS.API.STREAM.MSG.GET.{stream}",  # reads go to the leader (direct=False)
        ]
        if access == "write" and bucket == INCIDENT_STATE.bucket:
            publish += _incident_state_keys(service)
            if service == "zombie-detector":  # its cells follow every write (`zombie_detector.cell.OpenIncidents`)
                subscribe.append(f"$KV.{bucket}.>")
        elif access == "write":
            publish.append(f"$KV.{bucket}.>")
    return Permissions(publish=tuple(publish), subscribe=tuple(subscribe), responds=bool(answers))


def _incident_state_keys(detector: str) -> list[str]:
    """The incident-state keys a detector may write (`<node>.<kind>.<gpu>[.<key>]`, see
    gpumedic_incidents.store): those of its own kinds, and the fleet incidents that group them."""
    prefix = f"$KV.{INCIDENT_STATE.bucket}"
    kinds = [kind.value for kind in OPENS.get(detector, ())]
    return [
        *(f"{prefix}.*.{kind}.>" for kind in kinds),
        *(f"{prefix}.{FLEET_NODE}.{IncidentKind.FLEET_ANOMALY.value}.node.{kind}" for kind in kinds),
    ]
