"""Every JetStream stream gpumedic uses, declared in one place with explicit settings.

Samples are many and disposable: memory storage, minutes of retention. Incidents, actions and
dead letters must not be lost: file storage, long retention, de-duplication by Nats-Msg-Id.
(Durability of acknowledged writes also depends on the server's `sync_interval`; the embedded
server sets it to `always`.)
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from nats.js import JetStreamContext
from nats.js.api import DiscardPolicy, KeyValueConfig, RetentionPolicy, StorageType, StreamConfig
from nats.js.errors import BucketNotFoundError, NotFoundError

from gpumedic_events import (
    ActionCompleted,
    ActionRequested,
    CapacityEvaluated,
    ClusterChecked,
    ContainerExited,
    Event,
    GpuLost,
    GpuXidReported,
    IncidentEscalated,
    IncidentOpened,
    IncidentResolved,
    MessageRejected,
    NodeSampled,
    ProcessOomKilled,
    ServiceHeartbeat,
    SpansExported,
)

log = logging.getLogger(__name__)

_MINUTE = 60.0
_DAY = 86_400.0


@dataclass(frozen=True)
class Stream:
    name: str
    events: tuple[type[Event], ...]
    storage: StorageType
    max_age_s: float
    max_bytes: int
    duplicate_window_s: float
    description: str

    @property
    def subjects(self) -> list[str]:
        return [e.subject_filter() for e in self.events]

    def config(self, replicas: int = 1) -> StreamConfig:
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
        )


SAMPLES = Stream(
    name="GPUMEDIC_SAMPLES",
    events=(NodeSampled,),
    storage=StorageType.MEMORY,
    max_age_s=10 * _MINUTE,
    max_bytes=512 * 1024 * 1024,
    duplicate_window_s=5,  # samples need no de-duplication; 0 would mean the server's 2 minutes
    description="Node samples: many, disposable, minutes of retention.",
)
NODE_EVENTS = Stream(
    name="GPUMEDIC_NODE_EVENTS",
    events=(GpuXidReported, GpuLost, ProcessOomKilled, ContainerExited),
    storage=StorageType.FILE,
    max_age_s=30 * _DAY,
    max_bytes=512 * 1024 * 1024,
    duplicate_window_s=10 * _MINUTE,
    description="What nodes report the moment it happens (XID, GPU lost, OOM kill, container exit); durable.",
)
INCIDENTS = Stream(
    name="GPUMEDIC_INCIDENTS",
    events=(IncidentOpened, IncidentResolved, IncidentEscalated),
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

STREAMS: tuple[Stream, ...] = (SAMPLES, NODE_EVENTS, INCIDENTS, ACTIONS, STATUS, DEAD_LETTERS, TELEMETRY)

DETECTOR_STATE = KeyValueConfig(
    bucket="GPUMEDIC_DETECTOR_STATE",
    description="zombie-detector's open incidents by fingerprint, so a restart neither loses nor repeats them.",
    history=1,
    storage=StorageType.FILE,
)
KV_BUCKETS: tuple[KeyValueConfig, ...] = (DETECTOR_STATE,)


def stream_of(event_type: type[Event]) -> Stream:
    for stream in STREAMS:
        if event_type in stream.events:
            return stream
    raise LookupError(f"no stream carries {event_type.__name__}")


async def ensure_streams(js: JetStreamContext, replicas: int = 1) -> None:
    """Create each stream and bucket, or update a stream to the declared settings. Idempotent."""
    for stream in STREAMS:
        config = stream.config(replicas)
        try:
            await js.stream_info(stream.name)
        except NotFoundError:
            await js.add_stream(config)
            log.info("created stream %s for %s", stream.name, ", ".join(stream.subjects))
        else:
            await js.update_stream(config)
    for bucket in KV_BUCKETS:
        try:
            await js.key_value(bucket.bucket)
        except BucketNotFoundError:
            await js.create_key_value(bucket)
            log.info("created key-value bucket %s", bucket.bucket)
