"""Judging a peer cluster's leadership from its peers' status answers. Pure."""

from __future__ import annotations

from collections import Counter

from gpumedic_events import ClusterChecked
from leader_health.probe import PeerAnswer

SOURCE = "leader-health"


def assess(cluster: str, answers: list[PeerAnswer]) -> ClusterChecked:
    """Healthy when a quorum of peers answers and a quorum of all peers names the same leader."""
    total = len(answers)
    answering = [a for a in answers if a.status is not None]
    quorum = total // 2 + 1
    named = Counter(str(a.status["leader"]) for a in answering if a.status.get("leader"))
    leader, votes = named.most_common(1)[0] if named else (None, 0)
    if total == 0:
        summary, healthy = "no peers configured", False
    elif len(answering) < quorum:
        summary, healthy = f"quorum lost: {len(answering)}/{total} peers answer", False
    elif leader is None or votes < quorum:
        summary, healthy = f"no leader with quorum: {len(answering)}/{total} answer, leaders named {dict(named)}", False
    else:
        summary, healthy = f"{len(answering)}/{total} peers answer; leader {leader}", True
    return ClusterChecked(
        source=SOURCE,
        cluster=cluster,
        peers_total=total,
        peers_answering=len(answering),
        leader=leader[:256] if leader else None,
        healthy=healthy,
        summary=summary[:1000],
    )
