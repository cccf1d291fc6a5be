"""What the control plane itself shows: a service behind its samples, samples the bus did not take.

A control plane that cannot keep up must say so once, and never act on what it did not see.

- control_plane_behind: each sample consumer knows how far behind its stream it is
  (`gpumedic_bus.consume.Lag`) and every service how late its own event loop runs
  (`gpumedic_bus.lateness.LoopLag`); each says both in its heartbeat, and zombie-detector reads
  every service's (and its own, each second). A service is behind while the newest sample it
  handled is older than `after_s` and more wait, or while its loop has been later than
  `loop_lag_s` for `LOOP_LATE_FOR_S` (one collection pause is no starvation); it is caught up
  again below half of either. While any is
  behind there is one incident (on the node `control-plane`, keyed `samples`) saying which
  services are behind, by how much, since when, and what each does not judge meanwhile; a service
  that falls behind while it is open is news to it (an occurrence), and it resolves once every
  service has caught up.
- samples_lost: each sampler counts the samples the bus did not acknowledge and says so in its
  next sample (`NodeSampled.unacknowledged`). Losses on `min_nodes` nodes within `window_s` are
  one incident (keyed `bus`), never node incidents: the bus drops what it cannot store, or was
  away, and while it lasts no node is judged silent.

Both resolve by themselves; a person is told, since nothing gpumedic can run makes its own
control plane faster.
"""

from __future__ import annotations

import uuid
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime

from gpumedic_bus.topology import CONTROL_PLANE_NODE
from gpumedic_events import ConsumerLag, IncidentKind, ServiceHeartbeat
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, fingerprint
from gpumedic_incidents.policy import BehindPolicy, SamplesLostPolicy
from zombie_detector.rules.base import Incidents

BEHIND = IncidentKind.CONTROL_PLANE_BEHIND
LOST = IncidentKind.SAMPLES_LOST
LOST_FINGERPRINT = fingerprint(CONTROL_PLANE_NODE, LOST, None, "bus")

NOT_JUDGED = {
    "zombie-detector": "it judges no node silent meanwhile (a late sample is no silent node), and each node's count starts afresh once it has caught up",
    "autoscaler": "it scales on no sample meanwhile (it holds its workers as they are), and its idle clocks start afresh once it has caught up",
}
NOT_TIMED = {
    "zombie-detector": "it judges no node silent meanwhile, and each node's count starts afresh once its loop keeps up",
    "remediator": "an SSH login that times out meanwhile counts neither way (no ssh_unreachable from it)",
    "leader-health": "no peer is judged slow, blocked or unreachable by a probe round meanwhile",
}
"""What each service that times something does not judge while its own loop is late."""


BEHIND_FINGERPRINT = fingerprint(CONTROL_PLANE_NODE, BEHIND, None, "samples")


class BehindRule:
    inputs = (ServiceHeartbeat,)

    def __init__(self, policy: BehindPolicy) -> None:
        self.policy = policy
        self.lags: dict[tuple[str, uuid.UUID], Heard] = {}
        """Each instance's worst consumer lag and its loop's lateness, as it last said (standbys consume nothing)."""
        self.behind: dict[str, tuple[datetime, Heard]] = {}
        """Each service behind now: since when, and its worst as last heard."""

    def observe(self, event: ServiceHeartbeat, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        service, instance = event.service, (event.service, event.instance_id)
        if event.state != "ready":
            self.lags.pop(instance, None)
        elif event.lag or event.loop_lag_s is not None:
            self.lags[instance] = self._heard(event, self.lags.get(instance), now)
        else:
            return []
        heard = [h for (s, _), h in self.lags.items() if s == service and (now - h.at).total_seconds() <= HEARD_WITHIN_S]
        worst = max(heard, key=lambda h: h.lag.behind_s if h.lag is not None else 0.0, default=None)
        was = service in self.behind
        samples = worst is not None and worst.lag is not None and (
            worst.lag.behind_s > self.policy.after_s or was and worst.lag.behind_s >= self.policy.after_s / 2)
        late = [h for h in heard if h.late_since is not None and (now - h.late_since).total_seconds() >= LOOP_LATE_FOR_S]
        joined = False
        if samples or late:
            joined = not was
            said = Heard(worst.lag if samples else None, max((h.loop_lag_s for h in late), default=0.0), None, now)
            self.behind[service] = (self.behind[service][0] if was else now, said)
        else:
            self.behind.pop(service, None)
        is_open = incidents.get(BEHIND_FINGERPRINT) is not None
        if self.behind:
            return [self._finding(occurrence=joined and is_open)]
        if is_open:
            return [Finding(BEHIND, CONTROL_PLANE_NODE, key="samples", present=False, summary="every service has caught up with its samples "
                            "and its own loop")]
        return []

    def _heard(self, event: ServiceHeartbeat, before: Heard | None, now: datetime) -> Heard:
        """What this heartbeat adds to what the instance said before: a heartbeat without its loop's
        word (the detector's own, between its real ones) keeps the last."""
        lag = max(event.lag, key=lambda lag: lag.behind_s, default=None)
        if event.loop_lag_s is None:
            return Heard(lag, before.loop_lag_s, before.late_since, now) if before is not None else Heard(lag, 0.0, None, now)
        late_since = before.late_since if before is not None else None
        if event.loop_lag_s > self.policy.loop_lag_s:
            late_since = late_since or now
        elif event.loop_lag_s < self.policy.loop_lag_s / 2:
            late_since = None
        return Heard(lag, event.loop_lag_s, late_since, now)

    def _finding(self, *, occurrence: bool) -> Finding:
        said, evidence = [], {"services": ", ".join(self.behind)}
        for service, (since, heard) in self.behind.items():
            since_text = since.isoformat(timespec="seconds")
            if heard.lag is not None:
                lag = heard.lag
                said.append(f"{service} is {lag.behind_s:.0f}s behind its samples ({lag.pending:,} waiting on {lag.durable}) "
                            f"since {since_text}; {NOT_JUDGED.get(service, 'it acts on no sample meanwhile')}")
                evidence |= {f"{service}.behind_s": round(lag.behind_s, 1), f"{service}.pending": lag.pending}
            if heard.loop_lag_s:
                said.append(f"{service}'s own event loop runs {heard.loop_lag_s:.1f}s late since {since_text}; "
                            f"{NOT_TIMED.get(service, 'what it times meanwhile may be its own lateness')}")
                evidence |= {f"{service}.loop_lag_s": round(heard.loop_lag_s, 2)}
            evidence |= {f"{service}.since": since_text}
        return Finding(
            kind=BEHIND, node_id=CONTROL_PLANE_NODE, key="samples", severity="warning", summary="; and ".join(said),
            evidence=evidence, occurrence=occurrence,
            recommended_action=f"give {', '.join(self.behind)} more CPU, or fewer nodes per instance; look at what else runs on "
                               "its machine (gpumedic report, the services' CPU, gpumedic_event_loop_lag_seconds on /metrics)",
        )

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return []


@dataclass(frozen=True)
class Heard:
    """What one instance's heartbeat said of its lateness."""

    lag: ConsumerLag | None
    """Its sample consumer furthest behind (None: it consumes none)."""
    loop_lag_s: float
    """Its event loop's worst lateness in the heartbeat's window."""
    late_since: datetime | None
    """Since when its loop has been later than the policy's `loop_lag_s` (below half of it: no more)."""
    at: datetime


LOOP_LATE_FOR_S = 5.0
"""A loop late for this long is starved, not paused once by a collection."""


HEARD_WITHIN_S = 30.0
"""An instance not heard from for this long (stopped, or taken over) no longer counts."""


class SamplesLostRule:
    inputs = (Sample,)
    judges_arrivals = True

    def __init__(self, policy: SamplesLostPolicy) -> None:
        self.policy = policy
        self.counts: dict[str, int] = {}
        """Each node's count of samples the bus did not take, as its last sample said."""
        self.losses: deque[tuple[datetime, str, int]] = deque()
        """(when, node, how many) of the losses within the window."""
        self.total = 0
        """Samples the nodes said the bus did not take, since this detector started."""

    def observe(self, event: Sample, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        before = self.counts.get(event.node_id)
        self.counts[event.node_id] = event.unacknowledged
        if before is None or event.unacknowledged <= before:
            return []  # the first word of this node, or a sampler that restarted: no loss seen
        self.losses.append((now, event.node_id, event.unacknowledged - before))
        self.total += event.unacknowledged - before
        return self._judge(now, incidents)

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return self._judge(now, incidents)

    def _judge(self, now: datetime, incidents: Incidents) -> list[Finding]:
        while self.losses and (now - self.losses[0][0]).total_seconds() > self.policy.window_s:
            self.losses.popleft()
        nodes = {node for _, node, _ in self.losses}
        if len(nodes) >= self.policy.min_nodes:
            lost = sum(n for _, _, n in self.losses)
            return [Finding(
                kind=LOST, node_id=CONTROL_PLANE_NODE, key="bus", severity="warning",
                summary=f"the bus did not acknowledge {lost:,} sample(s) of {len(nodes):,} node(s) in the last {self.policy.window_s:g}s "
                        "(they say so in their next samples): what the control plane judges misses them, and no node is judged "
                        "silent meanwhile",
                evidence={"nodes": len(nodes), "samples": lost, "window_s": self.policy.window_s, "example_node": min(nodes)},
                recommended_action="look at the nats-server's log (\"Dropping messages\", slow consumers) and its CPU, memory and "
                                   "network; a server that restarted drops what comes while it starts",
            )]
        if not self.losses and incidents.get(LOST_FINGERPRINT) is not None:
            return [Finding(LOST, CONTROL_PLANE_NODE, key="bus", present=False, summary="the nodes' samples are acknowledged again")]
        return []
