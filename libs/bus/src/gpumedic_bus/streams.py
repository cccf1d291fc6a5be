"""Every JetStream stream and key-value bucket gpumedic uses, declared in one place.

Samples are many and replaced every interval: they are kept in memory for `SAMPLES_MAX_AGE_S`,
never fsynced, since losing the last few on a server crash costs nothing (the next interval
brings new ones) while an fsync per 6 KB sample capped the whole fleet at what one disk takes
(about 2,500 samples a second here, and past that the server dropped them at ingest).
Incidents, actions, state, control and dead letters must not be lost: file storage, long
retention, de-duplication by Nats-Msg-Id, and the embedded server's `sync_interval: always`.
A memory stream vanishes with a single server that restarts (a cluster's replicas keep it), and
no service may re-create it: whoever provisions keeps it there (`gpumedic_bus.provision.keep`:
the embedded stack after restarting its server, compose's `bus-keeper`).
`gpumedic_bus.provision` creates all of this with an admin identity.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig, SubjectTransform

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
    IncidentMarked,
    SilenceAdded,
    SilenceRemoved,
    SpansExported,
)

_MINUTE = 60.0
_ROOT = "gpumedic.v1"
"""What every subject of the contract starts with."""
_DAY = 86_400.0

PARTITIONS = 16
"""How many partitions a partitioned stream spreads its nodes over: each stored subject gains a
last token, the node's partition (`partition_of`), so a consumer can read one share of the fleet
(`gpumedic.v1.node.sampled.*.3`) with every node's messages in one partition, in order. Fixed:
another count moves every node to another partition."""


@functools.lru_cache(maxsize=1 << 16)
def partition_of(node_id: str, partitions: int = PARTITIONS) -> int:
    """The partition NATS stores a node's messages under: what the stream's `{{partition(n,1)}}`
    transform computes, FNV-1a (32 bit) of the node id modulo n (nats-server's subject_transform.go),
    so any process can tell which partition a node is in (kept for a fleet's node ids: the rules'
    memory asks for each node's every 5 s)."""
    digest = 0x811C9DC5
    for byte in node_id.encode():
        digest = ((digest ^ byte) * 0x01000193) & 0xFFFFFFFF
    return digest % partitions


@dataclass(frozen=True)
class Stream:
    name: str
    events: tuple[type[Event], ...]
    storage: StorageType
    max_age_s: float
    max_bytes: int
    duplicate_window_s: float
    description: str
    replaceable: bool = False
    """What it holds is replaced within an interval (samples): provisioning may drop and make it again."""
    partitioned: bool = False
    """Each message is stored under its subject and its node's partition (`PARTITIONS`): the stream's
    events are keyed by node, their subjects of one shape. Publishers and live subscribers see the
    subject as published."""
    direct: bool = False
    """Any of its servers answers reads of stored messages (`allow_direct`): read a batch at a time
    by every instance of a service (`topology.PACED_READS`)."""

    def __post_init__(self) -> None:
        shapes = {e.subject_filter().count(".") for e in self.events}
        if self.partitioned and (any(e.subject_key is None for e in self.events) or len(shapes) != 1):
            raise ValueError(f"{self.name}: only a stream of events keyed by node, on subjects of one shape, can be partitioned")

    @property
    def subjects(self) -> list[str]:
        return [e.subject_filter() for e in self.events]

    def stored_filter(self, event: type[Event]) -> str:
        """What matches every stored message of `event` (a consumer's filter). In a partitioned
        stream: with its partition token, or without one (stored before the stream had partitions:
        a durable stream keeps them)."""
        return f"{event.subject_prefix}.>" if self.partitioned else event.subject_filter()

    def stored_subject(self, event: type[Event], key: str) -> str:
        """What matches the stored messages of one key (a node), for a last-message lookup."""
        return f"{event.subject_for(key)}.*" if self.partitioned else event.subject_for(key)

    def partition_filter(self, event: type[Event], partition: int) -> str:
        """What matches the stored messages of one partition's nodes."""
        if not self.partitioned or not 0 <= partition < PARTITIONS:
            raise ValueError(f"{self.name} has no partition {partition!r}")
        return f"{event.subject_filter()}.{partition}"

    def as_published(self, stored: str) -> str:
        """The subject a stored message was published on (its partition token taken off). Called
        for every sample a consumer reads: the published subject's dots are counted once."""
        return stored.rsplit(".", 1)[0] if self.partitioned and stored.count(".") > self._published_dots else stored

    @functools.cached_property
    def _published_dots(self) -> int:
        return self.events[0].subject_filter().count(".")

    def config(self, replicas: int = 1) -> StreamConfig:
        transform = None
        if self.partitioned:
            # One transform for all the stream's subjects (gpumedic.v1.<noun>.<verb>.<node>): each
            # token kept, the partition of the last (the node) appended.
            tokens = self.events[0].subject_filter().removeprefix(f"{_ROOT}.").count(".") + 1
            kept = ".".join(f"{{{{wildcard({i})}}}}" for i in range(1, tokens + 1))
            transform = SubjectTransform(src=_ROOT + ".*" * tokens, dest=f"{_ROOT}.{kept}.{{{{partition({PARTITIONS},{tokens})}}}}")
        return StreamConfig(
            name=self.name,
            description=self.description,
            subjects=self.subjects,
            retention=RetentionPolicy.LIMITS,
            storage=self.storage,
            discard=DiscardPolicy.OLD,
            max_age=self.max_age_s,
            max_bytes=self.max_bytes,
            duplicate_window=self.duplicate_window_s,
            num_replicas=replicas,
            subject_transform=transform,
            allow_direct=self.direct,
        )


SAMPLES_MAX_AGE_S = _MINUTE
"""How long the samples stream keeps a sample, its only bound: what it holds grows with the fleet
(10,000 nodes' 6 KB samples every 5 s: about 720 MB of the server's memory; 50,000: 3.6 GB), and
it is the sample path's loss window. A consumer that falls further behind loses samples to it,
and says so long before (its lag is a fact, see gpumedic_bus.consume)."""
SAMPLES = Stream(
    name="GPUMEDIC_SAMPLES",
    events=(NodeSampled,),
    storage=StorageType.MEMORY,
    max_age_s=SAMPLES_MAX_AGE_S,
    max_bytes=-1,  # bounded by age: a byte cap would be a time bound that shrinks as the fleet grows
    duplicate_window_s=5,  # samples need no de-duplication; 0 would mean the server's 2 minutes
    description="Node samples: many, replaced every interval; a minute in memory, never fsynced; stored by partition.",
    replaceable=True,
    partitioned=True,
    direct=True,
)
NODE_EVENTS = Stream(
    name="GPUMEDIC_NODE_EVENTS",
    events=(
        GpuXidReported, GpuLost, ProcessOomKilled, ContainerExited, ListenBacklogReported, NodeSshChecked, NodeDrained, NodeUndrained,
        NodeRetired,
    ),
    storage=StorageType.FILE,
    max_age_s=30 * _DAY,
    max_bytes=512 * 1024 * 1024,
    duplicate_window_s=10 * _MINUTE,
    description="What nodes report the moment it happens (XID, GPU lost, OOM kill, container exit, a daemon's accept "
    "queue backing up), and the "
    "remediator's SSH checks of them, the drains it made and the workers it ended; durable; stored by partition.",
    partitioned=True,
)
INCIDENTS = Stream(
    name="GPUMEDIC_INCIDENTS",
    events=(IncidentOpened, IncidentUpdated, IncidentResolved, IncidentEscalated, IncidentCosted),
    storage=StorageType.FILE,
    max_age_s=90 * _DAY,
    max_bytes=1024 * 1024 * 1024,
    duplicate_window_s=10 * _MINUTE,
    description="The incident lifecycle; durable.",
)
ACTIONS = Stream(
    name="GPUMEDIC_ACTIONS",
    events=(ActionRequested, ActionCompleted),
    storage=StorageType.FILE,
    max_age_s=90 * _DAY,
    max_bytes=1024 * 1024 * 1024,
    duplicate_window_s=10 * _MINUTE,
    description="Action requests and results; durable, de-duplicated by action id.",
)
STATUS = Stream(
    name="GPUMEDIC_STATUS",
    events=(ServiceHeartbeat, ClusterChecked, CapacityEvaluated),
    storage=StorageType.FILE,
    max_age_s=7 * _DAY,
    max_bytes=256 * 1024 * 1024,
    duplicate_window_s=_MINUTE,
    description="Service heartbeats, cluster checks and capacity evaluations.",
)
DEAD_LETTERS = Stream(
    name="GPUMEDIC_DEAD_LETTERS",
    events=(MessageRejected,),
    storage=StorageType.FILE,
    max_age_s=30 * _DAY,
    max_bytes=256 * 1024 * 1024,
    duplicate_window_s=_MINUTE,
    description="Messages a service could not process, with the reason.",
)
TELEMETRY = Stream(
    name="GPUMEDIC_TELEMETRY",
    events=(SpansExported,),
    storage=StorageType.FILE,
    max_age_s=_DAY,
    max_bytes=256 * 1024 * 1024,
    duplicate_window_s=_MINUTE,
    description="Finished spans for the embedded trace store.",
)

CONTROL = Stream(
    name="GPUMEDIC_CONTROL",
    events=(SilenceAdded, SilenceRemoved, IncidentMarked),
    storage=StorageType.FILE,
    max_age_s=365 * _DAY,
    max_bytes=64 * 1024 * 1024,
    duplicate_window_s=10 * _MINUTE,
    description="What operators tell the system (silences, verdicts); detectors replay the silences from the start when they start.",
)

FINDINGS = Stream(
    name="GPUMEDIC_FINDINGS",
    events=(NodeFindings,),
    storage=StorageType.FILE,
    max_age_s=_DAY,
    max_bytes=256 * 1024 * 1024,
    duplicate_window_s=_MINUTE,
    description="What the detector cells found over their partitions' nodes, for the decider's incident book; durable.",
)

STREAMS: tuple[Stream, ...] = (SAMPLES, NODE_EVENTS, INCIDENTS, ACTIONS, STATUS, DEAD_LETTERS, TELEMETRY, CONTROL, FINDINGS)

INCIDENT_STATE = KeyValueConfig(
    bucket="GPUMEDIC_INCIDENT_STATE",
    description="Open incidents by fingerprint, written by the detector that owns each; the remediator's gate reads them.",
    history=1,
    storage=StorageType.FILE,
    # Read from the stream's leader, not any replica ("direct get"): a replica still catching up
    # after a restart could answer with an older state, and the gate and a resuming detector
    # must see the latest.
    direct=False,
)
LEASE_TTL_S = 10.0
"""How long a one-active service's lease outlives its holder's last renewal (gpumedic_bus.lease):
about how long a standby waits to take over from an instance that died. The holder stops acting
after `lease.LOST_AFTER` of it without a renewal, so it also bounds the bus outage (a stream
leader election on a loaded cluster takes a few seconds) that a holder rides out."""
LEASES = KeyValueConfig(
    bucket="GPUMEDIC_LEASES",
    description="Which instance of each one-active service acts: one key per service, renewed by its holder, forgotten a TTL after.",
    history=1,
    ttl=LEASE_TTL_S,
    storage=StorageType.FILE,
    direct=False,  # as INCIDENT_STATE: a holder is read from the leader
)
RULE_MEMORY = KeyValueConfig(
    bucket="GPUMEDIC_RULE_MEMORY",
    description="What a detector's rules remember of each node (idle streaks, when each node last sampled), one key per "
    "detector and partition, so the instance that takes over goes on from it.",
    history=1,
    storage=StorageType.FILE,
    direct=False,  # as INCIDENT_STATE: the instance that takes over reads the latest, from the leader
)
KV_BUCKETS: tuple[KeyValueConfig, ...] = (INCIDENT_STATE, LEASES, RULE_MEMORY)


def stream_of(event_type: type[Event]) -> Stream:
    for stream in STREAMS:
        if event_type in stream.events:
            return stream
    raise LookupError(f"no stream carries {event_type.__name__}")
