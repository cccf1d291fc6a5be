"""Burn-in: with `kinds.burn_in.required`, a newly rented worker is capacity only once it passes
the policy's acceptance checks. Pure.

A worker is on trial from the round it is first listed running. Those running at the autoscaler's
first round are taken as they are (accepted before a restart, or rented before burn-in was asked
for), unless a `burn_in` incident is still open on them. While on trial a worker counts for the
scaling decision as a spawning one does (so no second worker is rented in its place), but it is
never in service and never released as idle.

1. Its samples first, the figures the GPU-health rules read: as many GPUs as were rented, none
   lost, no uncorrectable ECC error, no row remap pending or failed, every PCIe link at its full
   width (its generation drops at idle by design, so only the width counts), no NVLink down; and
   host memory and disk headroom above the policy's floor. A sample with these figures (the
   sampler sends them in a node's first sample) that shows none of it passes.
2. Then a `burn_in` incident (informational) asks the remediator for `accept_worker`: pre-flight
   on the node (each GPU free and healthy) and DCGM's diagnostic where installed, then the policy's
   `actions.accept_worker.statement` in the task database (the runbook's promotion of a worker
   from `spawning` to `active`, so the user's workers take tasks only once it is accepted). Its
   success accepts the worker.
3. A sample that shows a fault, an acceptance the remediator failed, or none within `within_s` of
   the worker coming up: `burn_in_failed`, and the worker is ended and replaced. That incident is
   counted against its machine as any other (`autoscaler.offenders`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from autoscaler.lifecycle import worker_evidence
from gpumedic_events import AcceptWorker, GpuHealth, IncidentKind, TerminateWorker
from gpumedic_events.views import SampleLoad
from gpumedic_incidents import Finding
from gpumedic_incidents.policy import BurnInPolicy
from gpumedic_providers.base import Worker


@dataclass
class _Look:
    """What a worker's samples said so far: each GPU's last health figures, and the last sample's faults."""

    gpus: int
    health: dict[int, GpuHealth] = field(default_factory=dict)
    faults: list[str] = field(default_factory=list)


class Trials:
    def __init__(self, policy: BurnInPolicy) -> None:
        self.policy = policy
        self.started: dict[str, datetime] = {}
        """Workers on trial -> when it began (first listed running)."""
        self.accepted: set[str] = set()
        self.failed: dict[str, str] = {}
        """Workers that failed -> why."""
        self.refused: dict[str, str] = {}
        """Workers on trial whose acceptance the remediator did not run -> what it said (kept for the failure)."""
        self._looks: dict[str, _Look] = {}
        self._coming: set[str] = set()
        """Workers listed but not yet on trial (spawning): their first sample, which carries the
        health figures, may come before the round that sees them running."""
        self._first_round = True

    @property
    def required(self) -> bool:
        return self.policy.required

    # --- inputs --------------------------------------------------------------------------------

    def on_sample(self, sample: SampleLoad) -> None:
        """A sample of a worker on trial or coming up (any other node's is not kept)."""
        if sample.node_id not in self.started and sample.node_id not in self._coming:
            return
        look = self._looks.setdefault(sample.node_id, _Look(len(sample.gpus)))
        look.gpus = len(sample.gpus)
        for g in sample.gpus:
            if g.health is not None:
                look.health[g.index] = g.health
        look.faults = faults(sample, look.health, self.policy)

    def accept(self, worker_id: str) -> None:
        self.started.pop(worker_id, None)
        self._looks.pop(worker_id, None)
        self.accepted.add(worker_id)

    def refuse(self, worker_id: str, why: str) -> None:
        if worker_id in self.started:
            self.refused[worker_id] = why[:300]

    def fail(self, worker_id: str, why: str) -> None:
        if worker_id in self.started:
            self.started.pop(worker_id)
            self._looks.pop(worker_id, None)
            self.failed[worker_id] = why[:900]

    # --- the round -----------------------------------------------------------------------------

    def round(self, workers: list[Worker], now: datetime, *, open_trials: set[str], returned: set[str] = frozenset(),
              provider: str = "") -> list[Finding]:
        """The burn-in findings of this round's workers; `open_trials` are the workers with a
        burn_in incident open (taken back after a restart), `returned` those on a machine that is
        given back whatever they would show (a repeat offender's): no trial for them."""
        if not self.required:
            return []
        running = {w.worker_id: w for w in workers if w.status == "running" and w.worker_id not in returned}
        for worker_id in running:
            if worker_id in self.accepted or worker_id in self.failed or worker_id in self.started:
                continue
            if self._first_round and worker_id not in open_trials:
                self.accepted.add(worker_id)
            else:
                self.started[worker_id] = now
        self._first_round = False
        listed = {w.worker_id for w in workers}
        self._coming = {w.worker_id for w in workers if w.status == "spawning"}
        for gone in [w for w in (*self.started, *self.failed, *self.accepted) if w not in listed or w in returned]:
            self.started.pop(gone, None)  # a returned worker is ended as a repeat offender's: no trial, no second ending
            self.failed.pop(gone, None)
            self.accepted.discard(gone)
        self.refused = {w: why for w, why in self.refused.items() if w in self.started}
        for forgotten in set(self._looks) - set(self.started) - self._coming:
            del self._looks[forgotten]
        found = []
        for worker_id, since in list(self.started.items()):
            w = running[worker_id]
            look = self._looks.get(worker_id)
            if look is not None and (why := self._sample_faults(look, w)):
                self.fail(worker_id, why)
            elif now - since > timedelta(seconds=self.policy.within_s):
                refused = self.refused.get(worker_id)
                self.fail(worker_id, f"not accepted within {self.policy.within_s:g}s of coming up"
                          + (" (no sample from it)" if look is None else f" (the remediator: {refused})" if refused else ""))
            elif look is not None and len(look.health) >= w.gpus:
                found.append(Finding(
                    kind=IncidentKind.BURN_IN, node_id=worker_id, severity="info",
                    summary=f"{worker_id} on trial: its samples pass; the on-node acceptance checks next",
                    evidence=worker_evidence(w, now, provider), operations={"accept_worker": AcceptWorker()},
                    recommended_action="accept it once pre-flight and DCGM's diagnostic pass",
                ))
        for worker_id, why in self.failed.items():
            w = running.get(worker_id) or next(x for x in workers if x.worker_id == worker_id)
            found.append(Finding(
                kind=IncidentKind.BURN_IN_FAILED, node_id=worker_id, summary=f"{worker_id} failed its burn-in: {why}",
                evidence={**worker_evidence(w, now, provider), "why": why},
                operations={"terminate_worker": TerminateWorker(worker_ids=(worker_id,))},
                recommended_action="end it and rent another; it never got a task",
            ))
        return found

    def on_trial(self) -> set[str]:
        """Workers that may not take tasks yet, or never will."""
        return set(self.started) | set(self.failed)

    def _sample_faults(self, look: _Look, w: Worker) -> str:
        problems = list(look.faults)
        if look.gpus != w.gpus:
            problems.insert(0, f"{look.gpus} GPU(s) seen of the {w.gpus} rented")
        return "; ".join(problems[:8])


def faults(sample: SampleLoad, health: Mapping[int, GpuHealth], policy: BurnInPolicy) -> list[str]:
    """What in one sample (with each GPU's last health figures) disqualifies a new worker."""
    out = []
    for g in sample.gpus:
        name = f"GPU {g.index}"
        if g.lost:
            out.append(f"{name} is lost")
        if g.ecc_uncorrected_volatile:
            out.append(f"{name} has {g.ecc_uncorrected_volatile} uncorrectable ECC error(s)")
        if g.remapped_rows_failed:
            out.append(f"{name} failed a row remap")
        elif g.remapped_rows_pending:
            out.append(f"{name} has a row remap pending")
        h = health.get(g.index)
        if h is not None and h.pcie_link_width is not None and h.pcie_link_width_max and h.pcie_link_width < h.pcie_link_width_max:
            out.append(f"{name} PCIe link x{h.pcie_link_width} of x{h.pcie_link_width_max}")
        down = [str(link.link) for link in (h.nvlinks if h is not None else ()) if not link.up]
        if down:
            out.append(f"{name} NVLink {', '.join(down)} down")
    host = sample.host
    if host is not None and host.memory_total_mib and host.memory_available_mib is not None:
        pct = 100 * host.memory_available_mib / host.memory_total_mib
        if pct < policy.min_available_memory_pct:
            out.append(f"{pct:.0f}% of host memory available (under {policy.min_available_memory_pct:g}%)")
    for disk in host.disks if host is not None else ():
        free_gib = disk.available_bytes / 2**30
        if free_gib < policy.min_free_disk_gib:
            out.append(f"{free_gib:.1f} GiB free on {disk.path} (under {policy.min_free_disk_gib:g} GiB)")
    return out
