"""The base every gpumedic event shares, and the rules for the subjects events own.

Events are frozen, past-tense facts. Each concrete class owns its subject: a fixed prefix
(`gpumedic.v1.<entity>.<fact>`) and, where the class names a routing field, that field's value as
the last token, so consumers can filter by node with a NATS wildcard.
"""

from __future__ import annotations

import re
import socket
import uuid
from datetime import UTC, datetime
from typing import Annotated, Any, ClassVar, Literal, Self, TypeVar

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, ValidationError, field_validator

SUBJECT_ROOT = "gpumedic.v1"
SCHEMA_VERSION = 1
MAX_EVENT_BYTES = 256 * 1024
"""Largest payload any consumer accepts; bigger messages are rejected, not parsed."""

_TOKEN_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$"
_TOKEN = re.compile(_TOKEN_PATTERN)


def is_subject_token(value: object) -> bool:
    """Whether `value` may be a node id, a cluster's name or any other SubjectToken."""
    return isinstance(value, str) and _TOKEN.fullmatch(value) is not None

SubjectToken = Annotated[
    str,
    Field(
        pattern=_TOKEN_PATTERN,
        description="An identifier safe as one NATS subject token and as a shell word: "
        "letters, digits, '-' and '_', at most 63 characters, starting with a letter or digit.",
        examples=["gpu-node-07"],
    ),
]
NodeId = Annotated[SubjectToken, Field(description="The node's identifier in the fleet inventory.")]


def default_node_id(hostname: str | None = None) -> str:
    """A node's id when none is given: the hostname made into a valid subject token: lowercase, other characters -> '-'."""
    name = (hostname if hostname is not None else socket.gethostname()).lower()
    token = re.sub(r"[^a-z0-9_-]", "-", name).lstrip("-_")[:63]
    return token or "node"


class EventDecodeError(ValueError):
    """A message could not become a valid event; `reason` says what was wrong and where."""

    def __init__(self, subject: str, reason: str) -> None:
        super().__init__(f"{subject}: {reason}")
        self.subject = subject
        self.reason = reason


M = TypeVar("M")


class Event(BaseModel):
    """Fields every event carries."""

    model_config = ConfigDict(frozen=True, extra="ignore", use_enum_values=False)

    subject_prefix: ClassVar[str]
    subject_key: ClassVar[str | None] = None
    """Name of the field whose value is the subject's last token, or None for a fixed subject."""

    event_id: uuid.UUID = Field(
        default_factory=uuid.uuid4,
        description="Unique id of this event; also the de-duplication id where none is given.",
    )
    schema_version: Literal[1] = Field(
        default=SCHEMA_VERSION, description="Version of this event's schema; v1 subjects carry 1."
    )
    occurred_at: AwareDatetime = Field(
        default_factory=lambda: datetime.now(UTC),
        description="When the fact happened, with a UTC offset (ISO 8601).",
    )
    source: SubjectToken = Field(description="The service (or tool) that published the event.")

    @field_validator("occurred_at")
    @classmethod
    def _to_utc(cls, value: datetime) -> datetime:
        return value.astimezone(UTC)

    @property
    def subject(self) -> str:
        """The concrete subject this event is published on."""
        return self._subject_of(self)

    @classmethod
    def _subject_of(cls, item: object) -> str:
        """The subject of this event's fields in `item` (the event, or a view of it)."""
        return cls.subject_prefix if cls.subject_key is None else f"{cls.subject_prefix}.{getattr(item, cls.subject_key)}"

    @classmethod
    def subject_for(cls, key: str) -> str:
        """The subject for one routing key (a node id, a service name)."""
        if cls.subject_key is None:
            raise TypeError(f"{cls.__name__} has a fixed subject")
        if not _TOKEN.fullmatch(key):
            raise ValueError(f"{key!r} is not a valid subject token for {cls.__name__}")
        return f"{cls.subject_prefix}.{key}"

    @classmethod
    def subject_filter(cls) -> str:
        """The subject a consumer subscribes to for every event of this class."""
        return cls.subject_prefix if cls.subject_key is None else f"{cls.subject_prefix}.*"

    def to_json(self) -> bytes:
        return self.model_dump_json().encode()

    @classmethod
    def from_json(cls, data: bytes | str, *, subject: str = "") -> Self:
        """Parse and validate one message body; raise EventDecodeError saying what was wrong."""
        return cls.decode_as(cls, data, subject=subject)

    @classmethod
    def decode_as(cls, model: type[M], data: bytes | str, *, subject: str = "") -> M:
        """One message body of this event read as `model` (the event itself, or a view of it:
        `gpumedic_events.views`); EventDecodeError says what was wrong: its size, a field, or a
        payload that belongs on another subject."""
        where = subject or cls.subject_filter()
        if len(data) > MAX_EVENT_BYTES:
            raise EventDecodeError(where, f"payload of {len(data)} bytes exceeds {MAX_EVENT_BYTES}")
        decode_body = getattr(model, "decode_body", None)  # a view's own decoder (gpumedic_events.views)
        try:
            item = decode_body(data) if decode_body is not None else model.model_validate_json(data)
        except ValidationError as exc:
            raise EventDecodeError(where, describe(exc)) from None
        except ValueError as exc:  # the view's decoder said what was wrong and where, in one line
            raise EventDecodeError(where, str(exc)) from None
        belongs = cls._subject_of(item)
        if subject and subject != belongs:
            raise EventDecodeError(where, f"payload belongs on {belongs}, not {subject}")
        return item


def describe(exc: ValidationError) -> str:
    """One line per problem, naming the field path, without echoing large input values."""
    parts = []
    for err in exc.errors(include_url=False, include_input=False)[:5]:
        loc = ".".join(str(p) for p in err["loc"]) or "<body>"
        parts.append(f"{loc}: {err['msg']}")
    more = exc.error_count() - len(parts)
    if more > 0:
        parts.append(f"and {more} more")
    return "; ".join(parts)


def json_examples(model: type[BaseModel]) -> list[dict[str, Any]]:
    """The examples a model declares in its config (used for golden files and docs)."""
    extra = model.model_config.get("json_schema_extra") or {}
    return list(extra.get("examples", [])) if isinstance(extra, dict) else []
