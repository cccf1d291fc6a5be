"""Which peer leads each cluster, as leader-health last reported it: where the gate sends an admin
endpoint the policy calls on the leader (`KnownLeader`).

A request names the leader it means (`HttpAdmin.at`, from its detector), but that is the
detector's word: the remediator reads leader-health's checks itself (`ClusterChecked`, live, and
the newest stored one at start) and refuses a request that names another node.
"""

from __future__ import annotations

from gpumedic_events import ClusterChecked
from remediator.catalogue.base import KnownLeader


class ClusterLeaders:
    """Each cluster's latest check: its leader, and the nodes it names (peers, the leader's view, the leader)."""

    def __init__(self) -> None:
        self._clusters: dict[str, tuple[KnownLeader, frozenset[str]]] = {}

    def observe(self, check: ClusterChecked) -> None:
        """Keep `check` unless a newer one of its cluster is kept (a start's lookup may come after a live one)."""
        kept = self._clusters.get(check.cluster)
        if kept is not None and kept[0].checked_at >= check.occurred_at:
            return
        named = {p.node_id for p in check.peers if p.node_id} | {p.node_id for p in check.leader_view}
        members = frozenset(named | ({check.leader} if check.leader else set()))
        self._clusters[check.cluster] = (KnownLeader(cluster=check.cluster, leader=check.leader, checked_at=check.occurred_at), members)

    def of(self, node_id: str) -> KnownLeader | None:
        """The newest check of a cluster that names `node_id`; None when none does."""
        return max((known for known, members in self._clusters.values() if node_id in members), key=lambda k: k.checked_at, default=None)
