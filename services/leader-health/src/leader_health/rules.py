"""The peer-cluster runbook as rules: each probe round's answers in, findings out. Pure: `now`
comes in, the memory (streaks, leader history) is in-process, and what a finding does is the
shared lifecycle's business.

- `peer_blocked` (TCP accepted, HTTP silent) and `peer_down` (connection refused, or no TCP answer
  at all) per peer, after `after_checks` rounds in a row; the fix for a daemon that is blocked or
  not running is a restart of its unit (where the policy names one), never for a host that does
  not answer (SSH would not reach it either). When the peer's own node-sampler says `backlog_from`
  connections wait unaccepted on its daemon's port (runbook 002's "connection backlog grows"), the
  first such round is enough, and no TCP answer is a blocked daemon whose full queue drops new
  connections, not a host that is down;
- `slow_peer` per peer that answers, but slower than `slower_than_s` (5 s: the runbook restarts a
  daemon whose event loop lags that much), `after_checks` rounds in a row: a restart of its unit;
- `peer_partitioned` per answering peer that sees others but more than `max_unseen_share` of the
  other answering peers do not see, for `for_s` (NAT, a firewall: longer than membership takes to
  converge after a join or a restart); a person, since the network is not gpumedic's to fix;
- `quorum_lost` when fewer than a majority of the voters are alive, as the daemons count them
  ("Voters: 2/8"); when they report no voters, when fewer than a majority of the probed peers
  answer, or most answering peers say they have no quorum (nothing else about the leader is
  judged then);
- `split_brain` when answering peers name the same different leaders `after_checks` rounds in a
  row (an election converging names the old and the new leader for a round);
- `no_leader` when quorum holds, no two leaders are named and none has a majority for `grace_s`:
  the fix is forcing an election through an answering voter's admin endpoint (the incident is
  on that peer);
- `leader_flapping` when the leader changes `max_changes` times within `window_s`;
- `peers_below_target` when the cluster has fewer than `target` members for `for_s`: the members
  the leader counts alive, itself included (without an answering leader, the widest view).

Cluster-wide incidents other than `no_leader` are on a node named after the cluster.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter, deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Protocol
from urllib.parse import urlsplit

from gpumedic_events import HttpAdmin, IncidentKind, ListenBacklogReported, RestartUnit, Severity
from gpumedic_incidents import Finding, IncidentState, Policy, cleared, fingerprint
from gpumedic_incidents.policy import PartitionPolicy, PeerPolicy, SlowPeerPolicy
from leader_health.probe import PeerAnswer
from leader_health.status import PeerStatus

NOT_A_TOKEN = re.compile(r"[^A-Za-z0-9_-]")
"""Fingerprints allow letters, digits, '_' and '-' (a host's dots become '-')."""
MAX_STRANGERS = 20
"""Strangers judged at once: a daemon that lists thousands of made-up members makes 20 incidents, not thousands."""
BACKLOG_FRESH = timedelta(seconds=60)
"""How long a node's word on its daemon's accept queue counts (its sampler says it every sample while it lasts)."""
PEER_KINDS = {"blocked": IncidentKind.PEER_BLOCKED, "down": IncidentKind.PEER_DOWN, "unreachable": IncidentKind.PEER_DOWN}
TIMED_OUT = frozenset({"blocked", "unreachable"})
"""The states a timeout makes: a prober that was late itself cannot tell them from its own lateness."""


@dataclass(frozen=True)
class Leadership:
    """What one round's answering peers say together: the voters alive of all voters as the
    daemons report them (else the majority of the probed peers a quorum needs), the leaders they
    name, the one most of them name (None when none has a majority of them, or, without voter
    counts, of all peers), and whether most of the peers that report their quorum say they have
    none."""

    statuses: tuple[PeerStatus, ...]
    quorum: int
    named: Counter[str]
    leader: str | None
    peers_say_no_quorum: bool = False
    voters: tuple[int, int] | None = None
    """(alive, total) as the daemons report them: the leader's count, else the most common."""

    @property
    def has_quorum(self) -> bool:
        if self.voters is not None:
            return self.voters[0] >= self.quorum
        return len(self.statuses) >= self.quorum and not self.peers_say_no_quorum

    def voters_text(self) -> str:
        """As the runbook's log writes it: 'Voters 5/8 (quorum OK)'; '' without voter counts."""
        if self.voters is None:
            return ""
        return f"Voters {self.voters[0]}/{self.voters[1]} ({'quorum OK' if self.has_quorum else 'quorum LOST'})"

    def members(self) -> int:
        """The cluster's size as its leader counts it (the peers it sees alive and itself); without
        an answering leader, the widest view of any answering peer."""
        leader = next((s for s in self.statuses if s.node_id == self.leader), None)
        if leader is not None:
            return len(set(leader.peers) | {leader.node_id})
        return max((len(set(s.peers) | {s.node_id}) for s in self.statuses), default=0)

    def voter_ids(self) -> set[str]:
        """The peers any answering daemon says vote."""
        return {v for s in self.statuses for v in s.voter_ids()}


def leadership(answers: Sequence[PeerAnswer]) -> Leadership:
    statuses = tuple(a.status for a in answers if a.status is not None)
    named = Counter(s.leader for s in statuses if s.leader)
    leader, votes = named.most_common(1)[0] if named else (None, 0)
    reported = [s.quorum for s in statuses if s.quorum is not None]
    no_quorum = bool(reported) and 2 * sum(reported) < len(reported)
    counts = Counter((s.voters, s.voters_total) for s in statuses if s.voters is not None and s.voters_total)
    if counts:
        # Quorum is the voters' (the runbook's "Voters: 5/8 (quorum OK)"): the leader's count, else
        # the most common. Many listed peers may be down without the cluster losing it.
        by_leader = next(((s.voters, s.voters_total) for s in statuses if s.node_id == leader and s.voters is not None and s.voters_total), None)
        voters = by_leader or counts.most_common(1)[0][0]
        majority = voters[1] // 2 + 1
        return Leadership(statuses, majority, named, leader if 2 * votes > len(statuses) else None, no_quorum, voters)
    quorum = len(answers) // 2 + 1
    return Leadership(statuses, quorum, named, leader if votes >= quorum else None, no_quorum)


class Incidents(Protocol):
    """What the rules may read of the open incidents (the book)."""

    def open_on(self, node_id: str) -> list[IncidentState]: ...

    def get(self, fingerprint: str) -> IncidentState | None: ...


class ClusterRules:
    def __init__(self, cluster: str, policy: Policy) -> None:
        self.cluster = cluster
        self.policy = policy
        self.node_of: dict[str, str] = {}
        """Each peer URL's node id, from its last good status (before that, its host)."""
        self._streaks: dict[str, tuple[str, int]] = {}
        self._slow_streaks: dict[str, int] = {}
        self._unseen_since: dict[str, datetime] = {}
        self._leaderless_since: datetime | None = None
        self._below_since: datetime | None = None
        self._leader: str | None = None
        self._changes: deque[datetime] = deque()
        self._split: tuple[frozenset[str], int] = (frozenset(), 0)
        """The leaders the last rounds named, when more than one, and for how many rounds in a row."""
        self._strangers: dict[str, int] = {}
        """Members no inventory names -> rounds in a row they were counted."""
        self.backlogs: dict[str, tuple[ListenBacklogReported, datetime]] = {}
        """node -> its daemon's accept queue as its own node-sampler last said it, and when it arrived."""

    def on_backlog(self, event: ListenBacklogReported, now: datetime) -> None:
        """A node-sampler's word on its daemon's accept queue (0: drained)."""
        if event.waiting:
            self.backlogs[event.node_id] = (event, now)
        else:
            self.backlogs.pop(event.node_id, None)

    def _backlog(self, node: str, now: datetime) -> ListenBacklogReported | None:
        """The node's waiting connections when they are recent and at least the policy's `backlog_from`."""
        seen = self.backlogs.get(node)
        if seen is None or now - seen[1] > BACKLOG_FRESH:
            return None
        return seen[0] if seen[0].waiting >= self.policy.kinds.peer_blocked.backlog_from else None

    def observe(
        self, answers: Sequence[PeerAnswer], now: datetime, incidents: Incidents, inventory: frozenset[str] | None = None,
        *, overran: bool = False,
    ) -> list[Finding]:
        """One probe round's findings; `inventory`: the node ids and hosts the fleet's inventory names
        (None: not known, and no member is judged a stranger); `overran`: the round outlasted its
        interval or the prober's own loop lagged, so how long a peer took to answer is no measure of the
        peer: no slow peer is judged, and a timeout (blocked, unreachable) counts neither way."""
        for a in answers:
            if a.status is not None:
                self.node_of[a.url] = a.status.node_id
        findings = [f for a in answers for f in self._peer(a, incidents, now, overran)]
        if not answers:
            return findings
        view = leadership(answers)
        statuses = view.statuses
        findings += self._partitioned(statuses, incidents, now)
        if inventory is not None:
            findings += self._unknown(statuses, answers, inventory, incidents)
        if not view.has_quorum:
            if view.voters is not None:
                why = f"{view.voters_text()}: fewer than a majority ({view.quorum}) of the voters are alive"
            elif view.peers_say_no_quorum:
                why = f"{sum(s.quorum is False for s in statuses)} of {len(statuses)} answering peers say they have no quorum"
            else:
                why = f"{len(statuses)} of {len(answers)} peers answer (a majority is {view.quorum})"
            findings.append(self._cluster_finding(
                IncidentKind.QUORUM_LOST, f"quorum lost: {why}",
                {"answering": len(statuses), "peers": len(answers), "voters": _voters(view)}, severity="critical",
            ))
            return findings + self._below_target(view.members(), now)
        findings.append(self._cluster_cleared(IncidentKind.QUORUM_LOST))
        named = frozenset(view.named)
        self._split = (named, self._split[1] + 1 if self._split[0] == named else 1) if len(named) > 1 else (frozenset(), 0)
        if self._split[1] >= self.policy.kinds.split_brain.after_checks:
            findings.append(self._cluster_finding(
                IncidentKind.SPLIT_BRAIN, f"peers name {len(view.named)} different leaders: {dict(view.named)}",
                {"leaders": " ".join(sorted(view.named))}, severity="critical",
            ))
        elif len(named) <= 1:
            findings.append(self._cluster_cleared(IncidentKind.SPLIT_BRAIN))
        if len(view.named) <= 1:  # two leaders are a split brain, not a missing leader
            findings += self._no_leader(view, incidents, now)
        findings += self._flapping(view.leader, now)
        return findings + self._below_target(view.members(), now)

    # --- per peer ---------------------------------------------------------------------------

    def _peer(self, answer: PeerAnswer, incidents: Incidents, now: datetime, overran: bool = False) -> list[Finding]:
        node = self.node(answer.url)
        state = answer.state
        backlog = self._backlog(node, now) if state in ("blocked", "unreachable") else None
        if backlog is not None:  # its node is up and says the daemon leaves connections unaccepted: a full queue drops SYNs
            state = "blocked"
        kind = PEER_KINDS.get(state)
        if kind is None:  # answering (or answering badly): neither blocked nor down
            self._streaks.pop(answer.url, None)
            gone = [cleared(k, node) for k in (IncidentKind.PEER_BLOCKED, IncidentKind.PEER_DOWN) if incidents.get(fingerprint(node, k, None))]
            return gone + self._slow(answer, node, incidents, overran)
        self._slow_streaks.pop(answer.url, None)
        if overran and state in TIMED_OUT and backlog is None:
            return []  # a timeout the prober measured while it was late itself: its streak waits
        streak, count = self._streaks.get(answer.url, (kind.value, 0))
        count = count + 1 if streak == kind.value else 1
        self._streaks[answer.url] = (kind.value, count)
        other = IncidentKind.PEER_DOWN if kind is IncidentKind.PEER_BLOCKED else IncidentKind.PEER_BLOCKED
        findings = [cleared(other, node)] if incidents.get(fingerprint(node, other, None)) else []
        rule: PeerPolicy = self.policy.of(kind)
        if count < rule.after_checks and backlog is None:
            return findings
        restart = {}
        if rule.daemon_unit and state != "unreachable":
            restart = {"restart_unit": RestartUnit(unit=rule.daemon_unit)}
        what = {
            "blocked": "its port accepts TCP but HTTP never answers: the daemon's event loop is blocked",
            "down": "it refuses connections: the daemon is not running",
            "unreachable": "its host does not answer at all: the machine or its network is down",
        }[state]
        evidence = {"url": answer.url, "state": state, "detail": answer.detail, "checks": count, "cluster": self.cluster}
        if backlog is not None:
            what = (f"{what}; its own node counts {backlog.waiting} connections waiting unaccepted on port {backlog.port} "
                    f"(of {backlog.limit} before new ones are dropped)")
            evidence |= {"waiting": backlog.waiting, "limit": backlog.limit, "port": backlog.port}
        return findings + [Finding(
            kind=kind,
            node_id=node,
            summary=f"peer {node} of cluster {self.cluster}: {what} ({count} checks in a row)",
            evidence=evidence,
            severity="warning",
            recommended_action=f"restart the peer daemon ({rule.daemon_unit})" if restart
            else "check the machine and its network, then the peer daemon",
            operations=restart,
        )]

    def _slow(self, answer: PeerAnswer, node: str, incidents: Incidents, overran: bool = False) -> list[Finding]:
        """A peer that answers, but slower than the policy's limit, `after_checks` rounds in a row
        (a slow answer in a round that overran counts neither way: its streak waits)."""
        rule: SlowPeerPolicy = self.policy.kinds.slow_peer
        took_s = answer.took_ms / 1000
        if overran and answer.state == "ok" and took_s > rule.slower_than_s:
            return []
        if answer.state != "ok" or took_s <= rule.slower_than_s:
            self._slow_streaks.pop(answer.url, None)
            return [cleared(IncidentKind.SLOW_PEER, node)] if incidents.get(fingerprint(node, IncidentKind.SLOW_PEER, None)) else []
        count = self._slow_streaks[answer.url] = self._slow_streaks.get(answer.url, 0) + 1
        if count < rule.after_checks:
            return []
        restart = {"restart_unit": RestartUnit(unit=rule.daemon_unit)} if rule.daemon_unit else {}
        return [Finding(
            kind=IncidentKind.SLOW_PEER,
            node_id=node,
            summary=f"peer {node} of cluster {self.cluster} answers in {took_s:.1f}s, slower than {rule.slower_than_s:g}s "
            f"({count} checks in a row): its event loop lags",
            evidence={"url": answer.url, "took_s": round(took_s, 2), "limit_s": rule.slower_than_s, "checks": count, "cluster": self.cluster},
            severity="warning",
            recommended_action=f"restart the peer daemon ({rule.daemon_unit})" if restart else "restart the peer daemon, and look for what blocks its event loop",
            operations=restart,
        )]

    def _partitioned(self, statuses: Sequence[PeerStatus], incidents: Incidents, now: datetime) -> list[Finding]:
        """Peers that see the cluster while much of it does not see them. Only peers that see
        someone are judged: one that sees nobody has not joined (that is `peers_below_target`)."""
        rule: PartitionPolicy = self.policy.kinds.peer_partitioned
        joined = {s.node_id: set(s.peers) for s in statuses if s.peers}
        findings: list[Finding] = []
        for peer in joined:
            others = [n for n in joined if n != peer]
            missing = sorted(n for n in others if peer not in joined[n])
            node = self._safe(peer)
            if len(others) < 2 or len(missing) <= rule.max_unseen_share * len(others):
                self._unseen_since.pop(peer, None)
                if incidents.get(fingerprint(node, IncidentKind.PEER_PARTITIONED, None)):
                    findings.append(cleared(IncidentKind.PEER_PARTITIONED, node))
                continue
            since = self._unseen_since.setdefault(peer, now)
            if now - since < timedelta(seconds=rule.for_s):
                continue
            findings.append(Finding(
                kind=IncidentKind.PEER_PARTITIONED,
                node_id=node,
                summary=f"peer {peer} of cluster {self.cluster} sees {len(joined[peer])} peers, but {len(missing)} of the "
                f"{len(others)} other answering peers do not see it (for {(now - since).total_seconds():.0f}s): NAT or a firewall",
                evidence={"cluster": self.cluster, "unseen_by": len(missing), "answering": len(others), "examples": " ".join(missing[:5]),
                          # its row and column of the who-sees-whom matrix: whom it does not see, who does not see it
                          "not_seen_by": " ".join(missing[:50]),
                          "does_not_see": " ".join(sorted(n for n in others if n not in joined[peer])[:50])},
                severity="warning",
                recommended_action="check the network between the peers (NAT, firewall, advertised address)",
            ))
        for gone in set(self._unseen_since) - set(joined):
            del self._unseen_since[gone]
        return findings

    def _unknown(self, statuses: Sequence[PeerStatus], answers: Sequence[PeerAnswer], inventory: frozenset[str],
                 incidents: Incidents) -> list[Finding]:
        """Members the answering daemons count that neither the inventory nor the watched peers name
        (runbook 002: the leader lists `test`, a stray daemon nobody runs on purpose)."""
        rule = self.policy.kinds.unknown_peer
        known = inventory | set(self.node_of.values()) | {urlsplit(a.url).hostname or "" for a in answers}
        listed: dict[str, list[str]] = {}
        for status in statuses:
            for peer in status.peers:
                if peer not in known:
                    listed.setdefault(peer, []).append(status.node_id)
        findings: list[Finding] = []
        for gone in set(self._strangers) - set(listed):
            del self._strangers[gone]
            findings.append(cleared(IncidentKind.UNKNOWN_PEER, self._key, key=self._stranger_key(gone)))
        for peer, by in sorted(listed.items())[:MAX_STRANGERS]:
            rounds = self._strangers[peer] = self._strangers.get(peer, 0) + 1
            if rounds < rule.after_checks:
                continue
            findings.append(Finding(
                kind=IncidentKind.UNKNOWN_PEER, node_id=self._key, key=self._stranger_key(peer),
                summary=f"{len(by)} peer(s) of cluster {self.cluster} count {peer[:100]!r} as a member, which no inventory names "
                        f"(listed by {', '.join(sorted(by)[:5])}): a stray daemon, a test instance or a renamed node",
                evidence={"cluster": self.cluster, "peer": peer[:256], "listed_by": " ".join(sorted(by)[:20])},
                severity="warning",
                recommended_action=f"find where {peer[:100]!r} runs and stop it, or add it to the inventory if it belongs",
            ))
        return findings

    def _stranger_key(self, peer: str) -> str:
        return f"{self._safe(peer)[:40]}-{hashlib.sha256(peer.encode()).hexdigest()[:8]}"

    # --- the cluster ------------------------------------------------------------------------

    def _no_leader(self, view: Leadership, incidents: Incidents, now: datetime) -> list[Finding]:
        statuses = view.statuses
        open_on = [i for s in statuses for i in incidents.open_on(self._safe(s.node_id))
                   if i.kind is IncidentKind.NO_LEADER and i.key == self._key]
        if view.leader is not None:
            self._leaderless_since = None
            return [cleared(IncidentKind.NO_LEADER, i.node_id, key=self._key) for i in open_on]
        self._leaderless_since = self._leaderless_since or now
        rule = self.policy.kinds.no_leader
        leaderless = now - self._leaderless_since
        if leaderless < timedelta(seconds=rule.grace_s):
            return []
        # The incident stays on the peer it opened on; a new one goes to the first answering voter
        # (an election is a voter's business, as the runbook forces it), else the first answering peer.
        voters = [s for s in statuses if s.node_id in view.voter_ids()] or list(statuses)
        node = open_on[0].node_id if open_on else min(self._safe(s.node_id) for s in voters)
        held = view.voters_text() or f"quorum {view.quorum}"
        endpoint = rule.election_endpoint
        election = {"http_admin": HttpAdmin(endpoint=endpoint)} if endpoint in self.policy.actions.http_admin.endpoints else {}
        return [Finding(
            kind=IncidentKind.NO_LEADER,
            node_id=node,
            key=self._key,
            summary=f"cluster {self.cluster}: {len(statuses)} peers answer ({held}) but none has led for "
            f"{leaderless.total_seconds():.0f}s",
            evidence={"cluster": self.cluster, "answering": len(statuses), "quorum": view.quorum, "voters": _voters(view),
                      "leaderless_s": round(leaderless.total_seconds())},
            severity="critical",
            recommended_action=f"force an election through a peer's admin endpoint ({endpoint})" if election
            else f"force an election (add actions.http_admin.endpoints.{endpoint} to let gpumedic do it)",
            operations=election,
        )]

    def _flapping(self, leader: str | None, now: datetime) -> list[Finding]:
        rule = self.policy.kinds.leader_flapping
        if leader is not None and self._leader is not None and leader != self._leader:
            self._changes.append(now)
        if leader is not None:
            self._leader = leader
        while self._changes and now - self._changes[0] > timedelta(seconds=rule.window_s):
            self._changes.popleft()
        if len(self._changes) < rule.max_changes:
            return [self._cluster_cleared(IncidentKind.LEADER_FLAPPING)]
        return [self._cluster_finding(
            IncidentKind.LEADER_FLAPPING,
            f"the leader changed {len(self._changes)} times within {rule.window_s:g}s (now {leader or 'none'})",
            {"changes": len(self._changes), "window_s": rule.window_s},
        )]

    def _below_target(self, members: int, now: datetime) -> list[Finding]:
        rule = self.policy.kinds.peers_below_target
        if not rule.target or members >= rule.target:
            self._below_since = None
            return [self._cluster_cleared(IncidentKind.PEERS_BELOW_TARGET)]
        self._below_since = self._below_since or now
        if now - self._below_since < timedelta(seconds=rule.for_s):
            return []
        return [self._cluster_finding(
            IncidentKind.PEERS_BELOW_TARGET,
            f"the cluster has {members} peers, below the target of {rule.target} for {(now - self._below_since).total_seconds():.0f}s",
            {"members": members, "target": rule.target},
        )]

    # --- names --------------------------------------------------------------------------------

    @property
    def _key(self) -> str:
        return self._safe(self.cluster)

    def _cluster_finding(self, kind: IncidentKind, summary: str, evidence: dict, severity: Severity = "warning") -> Finding:
        return Finding(kind=kind, node_id=self._key, summary=summary, evidence={"cluster": self.cluster, **evidence},
                       severity=severity, recommended_action="look at the peers' own logs: gpumedic cannot fix this safely")

    def _cluster_cleared(self, kind: IncidentKind) -> Finding:
        return cleared(kind, self._key)

    def node(self, url: str) -> str:
        """The peer's node id (the inventory's name for it, from its own status once it answered)."""
        return self._safe(self.node_of.get(url) or urlsplit(url).hostname or "unknown-peer")

    @staticmethod
    def _safe(name: str) -> str:
        """A name fit for a subject token and a fingerprint: other characters become '-'."""
        return NOT_A_TOKEN.sub("-", name)[:63].lstrip("-_.") or "unknown-peer"


def _voters(view: Leadership) -> str:
    """The voters alive of all, as the runbook writes it ('3/7'), or ''."""
    return f"{view.voters[0]}/{view.voters[1]}" if view.voters is not None else ""
