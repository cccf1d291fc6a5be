"""The incident store: SQLAlchemy 2 async models, engines and Alembic migrations.

SQLite by default (the embedded mode), PostgreSQL by URL; the schema and its migrations are
the same on both. Services own their repository functions; this package owns the tables.
"""

from gpumedic_store.engine import StoreUnavailable, create_engine, ping, session_factory
from gpumedic_store.migrate import check, downgrade, upgrade
from gpumedic_store.models import (
    ACTION_STATUSES,
    INCIDENT_STATUSES,
    NOTIFICATION_STATUSES,
    OPERATORS_HOLD,
    ActionRecord,
    Base,
    BreakerTrip,
    CapacityCheck,
    ClusterCheck,
    DeadLetterReplay,
    GateLock,
    NodeDay,
    NodeDrain,
    NodeHour,
    NodeMinute,
    Incident,
    IncidentMark,
    Notification,
    Silence,
    SpanRow,
    TimelineEntry,
    UTCDateTime,
)
from gpumedic_store.settings import StoreSettings, mask_url
from gpumedic_store.userdb import TaskDatabase, TaskDatabaseError

__all__ = [
    "ACTION_STATUSES",
    "INCIDENT_STATUSES",
    "NOTIFICATION_STATUSES",
    "OPERATORS_HOLD",
    "ActionRecord",
    "Base",
    "BreakerTrip",
    "CapacityCheck",
    "ClusterCheck",
    "DeadLetterReplay",
    "GateLock",
    "NodeDay",
    "NodeDrain",
    "NodeHour",
    "NodeMinute",
    "Incident",
    "IncidentMark",
    "Notification",
    "Silence",
    "SpanRow",
    "StoreSettings",
    "StoreUnavailable",
    "TaskDatabase",
    "TaskDatabaseError",
    "TimelineEntry",
    "UTCDateTime",
    "check",
    "create_engine",
    "downgrade",
    "mask_url",
    "ping",
    "session_factory",
    "upgrade",
]
