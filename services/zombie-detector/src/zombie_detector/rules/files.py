"""file_missing: a file every node must have (node-sampler's expected files: runbook 002's
"canonical models not synced to all nodes") is missing on a node, or its copy differs from the
one most nodes have.

Per node and file, from each sample's `files`, for `for_s`: absent, or a digest other than the
fleet's. The fleet's copy is the digest most nodes that read the file report, and only when more
than half of them agree and at least two do: with no majority (a new model being rolled out, a
fleet that disagrees) nobody is called stale. A node that cannot tell (the file unreadable) or
has not read its copy yet opens and clears nothing. One incident per node and file (key: its name
and a digest of its path); a person's by default: copying a model from a node that has it is the
operator's. Missing on much of the fleet at once, the fleet hold makes it one fleet incident.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import FileFact, IncidentKind, NodeRetired
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import FileMissingPolicy
from zombie_detector.rules.base import Incidents, NodeId

KIND = IncidentKind.FILE_MISSING


def file_key(path: str) -> str:
    """A file as a fingerprint part: its name's safe characters and a digest of its whole path."""
    name = re.sub(r"[^A-Za-z0-9_-]+", "-", path.rsplit("/", 1)[-1]).strip("-_")[:40] or "file"
    return f"{name}-{hashlib.sha256(path.encode()).hexdigest()[:10]}"


FilePath = Annotated[str, msgspec.Meta(min_length=1, max_length=4096)]


class NodeFiles(msgspec.Struct, frozen=True, omit_defaults=True):
    """One node's copies and since when each of its files has looked missing or stale (the rule's
    memory: `zombie_detector.memory`). The copies are the fleet's vote: a takeover that had to
    wait for every node's next sample to know the fleet's copy would start each stale copy's
    `for_s` again meanwhile."""

    node: NodeId
    copies: dict[FilePath, Annotated[str, msgspec.Meta(pattern=r"^[0-9a-f]{64}$")]] = {}
    bad_since: dict[FilePath, datetime] = {}


class FileRule:
    inputs = (Sample, NodeRetired)
    entry = NodeFiles
    of_events = False

    def __init__(self, policy: FileMissingPolicy) -> None:
        self.policy = policy
        self.copies: dict[str, dict[str, str]] = {}
        """path -> node -> the digest of its copy (nodes that read one)."""
        self.counts: dict[str, Counter[str]] = {}
        """path -> digest -> how many nodes have it: kept as copies change, so that judging a sample
        never counts the whole fleet's copies."""
        self.bad_since: dict[tuple[str, str], datetime] = {}
        self._expects: dict[str, set[str]] = {}
        """node -> the paths its sampler looks for."""
        self._remembered: dict[str, NodeFiles] = {}
        """Each node's memory as last given, until its copies or streaks change (most never do)."""

    def observe(self, event: Sample | NodeRetired, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        node = event.node_id
        facts = event.files if isinstance(event, Sample) else ()
        before = self._expects.get(node, set())
        if not facts and not before:
            return ()  # the hot path: a node that expects no file
        findings: list[Finding] = []
        gone = before - {f.path for f in facts}
        for path in gone:  # no longer expected (or the node retired)
            self._copy(path, node, None)
            if self.bad_since.pop((node, path), None) is not None:
                findings.append(Finding(KIND, node, key=file_key(path), present=False, summary=f"{path} is no longer expected there"))
        if facts:
            self._expects[node] = {f.path for f in facts}
        else:
            self._expects.pop(node, None)
        changed = bool(gone) or len(facts) != len(before)
        for fact in facts:
            if fact.sha256 is not None or fact.present is False:
                changed = self._copy(fact.path, node, fact.sha256) or changed
        for fact in facts:
            why = self._why(fact, node)
            if why is None:
                continue  # cannot tell yet
            key = (node, fact.path)
            if why:
                since = self.bad_since.get(key)
                if since is None:
                    since = self.bad_since[key] = now
                    changed = True
                if now - since >= timedelta(seconds=self.policy.for_s):
                    findings.append(self._finding(node, fact, why))
            elif self.bad_since.pop(key, None) is not None:
                changed = True
                findings.append(Finding(KIND, node, key=file_key(fact.path), present=False, summary=f"{fact.path} is there as the fleet has it"))
        if changed:
            self._remembered.pop(node, None)
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def remember(self) -> list[NodeFiles]:
        return [self._remembered.get(node) or self._remember(node, paths) for node, paths in self._expects.items()]

    def _remember(self, node: str, paths: set[str]) -> NodeFiles:
        copies = {path: self.copies[path][node] for path in paths if node in self.copies.get(path, ())}
        bad = {path: self.bad_since[(node, path)] for path in paths if (node, path) in self.bad_since}
        entry = self._remembered[node] = NodeFiles(node, copies, bad)
        return entry

    def recall(self, entries: Sequence[NodeFiles], now: datetime) -> None:
        for entry in entries:
            self._expects[entry.node] = set(entry.copies) | set(entry.bad_since)
            for path, digest in entry.copies.items():
                self._copy(path, entry.node, digest)
            for path, since in entry.bad_since.items():
                self.bad_since[(entry.node, path)] = min(since, now)

    def _copy(self, path: str, node: str, digest: str | None) -> bool:
        """The node's copy of `path` is now `digest` (None: it has none); whether that changed it."""
        copies, counts = self.copies.setdefault(path, {}), self.counts.setdefault(path, Counter())
        old = copies.get(node)
        if old == digest:
            return False
        if old is not None:
            counts[old] -= 1
            if not counts[old]:
                del counts[old]
            del copies[node]
        if digest is not None:
            copies[node] = digest
            counts[digest] += 1
        return True

    def _why(self, fact: FileFact, node: str) -> str | None:
        """What is wrong with the node's copy ('' nothing), None when it cannot be told."""
        if fact.present is False:
            fleet = len(self.copies.get(fact.path, {}))  # its own copy is gone from them
            return f"{fact.path} is missing" + (f" ({fleet} other node(s) have it)" if fleet else "")
        if fact.present is None or fact.sha256 is None:
            return None
        canonical = self._fleet_copy(fact.path)
        if canonical is None or canonical[0] == fact.sha256:
            return ""
        digest, agree, of = canonical
        return (f"{fact.path} differs from the copy {agree} of {of} nodes have (sha256 {fact.sha256[:12]}, theirs {digest[:12]}): "
                "a partial or stale copy")

    def _fleet_copy(self, path: str) -> tuple[str, int, int] | None:
        """(the digest most nodes have, how many, of how many that read it); None with no clear majority."""
        counts = self.counts.get(path)
        if not counts:
            return None
        digest, agree = counts.most_common(1)[0]
        of = len(self.copies[path])
        if agree < 2 or agree * 2 <= of:
            return None
        return digest, agree, of

    @staticmethod
    def _finding(node: str, fact: FileFact, why: str) -> Finding:
        return Finding(
            kind=KIND, node_id=node, key=file_key(fact.path), summary=why[:1000], severity="warning",
            evidence={"path": fact.path[:1000], "present": fact.present, "size": fact.size, "sha256": fact.sha256},
            recommended_action=f"copy {fact.path[:300]} from a node that has the fleet's copy (rsync, or the job's model sync), "
                               "then check its SHA-256; a job started here would load no model, or another one",
        )
