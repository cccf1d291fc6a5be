"""What operators tell the system: silences and maintenance windows (what not to act on, and until
when), and their verdicts on incidents (a false positive).

A silence matches incidents by node, kind and GPU (an absent field matches anything; none at
all silences everything), and by matchers as Alertmanager writes them (`node=~gpu-0[34]`,
`kind!=gpu_xid`, `gpu=~.+`): every one must hold. A silenced finding is still recorded, as
silenced, and requests no action. Silences are facts on the bus, so every detector (and the store)
learns them the same way.
"""

from __future__ import annotations

import functools
import re
import uuid
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any, ClassVar, Literal

from pydantic import AwareDatetime, BaseModel, ConfigDict, Field, PrivateAttr, ValidationError, field_validator, model_validator

from gpumedic_events.base import Event, NodeId
from gpumedic_events.incident import IncidentKind
from gpumedic_events.redact import CONTROLS, redact

_SILENCE_ID = "8e9f0a1b-2c3d-4e5f-8a6b-7c8d9e0f1a2b"


LABELS = ("node", "kind", "gpu", "cluster")
MATCHER = re.compile(r"^\s*(?P<label>[a-z_]+)\s*(?P<op>=~|!~|!=|=)\s*(?P<value>.*?)\s*$")

@functools.cache
def _re2() -> tuple[Any, Any]:
    """RE2's module and its options, imported once where a silence is matched. It is the extra
    `gpumedic-events[matchers]`: what matches silences depends on it (the detectors, the remediator,
    report-builder, the CLI); a node's sampler never does, and its wheel needs glibc 2.27 where the
    node's artifact supports 2.17."""
    try:
        import re2
    except ImportError:
        raise ValueError("silence matchers need RE2: install gpumedic-events[matchers] (google-re2)") from None
    options = re2.Options()
    options.log_errors = False  # a refused pattern is the caller's one-line error, not a line on stderr
    return re2, options


def compile_re2(pattern: str) -> Any:
    """`pattern` compiled by RE2, which matches in time linear in the text, whatever the pattern
    (Python's `re` backtracks: `((.*)*)*x` takes seconds on one node name, and a detector that
    matched silences with it lost its lease). RE2 is what Alertmanager and Prometheus use, so a
    pattern that works there works here; ValueError with RE2's reason for one it refuses
    (backreferences, lookaround)."""
    re2, options = _re2()
    try:
        return re2.compile(pattern, options)
    except re2.error as exc:
        reason = exc.args[0].decode(errors="replace") if exc.args and isinstance(exc.args[0], bytes) else str(exc)
        raise ValueError(f"{pattern[:200]!r} is not a regular expression RE2 accepts: {reason}") from None


class Matcher(BaseModel):
    """One condition on an incident's labels, as Alertmanager's silences write them: `=` and `!=`
    compare, `=~` and `!~` match a regular expression against the whole value. An incident's
    labels are `node`, `kind`, `gpu` (its index; empty when the incident is not a GPU's) and
    `cluster` (the peer cluster a leader-health incident is about; else empty). An inventory
    group is no label: the CLI turns `group=NAME` into the group's nodes."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    label: Literal[LABELS]
    op: Literal["=", "!=", "=~", "!~"]
    value: str = Field(max_length=4000)
    """Long enough for an inventory group's nodes as one alternation."""
    _regex: Any = PrivateAttr(default=None)

    @model_validator(mode="after")
    def _compiles(self) -> Matcher:
        if self.op in ("=~", "!~"):
            self._regex = compile_re2(self.value)  # once: every match after is RE2's linear scan
        return self

    @classmethod
    def parse(cls, text: str) -> Matcher:
        """`label op value`, the value optionally in double quotes (`node=~"gpu-0[34]"`)."""
        label, op, value = split_matcher(text)
        if label not in LABELS:
            raise ValueError(f"{text!r}: no label {label!r}; a silence matches {', '.join(LABELS)}")
        try:
            return cls(label=label, op=op, value=value)
        except ValidationError as exc:  # one line, not pydantic's three
            raise ValueError(f"{text!r}: {exc.errors()[0]['msg'].removeprefix('Value error, ')}") from None

    def matches(self, labels: Mapping[str, str]) -> bool:
        got = labels.get(self.label, "")
        if self.op == "=":
            return got == self.value
        if self.op == "!=":
            return got != self.value
        assert self._regex is not None  # compiled by the validator for every regex operator
        hit = self._regex.fullmatch(got) is not None
        return hit if self.op == "=~" else not hit

    def __str__(self) -> str:
        return f"{self.label}{self.op}{self.value}"


def split_matcher(text: str) -> tuple[str, str, str]:
    """(label, op, value) of `label op value`, the value's double quotes taken off; ValueError if it is none."""
    found = MATCHER.fullmatch(text)
    if found is None:
        raise ValueError(f"{text!r} is no matcher: write LABEL=VALUE, LABEL!=VALUE, LABEL=~REGEX or LABEL!~REGEX "
                         f"(labels: {', '.join(LABELS)})")
    value = found["value"]
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = value[1:-1]
    return found["label"], found["op"], value


def said_by_a_person(text: str) -> str:
    """What a person typed (a reason, a note, a name), as every surface keeps it: on one line, no
    control a terminal or a page could obey, and a secret pasted into it masked (`redact`)."""
    return redact(CONTROLS.sub(" ", text))


def incident_labels(kind: str, node_id: str, gpu_index: int | None, cluster: str | None = None) -> dict[str, str]:
    """What a silence's matchers see of an incident (Alertmanager's labels of the same names)."""
    return {"node": node_id, "kind": str(kind), "gpu": "" if gpu_index is None else str(gpu_index), "cluster": cluster or ""}


class SilenceAdded(Event):
    """An operator silenced some incidents until `ends_at` (a maintenance window, a known issue)."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.silence.added"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "1a2b3c4d-5e6f-4a7b-8c9d-0e1f2a3b4c5d",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T09:00:00Z",
                    "source": "gpumedic-cli",
                    "silence_id": _SILENCE_ID,
                    "node_id": "gpu-node-07",
                    "kind": None,
                    "gpu_index": None,
                    "starts_at": "2026-11-22T09:00:00Z",
                    "ends_at": "2026-11-22T13:00:00Z",
                    "reason": "driver upgrade",
                    "created_by": "alice",
                },
                {
                    "event_id": "4d5e6f7a-8b9c-4d0e-9f1a-3b4c5d6e7f80",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T09:00:00Z",
                    "source": "gpumedic-cli",
                    "silence_id": "9f0a1b2c-3d4e-4f5a-9b6c-8d9e0f1a2b3c",
                    "matchers": [{"label": "node", "op": "=~", "value": "gpu-node-0[34]"}, {"label": "kind", "op": "!=", "value": "gpu_xid"}],
                    "starts_at": "2026-11-22T09:00:00Z",
                    "ends_at": "2026-11-22T13:00:00Z",
                    "reason": "known NCCL hang on the rack being rewired",
                    "created_by": "alice",
                },
            ]
        }
    )

    silence_id: uuid.UUID
    node_id: NodeId | None = Field(default=None, description="Only this node; None: every node.")
    kind: IncidentKind | None = Field(default=None, description="Only this kind; None: every kind.")
    gpu_index: int | None = Field(default=None, ge=0, le=63, description="Only this GPU; None: every GPU.")
    matchers: tuple[Matcher, ...] = Field(
        default=(), max_length=16, description="Conditions on the incident's labels (node, kind, gpu, cluster), all of which must hold.",
    )
    starts_at: AwareDatetime
    ends_at: AwareDatetime
    every_s: int | None = Field(
        default=None, ge=3600, le=31 * 86400,
        description="A recurring window: in force again every this many seconds after starts_at, for as long, until repeat_until.",
    )
    repeat_until: AwareDatetime | None = Field(default=None, description="With every_s: no window starts at or after it.")
    reason: str = Field(min_length=1, max_length=500, description="Why, for whoever reads the timeline.")
    created_by: str = Field(min_length=1, max_length=128)
    _plain = field_validator("reason", "created_by")(said_by_a_person)

    @model_validator(mode="after")
    def _window(self) -> SilenceAdded:
        if self.ends_at <= self.starts_at:
            raise ValueError("ends_at must be after starts_at")
        if (self.every_s is None) != (self.repeat_until is None):
            raise ValueError("a recurring window needs both every_s and repeat_until")
        if self.every_s is not None and self.every_s < (self.ends_at - self.starts_at).total_seconds():
            raise ValueError("every_s must be at least the window's length (the windows would overlap)")
        if self.repeat_until is not None and self.repeat_until <= self.ends_at:
            raise ValueError("repeat_until must be after the first window's end")
        return self

    def window_at(self, now: datetime) -> tuple[datetime, datetime] | None:
        """The window in force at `now` (start, end), if one is."""
        if now < self.starts_at:
            return None
        if self.every_s is None or self.repeat_until is None:
            return (self.starts_at, self.ends_at) if now < self.ends_at else None
        if now >= self.repeat_until + (self.ends_at - self.starts_at):
            return None
        start = self.starts_at + timedelta(seconds=self.every_s * ((now - self.starts_at).total_seconds() // self.every_s))
        end = start + (self.ends_at - self.starts_at)
        return (start, end) if start < self.repeat_until and now < end else None

    @property
    def last_end(self) -> datetime:
        """When its last window ends (it is over for good after it)."""
        if self.every_s is None or self.repeat_until is None:
            return self.ends_at
        windows = -(-(self.repeat_until - self.starts_at).total_seconds() // self.every_s)  # those that start before repeat_until
        return self.ends_at + timedelta(seconds=self.every_s * (windows - 1))

    def covers(self, kind: str, node_id: str, gpu_index: int | None, cluster: str | None = None) -> bool:
        """Whether this silence matches an incident (in force or not: `window_at` says when)."""
        if self.node_id not in (None, node_id) or self.kind not in (None, kind):
            return False
        if self.gpu_index is not None and self.gpu_index != gpu_index:
            return False
        labels = incident_labels(kind, node_id, gpu_index, cluster)
        return all(m.matches(labels) for m in self.matchers)

    def scope(self) -> str:
        """What it matches, in one line."""
        parts = [f"node {self.node_id}" if self.node_id else "", f"kind {self.kind.value}" if self.kind else "",
                 f"GPU {self.gpu_index}" if self.gpu_index is not None else "", *map(str, self.matchers)]
        return ", ".join(p for p in parts if p) or "everything"


class SilenceRemoved(Event):
    """An operator ended a silence before its time."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.silence.removed"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "2b3c4d5e-6f7a-4b8c-9d0e-1f2a3b4c5d6e",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T11:30:00Z",
                    "source": "gpumedic-cli",
                    "silence_id": _SILENCE_ID,
                    "removed_by": "alice",
                }
            ]
        }
    )

    silence_id: uuid.UUID
    removed_by: str = Field(min_length=1, max_length=128)
    _plain = field_validator("removed_by")(said_by_a_person)


ACKNOWLEDGED_NOTE = "acknowledged; looking into it"
"""An acknowledgement's note when its author gives none."""


def mark_said(verdict: str) -> str:
    """A mark as a person reads it: "acknowledged", "marked false positive"."""
    return "acknowledged" if verdict == "acknowledged" else f"marked {verdict.replace('_', ' ')}"


class IncidentMarked(Event):
    """An operator's mark on a closed or open incident: it was a false positive (report-builder
    keeps it in the false-positive ledger: how often each detector's rule was wrong), or someone
    acknowledged it (they are looking at it; every surface shows who and since when). Marking
    again replaces the reason."""

    subject_prefix: ClassVar[str] = "gpumedic.v1.verdict.marked"
    model_config = ConfigDict(
        json_schema_extra={
            "examples": [
                {
                    "event_id": "3c4d5e6f-7a8b-4c9d-8e0f-2a3b4c5d6e7f",
                    "schema_version": 1,
                    "occurred_at": "2026-11-22T12:00:00Z",
                    "source": "gpumedic-cli",
                    "incident_id": "3b9a1d52-8f3e-4c1a-9d7e-5a0b6c2d4e11",
                    "verdict": "false_positive",
                    "reason": "the job was loading its dataset",
                    "marked_by": "alice",
                }
            ]
        }
    )

    incident_id: uuid.UUID
    verdict: Literal["false_positive", "acknowledged"] = "false_positive"
    reason: str = Field(min_length=1, max_length=500)
    marked_by: str = Field(min_length=1, max_length=128)
    _plain = field_validator("reason", "marked_by")(said_by_a_person)
