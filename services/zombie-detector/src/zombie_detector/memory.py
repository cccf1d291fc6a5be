"""The rules' memory, kept in the bucket `GPUMEDIC_RULE_MEMORY`, so the instance that takes over
(a standby, or the same one restarted) goes on from it instead of learning every streak again: a
GPU idle for eight of its ten minutes is a zombie two minutes after a failover, not ten.

A rule that remembers (`Remembers`) gives its memory as entries, each of one node; the active
instance writes them every `CHECKPOINT_S`, one key per partition of the nodes
(`zombie-detector.p03`, the partitions the samples are stored under), and the next one reads them
all before it consumes anything. Memory of samples is taken back only while the samples since it
are still in the samples stream: the time in between was the detector's absence, not the node's,
and those samples are read next. Older memory of samples is left, and those rules learn again, as
they did before. Memory of node events (XIDs, container exits) is taken back whatever its age:
the node-events stream keeps them, and the detector's consumers read on from where the instance
before stopped; the rule's own window ends what is too old.
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
PARTITION_BYTES = 768 * 1024
"""The most one partition's memory takes in the bucket: a value is one message, and the server
takes at most 1 MB (`max_payload`)."""


@runtime_checkable
class Remembers(Protocol):
    entry: ClassVar[type[msgspec.Struct]]
    """One node's part of the rule's memory (a struct with a `node` field)."""
    of_events: ClassVar[bool]
    """Its memory is of node events (kept by their stream), not of samples (kept for a minute)."""

    def remember(self) -> Iterable[msgspec.Struct]: ...

    def recall(self, entries: Sequence[Any], now: datetime) -> None:
        """Take back what an earlier instance remembered, at `now`: its nodes were not unwatched
        meanwhile, the detector was."""


class _Checkpoint(msgspec.Struct):
    at: datetime
    rules: dict[str, msgspec.Raw]


DECIDER = "zombie-detector"
CELLS = "zombie-detector.cells"
"""Whose memory a key holds: the decider's rules' (those that compare nodes) or the cells' (the rest)."""


def key(partition: int, whose: str = DECIDER) -> str:
    return f"{whose}.p{partition:02d}"


def snapshot(rules: Iterable[object], now: datetime, *, budget: int = PARTITION_BYTES,
             whose: str = DECIDER) -> tuple[dict[str, bytes], list[str]]:
    """Every partition's memory, as written to the bucket (a partition with none included, so
    that what it remembered before is replaced), and a line for each rule's part left out of a
    partition that would be over `budget` bytes (the largest first: that rule learns again after a
    takeover, as all did before)."""
    parts: list[dict[str, bytes]] = [{} for _ in range(PARTITIONS)]
    for rule in rules:
        if isinstance(rule, Remembers):
            entries: list[list[msgspec.Struct]] = [[] for _ in range(PARTITIONS)]
            for entry in rule.remember():
                entries[partition_of(entry.node)].append(entry)
            for p, mine in enumerate(entries):
                if mine:
                    parts[p][type(rule).__name__] = msgspec.json.encode(mine)
    values, left_out = {}, []
    for p, part in enumerate(parts):
        while sum(map(len, part.values())) > budget:
            name = max(part, key=lambda n: len(part[n]))
            left_out.append(f"{key(p, whose)}: {name}'s memory ({len(part[name]) // 1024} KiB) left out, the partition's would pass "
                            f"{budget // 1024} KiB; it learns again after a takeover")
            del part[name]
        values[key(p, whose)] = msgspec.json.encode({"at": now, "rules": {n: msgspec.Raw(v) for n, v in part.items()}})
    return values, left_out


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
        if age_s < 0:
            lines.append(f"{name}: written {-age_s:.0f}s in the future (a clock set back?); its rules learn again")
            continue
        samples_kept = age_s <= SAMPLES_MAX_AGE_S
        if not samples_kept:
            lines.append(f"{name}: written {age_s:.0f}s ago, not within the {SAMPLES_MAX_AGE_S:g}s the samples since it are kept; "
                         "its rules of samples learn again")
        for rule_name, raw in checkpoint.rules.items():
            rule = remembering.get(rule_name)
            if rule is None or not (samples_kept or rule.of_events):
                continue  # a rule this release no longer has, or samples the stream no longer holds
            try:
                entries = msgspec.json.decode(raw, type=list[rule.entry])
            except msgspec.DecodeError as exc:
                lines.append(f"{name}: {rule_name}'s memory unreadable ({exc}); it learns again")
                continue
            gathered.setdefault(rule_name, []).extend(entries)
            taken += len(entries)
            if entries:
                oldest_s = max(oldest_s, age_s)
    for rule_name, entries in gathered.items():
        remembering[rule_name].recall(entries, now)
    return [f"{taken} entries taken back, written up to {oldest_s:.0f}s ago", *lines]
