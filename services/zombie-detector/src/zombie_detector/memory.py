"""The rules' memory, kept in the bucket `GPUMEDIC_RULE_MEMORY`, so the instance that takes over
(a standby, or the same one restarted) goes on from it instead of learning every streak again: a
GPU idle for eight of its ten minutes is a zombie two minutes after a failover, not ten.

A rule that remembers (`Remembers`) gives its memory as entries, each of one node; the active
instance writes them every `CHECKPOINT_S`, one key per partition of the nodes
(`zombie-detector.p03`, the partitions the samples are stored under), and the next one reads them
all before it consumes anything. Memory is taken back only while the samples since it are still in
the samples stream: the time in between was the detector's absence, not the node's, and those
samples are read next. Older memory is left, and the rules learn again, as they did before.
Pure here (no bus): `DetectorHandlers` reads and writes the bucket.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, ClassVar, Protocol, runtime_checkable

import msgspec

from gpumedic_bus.streams import PARTITIONS, SAMPLES_MAX_AGE_S, partition_of

CHECKPOINT_S = 5.0
"""How often the active instance writes its rules' memory: what a takeover may not know of."""


@runtime_checkable
class Remembers(Protocol):
    entry: ClassVar[type[msgspec.Struct]]
    """One node's part of the rule's memory (a struct with a `node` field)."""

    def remember(self) -> Iterable[msgspec.Struct]: ...

    def recall(self, entries: Sequence[Any], now: datetime) -> None:
        """Take back what an earlier instance remembered, at `now`: its nodes were not unwatched
        meanwhile, the detector was."""


class _Checkpoint(msgspec.Struct):
    at: datetime
    rules: dict[str, msgspec.Raw]


def key(partition: int) -> str:
    return f"zombie-detector.p{partition:02d}"


def snapshot(rules: Iterable[object], now: datetime) -> dict[str, bytes]:
    """Every partition's memory, as written to the bucket (a partition with none included, so
    that what it remembered before is replaced)."""
    parts: list[dict[str, list[msgspec.Struct]]] = [{} for _ in range(PARTITIONS)]
    for rule in rules:
        if isinstance(rule, Remembers):
            for entry in rule.remember():
                parts[partition_of(entry.node)].setdefault(type(rule).__name__, []).append(entry)
    return {key(p): msgspec.json.encode({"at": now, "rules": part}) for p, part in enumerate(parts)}


def recall(rules: Iterable[object], stored: Mapping[str, bytes], now: datetime) -> list[str]:
    """Give each rule what the stored partitions remember of it. Says, a line each, how much was
    taken back, and each partition left (too old, or unreadable: that part is learnt again)."""
    remembering = {type(r).__name__: r for r in rules if isinstance(r, Remembers)}
    gathered: dict[str, list[Any]] = {}
    lines: list[str] = []
    taken, oldest_s = 0, 0.0
    for name, value in sorted(stored.items()):
        try:
            checkpoint = msgspec.json.decode(value, type=_Checkpoint)
        except msgspec.DecodeError as exc:
            lines.append(f"{name}: unreadable ({exc}); its rules learn again")
            continue
        age_s = (now - checkpoint.at).total_seconds()
        if not 0 <= age_s <= SAMPLES_MAX_AGE_S:
            lines.append(f"{name}: written {age_s:.0f}s ago, not within the {SAMPLES_MAX_AGE_S:g}s the samples since it are kept; "
                         "its rules learn again")
            continue
        oldest_s = max(oldest_s, age_s)
        for rule_name, raw in checkpoint.rules.items():
            rule = remembering.get(rule_name)
            if rule is None:
                continue  # a rule this release no longer has
            try:
                entries = msgspec.json.decode(raw, type=list[rule.entry])
            except msgspec.DecodeError as exc:
                lines.append(f"{name}: {rule_name}'s memory unreadable ({exc}); it learns again")
                continue
            gathered.setdefault(rule_name, []).extend(entries)
            taken += len(entries)
    for rule_name, entries in gathered.items():
        remembering[rule_name].recall(entries, now)
    return [f"{taken} entries taken back, written up to {oldest_s:.0f}s ago", *lines]
