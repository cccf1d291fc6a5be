"""What the node as a whole shows: its sampler gone quiet, NVML gone, SSH out of reach.

- node_silent: no sample for `after_intervals` of the node's own interval (`busy_after_intervals`
  when its last sample said it runs late: ticks missed, taken late, its CPUs pressed; a busy
  node's sampler waits for a CPU, and late is not dead), measured against the
  freshest sample the detector has from any node, not its wall clock: when the detector's own bus
  connection drops, every node's samples stop at once and none of them is silent for that; when
  samples resume after such a gap, every node's count starts again from then. Nor is a node
  silent while the detector itself is behind its samples by more than the node's interval (its
  own heartbeat's lag): a sample it has not been given yet is no silence; once it has caught up
  (below half of `control_plane_behind.after_s`), every node's count starts again from then;
  the same while its own event loop runs later than `gpumedic_bus.lateness.LAGGING_AFTER_S`;
  and none while the bus is known to drop samples (`samples_lost` open). Every sample
  while it is open clears it (a clear that lands while the restart is in flight is not taken).
  Several nodes at once is one fleet incident, as for any kind; a whole fleet gone quiet
  together cannot be told apart from the detector losing the bus, and is left to the services'
  heartbeats.
- nvml_unavailable: the sampler cannot use NVML at all (the driver is missing or broken): the
  node's GPUs are invisible, so nothing on them can be judged.
- ssh_unreachable: the remediator's read-only login failed `after_checks` times in a row; the
  cause (refused, timeout, auth refused, host key changed) is the runbook's next step.

Neither opens for a node gpumedic itself stopped or rebooted (`Incidents.acted_on`: the windows
of its work-ending actions there, whatever their incidents did since), until `QUIET_AFTER_ACTION`
after the action's end: a node quiet since before the action, or still quiet after, is judged.

A retired node (a worker the pool ended: NodeRetired) is forgotten: its silence is its end.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec
from gpumedic_bus.lateness import LAGGING_AFTER_S

from gpumedic_events import Diagnosis, IncidentKind, NodeRetired, NodeSshChecked, RestartUnit, ServiceHeartbeat
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import BehindPolicy, SilentPolicy, SshPolicy
from zombie_detector.rules.base import BUSY_PRESSURE_PCT, Incidents, NodeId, busy, late_s
from zombie_detector.rules.control_plane import LOST_FINGERPRINT

SILENT = IncidentKind.NODE_SILENT
NVML = IncidentKind.NVML_UNAVAILABLE
SSH = IncidentKind.SSH_UNREACHABLE

SSH_STEPS = {
    "refused": "nothing listens on the SSH port: is sshd running, is the port right in the inventory?",
    "timeout": "the port does not answer: a firewall, a dead host, or a wedged sshd",
    "auth_refused": "the node refused the remediator's key or user: check authorized_keys and the inventory's user",
    "host_key_changed": "the node's host key is not the one trusted: a reinstalled node, or someone else answering; check before trusting it",
    "unreachable": "the network path to the node fails",
    "not_in_inventory": "the node samples but is not in the remediator's inventory: add it",
}


class LastSample(msgspec.Struct, frozen=True):
    """When a node's last sample came, by the detector's clock, and its interval (the rule's memory)."""

    node: NodeId
    at: datetime
    interval_s: Annotated[float, msgspec.Meta(gt=0)]


class NodeRule:
    inputs = (Sample, NodeSshChecked, NodeRetired, ServiceHeartbeat)
    entry = LastSample
    of_events = False
    judges_arrivals = True
    """Silence is nothing arriving: timed on arrival (`zombie_detector.clocks.by_arrival`)."""

    def __init__(self, silent: SilentPolicy, ssh: SshPolicy, *, behind: BehindPolicy | None = None, service: str = "zombie-detector") -> None:
        self.silent = silent
        self.ssh = ssh
        self.caught_up_below_s = (behind or BehindPolicy()).after_s / 2
        self.service = service
        self.behind_s = 0.0
        """How far behind its samples the detector itself is (its own heartbeat)."""
        self.loop_lag_s = 0.0
        """How late the detector's own event loop runs (its own heartbeat): past LAGGING_AFTER_S it
        cannot tell a silent node from its own starvation, and judges none."""
        self.last_sample: dict[str, tuple[datetime, float, float]] = {}
        """When each node's last sample came (the detector's clock), its interval, and how
        many intervals it may stay quiet (more when it said it was late or its CPUs were pressed)."""
        self.freshest: datetime | None = None
        """The newest sample from any node: the detector's view of the bus."""
        self.resumed_at: datetime | None = None
        """When samples came again after nothing arrived from anyone (the bus was away)."""
        self.none_due_until: datetime | None = None
        """No node is overdue before the freshest sample passes this (None: look at every node at
        the next tick): a node's count only moves later, so the tick looks at every node only
        then, not each second (at 10,000 nodes, a tenth of the rules' work on a sample)."""

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, ServiceHeartbeat):
            if event.service == self.service and event.state == "ready" and event.lag:  # a standby consumes nothing
                behind_s = max((lag.behind_s for lag in event.lag), default=0.0)
                loop_lag_s = self.loop_lag_s if event.loop_lag_s is None else event.loop_lag_s
                was_late = self.behind_s > self.caught_up_below_s or self.loop_lag_s > LAGGING_AFTER_S
                if was_late and behind_s <= self.caught_up_below_s and loop_lag_s <= LAGGING_AFTER_S:
                    self.resumed_at = now  # caught up: every node's count starts again from now
                self.behind_s, self.loop_lag_s = behind_s, loop_lag_s
            return []
        if isinstance(event, NodeSshChecked):
            return self._ssh(event, now, incidents)
        if isinstance(event, NodeRetired):
            self.last_sample.pop(event.node_id, None)
            return []  # the book closes what was open on it
        previous = self.last_sample.get(event.node_id)
        gap = self.freshest is not None and now - self.freshest > timedelta(seconds=self.silent.after_intervals * event.interval_s)
        if gap:  # nothing from anyone for a while: the bus was away; every node's count restarts now
            self.resumed_at = now
        self.freshest = now if self.freshest is None else max(self.freshest, now)
        patience = self.silent.busy_after_intervals if busy(event) else self.silent.after_intervals
        self.last_sample[event.node_id] = (now, event.interval_s, patience)
        if previous is None or previous[1:] != (event.interval_s, patience):
            self.none_due_until = None  # a new node, or a new interval: it may be due sooner than all the others
        findings: list[Finding] = []
        # Every sample while the incident is open clears it, not only the first: a clear that lands
        # while the restart is still in flight is not taken, and the next one must verify the fix.
        came_back = previous is not None and now - previous[0] > timedelta(seconds=previous[2] * previous[1])
        if came_back or any(i.kind is SILENT for i in incidents.open_on(event.node_id)):
            findings.append(Finding(SILENT, event.node_id, present=False, summary="the node samples again" + _late(event)))
        if event.nvml_error:
            findings.append(
                Finding(
                    kind=NVML,
                    node_id=event.node_id,
                    summary=f"the node's sampler cannot use NVML: {event.nvml_error}",
                    evidence={"nvml_error": event.nvml_error},
                    severity="critical",
                    recommended_action="check the driver on the node (nvidia-smi, dmesg); reinstall or reload it, then reboot if needed",
                )
            )
        elif any(i.kind is NVML for i in incidents.open_on(event.node_id)):
            findings.append(Finding(NVML, event.node_id, present=False, summary="NVML answers again"))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if self.freshest is None:
            return []
        findings = []
        if incidents.get(LOST_FINGERPRINT) is not None:
            return []  # the bus drops samples: a missing one says nothing of its node
        if self.loop_lag_s > LAGGING_AFTER_S:
            return []  # the judge is starved: a sample it has not handled yet is no silence
        if self.none_due_until is not None and self.freshest <= self.none_due_until:
            return []
        due_first = None
        for node_id, (seen, interval, patience) in self.last_sample.items():
            counted_from = max(seen, self.resumed_at) if self.resumed_at is not None else seen
            due = counted_from + timedelta(seconds=patience * interval)
            if (own := _quiet_of_our_doing(incidents.acted_on(node_id), seen)) is not None:
                due = max(due, own)  # gpumedic stopped or rebooted what it runs: quiet is expected a while
            due_first = due if due_first is None or due < due_first else due_first
            if self.behind_s > interval:
                continue  # its next sample may wait in the stream, unseen
            if self.freshest > due:
                quiet = (now - seen).total_seconds()
                findings.append(
                    Finding(
                        kind=SILENT,
                        node_id=node_id,
                        summary=f"no sample from the node for {quiet:.0f}s ({quiet / interval:.0f} of its {interval:g}s intervals)",
                        evidence={"silent_s": round(quiet, 1), "interval_s": interval},
                        recommended_action="check the node-sampler on the node (its service, its log) and the node itself (ping, SSH)",
                        # If the node answers SSH, the sampler's unit is restarted; if not, the action fails and a person is paged.
                        operations={"restart_unit": RestartUnit(unit=self.silent.sampler_unit)},
                    )
                )
        self.none_due_until = due_first
        return findings

    def remember(self) -> list[LastSample]:
        return [LastSample(node, at, interval) for node, (at, interval, _) in self.last_sample.items()]

    def recall(self, entries: Sequence[LastSample], now: datetime) -> None:
        """The nodes an earlier instance saw, so one that fell silent before the takeover is still
        judged; every count starts from the takeover, as after the bus was away."""
        for entry in entries:
            self.last_sample.setdefault(entry.node, (min(entry.at, now), entry.interval_s, self.silent.after_intervals))
        self.resumed_at = now
        self.none_due_until = None

    def _ssh(self, event: NodeSshChecked, now: datetime, incidents: Incidents) -> list[Finding]:
        if event.reachable:
            if any(i.kind is SSH for i in incidents.open_on(event.node_id)):
                return [Finding(SSH, event.node_id, present=False, summary="the remediator logs in again")]
            return []
        if event.failures < self.ssh.after_checks:
            return []
        if any(start <= now <= end + QUIET_AFTER_ACTION for start, end in incidents.acted_on(event.node_id)):
            return []  # a login refused while gpumedic reboots or stops the node is its own doing
        step = SSH_STEPS.get(event.cause, "")
        return [
            Finding(
                kind=SSH,
                node_id=event.node_id,
                summary=f"the remediator cannot log in: {event.cause} ({event.detail}), {event.failures} checks in a row",
                evidence={"cause": event.cause, "detail": event.detail, "failures": event.failures},
                diagnosis=Diagnosis(cause=event.cause, confidence=0.9, explanation=event.detail or event.cause, remedies=(step,) if step else ()),
                recommended_action=step,
            )
        ]


QUIET_AFTER_ACTION = timedelta(minutes=5)
"""How long after a work-ending action of gpumedic's own (a reboot, a job's stop: `book.RecentActions`)
ends a node may stay quiet, or refuse SSH, before it is silent or unreachable: a reboot takes minutes."""


def _quiet_of_our_doing(windows: list[tuple[datetime, datetime]], seen: datetime) -> datetime | None:
    """Until when a node quiet since `seen` may be so by gpumedic's own action (None: no action of
    ours explains it; one asked for after it fell quiet does not)."""
    ends = [end + QUIET_AFTER_ACTION for start, end in windows if start <= seen]
    return max(ends, default=None)


def _late(sample: Sample) -> str:
    """What the sample that ends a quiet spell says of it: a late node, not a silent one."""
    said = []
    if sample.missed_ticks:
        said.append(f"its sampler missed {sample.missed_ticks} tick(s)")
    if (late := late_s(sample)) > sample.interval_s / 2:
        said.append(f"was {late:.0f}s late")
    if (pressure := sample.sampler_cpu_pressure or sample.host.cpu_pressure) is not None and pressure.some_avg10_pct >= BUSY_PRESSURE_PCT:
        said.append(f"its CPUs are pressed ({pressure.some_avg10_pct:.0f}% of the last 10 s waiting)")
    return f": {', '.join(said)}; late, not silent" if said else ""
