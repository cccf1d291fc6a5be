"""Repeat offenders: the hosts that keep failing. Pure.

Every incident any detector opens is counted against its host: for a rented worker, the
provider's machine it runs on (its `host_id`, RunPod's machineId), so a machine is known again
when it is rented under a new pod id; for any other node, the node itself. When a host's incidents
of one kind meet a rule of `kinds.repeat_offender.rules` (the first that it meets: by default two
GPU hardware faults within a week, or any one kind three times within an hour, a fix that does not
hold), it is a `repeat_offender` on each node it runs now:

- a rented worker on it is drained and ended, and the pool rents a replacement (it is no capacity
  from the moment it is found). While the rule holds, a later rental that lands on the machine is
  found the round it is listed and returned at once: a provider's API that cannot choose machines
  (RunPod's cannot) still never gets work onto it.
- an owned node is drained, then goes to a person (the ladder's terminate step is not one it has).
  It returns only when its incidents have aged out of the window and its GPUs then validate.

Kinds about the fleet, the pool or the cluster as a whole are no host's doing and never counted;
nor are informational incidents, nor those opened as part of a fleet incident (one cause on many
hosts), nor those opened while the control plane said it was behind (`control_plane_behind` open:
what it judged then may be its own lateness), nor those a person marked a false positive. Many hosts offending in one round are themselves one fleet incident and no node action
(the book's fleet correlation), as any kind is.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from autoscaler.lifecycle import span, worker_evidence
from gpumedic_events import WHOLE_KINDS, IncidentKind, IncidentMarked, IncidentOpened, IncidentResolved, TerminateWorker
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import RepeatPolicy, RepeatRule
from gpumedic_providers.base import Worker

MAX_SEEN = 100_000
"""Incidents remembered at most (the oldest go first): a bound on memory whatever the stream holds."""
BEHIND_FORGOTTEN = timedelta(hours=6)
"""A control_plane_behind incident whose resolution was never heard counts no longer than this."""
MAX_LISTED = 20
"""Incident ids, nodes and GPUs named in the evidence, at most."""


@dataclass(frozen=True)
class Seen:
    """One incident as it counts: what, where, when."""

    incident_id: uuid.UUID
    kind: IncidentKind
    node_id: str
    gpu_index: int | None
    at: datetime
    host_id: str | None
    """The machine, where the incident's evidence named one (the pool's own worker incidents do)."""


class RepeatOffenders:
    def __init__(self, policy: RepeatPolicy) -> None:
        self.rules = policy.rules
        self._horizon = timedelta(seconds=max((r.window_s for r in self.rules), default=0))
        self._seen: dict[uuid.UUID, Seen] = {}
        self._behind: dict[uuid.UUID, datetime] = {}
        """The control_plane_behind incidents open now, and since when: what opens meanwhile is not counted."""
        self._false: dict[uuid.UUID, None] = {}
        """Incidents a person marked a false positive (kept, bounded, for a mark replayed before its incident)."""
        self.known: Callable[[], bool] = lambda: True
        """Whether the history of incidents has been read (the service replays it once ready): until
        it has, nothing is judged, and what was found before stays as it was."""
        self.machines: dict[str, str] = {}
        """Rented workers -> the machine each ran on ('' where the provider named none): those listed
        now, and those gone whose incidents are still counted."""

    # --- inputs --------------------------------------------------------------------------------

    def learn(self, workers: list[Worker], now: datetime) -> None:
        """The provider's workers this round: where each runs."""
        self._forget(now)
        counted = {s.node_id for s in self._seen.values()}
        listed = {w.worker_id: w.host_id or "" for w in workers}
        self.machines = {w: m for w, m in self.machines.items() if w in counted} | listed

    def on_opened(self, event: IncidentOpened) -> None:
        """An incident any detector opened (replayed from the stream at start, then followed)."""
        self._behind = {i: at for i, at in self._behind.items() if event.occurred_at - at < BEHIND_FORGOTTEN}
        if event.kind is IncidentKind.CONTROL_PLANE_BEHIND:
            self._behind[event.incident_id] = event.occurred_at
            return
        if self._behind or event.incident_id in self._false:
            return  # found while the control plane was behind, or a person said it was wrong
        if (event.kind in WHOLE_KINDS or event.kind is IncidentKind.REPEAT_OFFENDER or event.severity == "info" or not self.rules
                or event.related_incident_id is not None):  # part of a fleet incident: one cause for many hosts
            return
        host = event.evidence.get("host_id")
        self._seen[event.incident_id] = Seen(
            event.incident_id, event.kind, event.node_id, event.gpu_index, event.occurred_at, host if isinstance(host, str) and host else None,
        )
        if len(self._seen) > MAX_SEEN:
            del self._seen[min(self._seen.values(), key=lambda s: s.at).incident_id]

    def on_resolved(self, event: IncidentResolved) -> None:
        self._behind.pop(event.incident_id, None)

    def on_marked(self, event: IncidentMarked) -> None:
        """A person's verdict: a false positive counts against no host."""
        if event.verdict == "false_positive":
            self._seen.pop(event.incident_id, None)
            self._false[event.incident_id] = None
            if len(self._false) > MAX_SEEN:
                del self._false[next(iter(self._false))]

    def _forget(self, now: datetime) -> None:
        """Incidents older than every rule's window count no more."""
        for incident_id in [s.incident_id for s in self._seen.values() if now - s.at > self._horizon]:
            del self._seen[incident_id]

    # --- findings ------------------------------------------------------------------------------

    def host_of(self, seen: Seen) -> str:
        """The machine of a rented worker's incident, else its node."""
        return seen.host_id or self.machines.get(seen.node_id) or seen.node_id

    def offending(self, now: datetime) -> dict[str, list[tuple[RepeatRule, list[Seen]]]]:
        """Host -> each kind of its incidents that meets a rule: (the rule, those incidents)."""
        self._forget(now)
        grouped: dict[tuple[str, IncidentKind], list[Seen]] = {}
        for s in self._seen.values():
            grouped.setdefault((self.host_of(s), s.kind), []).append(s)
        out: dict[str, list[tuple[RepeatRule, list[Seen]]]] = {}
        for (host, kind), seen in sorted(grouped.items()):
            for rule in self.rules:
                if rule.kinds and kind not in rule.kinds:
                    continue
                within = sorted((s for s in seen if now - s.at <= timedelta(seconds=rule.window_s)), key=lambda s: s.at)
                if len(within) >= rule.count:
                    out.setdefault(host, []).append((rule, within))
                    break
        return out

    def findings(self, now: datetime, live: Mapping[str, Worker], present: set[str], *, provider: str = "") -> list[Finding] | None:
        """A finding on every node that runs on an offending host now: the rented workers listed
        (`live`) on its machine, or the host itself when it is a node that sampled lately
        (`present`) and no worker of the pool (an owned node). None while the history is unread:
        nothing can be told yet, neither way."""
        if not self.known():
            return None
        on_machine: dict[str, list[Worker]] = {}
        for w in live.values():
            if w.host_id:
                on_machine.setdefault(w.host_id, []).append(w)
        found = []
        for host, offences in self.offending(now).items():
            if host in on_machine:
                targets = [(w.worker_id, w) for w in on_machine[host]]
            elif host in live:
                targets = [(host, live[host])]
            elif host in present and host not in self.machines:
                targets = [(host, None)]
            else:
                continue  # not running now (a machine of the pool between rentals: avoided when rented again)
            for rule, seen in offences:
                for node_id, worker in targets:
                    found.append(_finding(host, node_id, worker, rule, seen, provider, now))
        return found


def _finding(host: str, node_id: str, worker: Worker | None, rule: RepeatRule, seen: list[Seen], provider: str, now: datetime) -> Finding:
    kind = seen[0].kind
    nodes = sorted({s.node_id for s in seen})
    gpus = sorted({s.gpu_index for s in seen if s.gpu_index is not None})
    window = span(rule.window_s)
    where = f"machine {host}" if worker is not None else host
    elsewhere = [n for n in nodes if n != node_id]
    summary = (f"{where} had {len(seen)} {kind.value} incidents within {window}"
               + (f" (GPU {', '.join(map(str, gpus))})" if gpus else "")
               + (f", also under {', '.join(elsewhere[:5])}" if elsewhere else "")
               + (f": {node_id} runs on it" if worker is not None else ""))
    evidence = {
        "host_id": host, "counted_kind": kind.value, "count": len(seen), "rule_count": rule.count, "window_s": rule.window_s,
        "incidents": ", ".join(str(s.incident_id) for s in seen[-MAX_LISTED:]), "nodes": ", ".join(nodes[:MAX_LISTED]),
        "gpu_indexes": ", ".join(map(str, gpus[:MAX_LISTED])), "first_at": seen[0].at.isoformat(timespec="seconds"),
    }
    if worker is not None:
        evidence = {**worker_evidence(worker, now, provider), **evidence}
        return Finding(
            kind=IncidentKind.REPEAT_OFFENDER, node_id=node_id, key=kind.value, summary=summary, evidence=evidence,
            operations={"terminate_worker": TerminateWorker(worker_ids=(node_id,))},
            recommended_action=f"end {node_id} and rent elsewhere; tell the provider about machine {host} (gpumedic report reliability)",
        )
    return Finding(
        kind=IncidentKind.REPEAT_OFFENDER, node_id=node_id, key=kind.value, summary=summary, evidence=evidence,
        recommended_action=f"keep {node_id} drained and have its {'GPU ' + ', '.join(map(str, gpus)) if gpus else 'hardware'} "
                           "looked at; it returns once these incidents are older than the window and its GPUs validate",
    )

