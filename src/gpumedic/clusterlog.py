"""What `gpumedic cluster log` prints: a peer cluster's checks over time, and the summary the
runbook used to compute by hand (gpumedic_store.clusterlog)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from gpumedic.output import clip, fmt_time, table, to_json
from gpumedic_store import views
from gpumedic_store.clusterlog import ClusterSummary, Goal, summarize


def _hours(delta: timedelta) -> str:
    seconds = delta.total_seconds()
    return f"{seconds / 3600:.1f}h" if seconds >= 3600 else f"{seconds / 60:.1f}min" if seconds >= 60 else f"{seconds:.0f}s"


def summary_text(cluster: str, s: ClusterSummary) -> list[str]:
    share = s.with_leader / s.span if s.span else 0.0
    lines = [
        f"cluster {cluster}: {s.checks} checks over {_hours(s.span)} ({fmt_time(s.first)} .. {fmt_time(s.last)})",
        f"  peers now {s.peers_now}/{s.peers_total_now}, peak {s.peers_peak}",
        f"  with a leader {_hours(s.with_leader)} ({share:.0%})"
        + (f"; unmonitored {_hours(s.unmonitored)} ({s.unmonitored / s.span:.0%}: no check ran)" if s.unmonitored else "")
        + f"; leader changes {s.leader_changes} ({s.changes_per_hour:.1f}/h); longest without a leader {_hours(s.longest_leaderless)}",
        f"  quorum margin (voters alive beyond their majority) now {s.quorum_margin_now:+d}, lowest {s.quorum_margin_min:+d}",
    ]
    if s.goal is not None:
        goal = f"  goal {s.goal.peers} peers for {s.goal.hours:g}h: "
        if s.goal_met:
            goal += f"holds ({_hours(s.goal_held_for)} so far)"
        elif s.goal_held_for is None:
            goal += f"not met: {s.peers_now} peers answer now"
        else:
            goal += f"not yet: {_hours(s.goal_held_for)} of {s.goal.hours:g}h"
        lines.append(goal)
    return lines


def _yes_no(value: object) -> str:
    return "-" if value is None else "yes" if value else "no"


def _or_dash(value: object) -> str:
    return "-" if value is None else f"{value:g}" if isinstance(value, float) else str(value)


async def log_text(
    store_url: str, *, cluster: str | None, since: timedelta, goal: Goal | None = None, rows: int = 30, as_json: bool = False
) -> str:
    async with views.store_session(store_url) as session:
        names = [cluster] if cluster else await views.clusters(session)
        checks = {name: await views.cluster_checks(session, cluster=name, since=datetime.now(UTC) - since) for name in names}
    if as_json:
        return to_json([{"cluster": n, "summary": summarize(checks[n], goal), "checks": checks[n][-rows:]} for n in names])
    out = []
    for name in names:
        summary = summarize(checks[name], goal)
        if summary is None:
            out.append(f"cluster {name}: no checks in the last {_hours(since)}")
            continue
        out += summary_text(name, summary)
        if latest := checks[name][-1].peers:
            out.append(table(
                ["PEER", "STATE", "ROLE", "VOTER", "ANSWER", "JOBS", "GPU%"],
                [[p.get("node_id") or p["url"], p["state"], p.get("role") or "-", _yes_no(p.get("voter")), f"{p.get('answer_ms', 0):.0f}ms",
                  _or_dash(p.get("jobs")), _or_dash(p.get("gpu_percent"))] for p in latest],
                indent=2, right=["ANSWER", "JOBS", "GPU%"],
            ))
        out.append(table(
            ["CHECKED", "PEERS", "LEADER", "SUMMARY"],
            [[fmt_time(c.checked_at), f"{c.peers_answering}/{c.peers_total}", c.leader or "-", clip(c.summary, 110)]
             for c in checks[name][-rows:]],
            indent=2, right=["PEERS"],
        ))
        out.append("")
    return "\n".join(out).rstrip() if out else "no cluster checks recorded (is leader-health running, with GPUMEDIC_LEADER_PEERS?)"
