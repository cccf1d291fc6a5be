"""The simulated peer-to-peer job cluster the nodes' daemons form: who is a member, who sees whom,
who votes, who leads, and the faults a real one has. Every node's `/status` is this cluster as
that node's daemon sees it (`status`).

Membership converges over time, as with gossip: a peer that joins (or comes back after a restart)
is seen by each other peer after a delay of that pair's own, spread over `convergence_s`, and
learns of them likewise; a peer whose daemon stops or blocks drops out of the others' alive lists
the same way. The first `voters` members vote: a peer has quorum while it sees a majority of the
voters (itself included), and names the leader only while it has quorum and sees the leader.

What the faults set: `quorum_lost` (the voters cannot reach each other: every peer reports no
quorum and no leader), a `rival` leader with its own followers (split brain), peers `hidden` from
some others (NAT: the node sees them, they do not see it), and peers that never `joined`.
Pure state with a clock: what happens over time (an election after a leader leaves, a fault that
heals) the fleet schedules.
"""

from __future__ import annotations

import time
import zlib
from collections.abc import Callable, Iterable, Sequence

VOTERS = 7
CONVERGENCE_S = 8.0
"""Every pair of peers has met within this long of the later one's joining."""
ELECTION_S = 3.0
"""How long the cluster goes without a leader when its leader leaves or steps down."""


class PeerCluster:
    def __init__(
        self,
        node_ids: Sequence[str],
        *,
        voters: int = VOTERS,
        convergence_s: float = CONVERGENCE_S,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._clock = clock
        self.convergence_s = convergence_s
        long_ago = clock() - 86_400.0
        self.joined: dict[str, float] = dict.fromkeys(node_ids, long_ago)
        """The members and when each (re)joined; a node not in it never joined."""
        self.gone: dict[str, float] = {}
        """Members whose daemon stopped or blocked, and since when."""
        self.voters: tuple[str, ...] = tuple(node_ids[:voters])
        self.leader: str | None = node_ids[0] if node_ids else None
        self.quorum_lost = False
        self.rival: str | None = None
        self.rival_followers: frozenset[str] = frozenset()
        self.hidden: dict[str, frozenset[str]] = {}
        """node -> the peers that cannot see it."""
        self.stale_jobs: dict[str, int] = {}
        """node -> jobs the daemons still count on it whose processes are gone (until the leader resets it)."""
        self.loads: Callable[[str], tuple[int | None, float] | None] | None = None
        """A member's (counted jobs, GPU %) as the daemons report them to each other (the fleet's nodes)."""

    @property
    def majority(self) -> int:
        return len(self.voters) // 2 + 1

    # --- what a daemon sees -----------------------------------------------------------------

    def sees(self, a: str, b: str, now: float | None = None) -> bool:
        """Does a's daemon count b alive?"""
        now = self._clock() if now is None else now
        if a == b or a not in self.joined or b not in self.joined or a in self.hidden.get(b, ()):
            return False
        delay = self._delay(a, b)
        if now - max(self.joined[a], self.joined[b]) < delay:
            return False  # not met yet
        gone = self.gone.get(b)
        return gone is None or now - gone < delay

    def status(self, node_id: str) -> dict:
        """The node's daemon's `/status` document."""
        now = self._clock()
        if node_id not in self.joined:
            return _document(node_id, "joining", None, [], 0, len(self.voters), quorum=False, uptime_s=0.0)
        alive = [p for p in self.joined if self.sees(node_id, p, now)]
        seen = {node_id, *alive}
        voters = sum(v in seen for v in self.voters)
        if self.quorum_lost:
            voters = min(voters, self.majority - 1)
        quorum = voters >= self.majority
        if not quorum:
            leader = None
        elif node_id in self.rival_followers:
            leader = self.rival
        else:
            leader = self.leader if self.leader in seen else None
        role = "leader" if leader == node_id else "follower"
        return _document(node_id, role, leader, alive, voters, len(self.voters), quorum=quorum, uptime_s=now - self.joined[node_id])

    def leader_of(self, node_id: str) -> str | None:
        return self.status(node_id)["leader"]

    # --- what happens to it ------------------------------------------------------------------

    def leave(self, node_id: str) -> None:
        """The node's daemon stops or blocks: the others stop counting it alive; a leader leaving
        leaves the cluster without one until `elect`."""
        if node_id in self.joined:
            self.gone.setdefault(node_id, self._clock())
        if self.leader == node_id:
            self.leader = None

    def join(self, node_id: str) -> None:
        """The node's daemon starts (again): a new member, met by the others over `convergence_s`."""
        self.gone.pop(node_id, None)
        self.joined[node_id] = self._clock()

    def never_join(self, node_ids: Iterable[str]) -> None:
        for node_id in node_ids:
            self.joined.pop(node_id, None)
            self.gone.pop(node_id, None)

    def elect(self, node_id: str | None = None) -> str | None:
        """A new leader: `node_id`, or the first voter still running."""
        if node_id is None:
            node_id = next((v for v in self.voters if v in self.joined and v not in self.gone), None)
        self.leader = node_id
        return node_id

    def _delay(self, a: str, b: str) -> float:
        """Pair a-b's own delay in [0, convergence_s): the same every run, different per pair."""
        return zlib.crc32(f"{a}>{b}".encode()) / 2**32 * self.convergence_s


def _document(
    node_id: str, role: str, leader: str | None, peers: list[str], voters: int, voters_total: int, *, quorum: bool, uptime_s: float
) -> dict:
    return {
        "node_id": node_id,
        "role": role,
        "leader": leader,
        "peers": peers,
        "voters": voters,
        "voters_total": voters_total,
        "quorum": quorum,
        "uptime_s": round(uptime_s, 1),
        "healthy": True,
    }
