"""gpu_xid (and gpu_lost for XID 79): what the driver's XID errors say about a GPU.

Every XID is remembered per GPU for `history_s`, with the job that held the GPU when it came
(from the node's last sample), because the catalogue's meaning depends on history
(`gpumedic_events.xid`):

- reset_gpu and reboot XIDs point at the GPU: one incident per GPU, whose repeats (a storm)
  count on it; XID 79 means the GPU fell off the bus and is a gpu_lost incident;
- those NVIDIA's catalogue says to ignore open nothing; those it sends to support (or names no
  action for) are a person's, never drained or reset on a guess;
- application XIDs (13, 31, 43, ...) are the job's fault and open nothing, unless they repeat on
  the same GPU under `repeat_jobs` different jobs: then the GPU is the common factor;
- XID 45 after other errors on the GPU (within a minute) is their consequence: noise. Alone, it
  is the application's;
- an unknown code opens an incident for a person, never dropped; a code far out of range is
  also logged as probably malformed;
- a memory error's XID (48, 64, 95, ...) on a GPU whose row_remap incident is already open is that
  incident's fault, seen once more: it opens nothing of its own. XIDs and samples come over
  different consumers, so a lagging one may show the pending remap first; the two ladders are the
  same (drain, reset once nothing holds the GPU), and two incidents would ask for two drains of one
  node at once, the second refused and paged. The other way round, row_remap stands aside for an
  open gpu_xid (`gpu_health`).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Annotated

import msgspec

from gpumedic_events import GpuReset, GpuXidReported, IncidentKind
from gpumedic_events.xid import MAX_KNOWN_XID, MEMORY_XIDS, XID_CATALOGUE, XidInfo
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, fingerprint
from gpumedic_incidents.policy import XidPolicy
from zombie_detector.rules.base import Incidents, NodeId

log = logging.getLogger(__name__)

NOISE_WINDOW = timedelta(seconds=60)
ACTIONS = {
    "reset_gpu": "drain the GPU's jobs and reset it (nvidia-smi --gpu-reset) once nothing holds it; if it repeats, RMA",
    "reboot": "drain the node and reboot it; the GPU does not come back by itself",
    "application": "the same fault under several jobs points at the GPU: reset it, and have it checked if it repeats",
    "person": "NVIDIA's XID catalogue sends this one to a person: check the hardware, or contact support",
}
QUIET = frozenset({"noise", "ignore"})
"""Buckets that open nothing: a consequence of other errors, or what NVIDIA says needs no action."""

RESETTABLE = frozenset({"reset_gpu", "application"})
"""Buckets whose GPU a reset may bring back (an application XID only once it followed the GPU across jobs)."""

Entry = tuple[datetime, int, str]
"""(when, xid, the job that held the GPU then)."""


class XidSeen(msgspec.Struct, frozen=True):
    """One XID in a GPU's history (the rule's memory: `zombie_detector.memory`)."""

    node: NodeId
    gpu: Annotated[int, msgspec.Meta(ge=0, le=63)] | None
    at: datetime
    xid: Annotated[int, msgspec.Meta(ge=0)]
    job: Annotated[str, msgspec.Meta(max_length=64)]


class XidRule:
    inputs = (GpuXidReported, Sample)

    def __init__(self, policy: XidPolicy) -> None:
        self.policy = policy
        self.history: dict[tuple[str, int | None], deque[Entry]] = {}
        self._holders: dict[str, dict[int, str]] = {}
        """Per node with XID history, the job on each GPU at its last sample."""

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, Sample):
            if event.node_id in self._holders:  # only nodes with XID history are remembered
                self._holders[event.node_id] = _jobs(event)
            return ()
        return self._xid(event, now, incidents)

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    entry = XidSeen
    of_events = True  # a day of XIDs: the node-events stream keeps them

    def remember(self) -> list[XidSeen]:
        return [XidSeen(node, gpu, at, xid, job) for (node, gpu), history in self.history.items() for at, xid, job in history]

    def recall(self, entries: Sequence[XidSeen], now: datetime) -> None:
        kept = timedelta(seconds=self.policy.history_s)
        for entry in sorted(entries, key=lambda e: e.at):
            if now - entry.at <= kept:
                self.history.setdefault((entry.node, entry.gpu), deque(maxlen=1000)).append((min(entry.at, now), entry.xid, entry.job))
                self._holders.setdefault(entry.node, {})  # its next sample names the jobs on its GPUs

    def _xid(self, event: GpuXidReported, now: datetime, incidents: Incidents) -> list[Finding]:
        key = (event.node_id, event.gpu_index)
        job = self._holders.setdefault(event.node_id, {}).get(event.gpu_index, "") if event.gpu_index is not None else ""
        history = self.history.setdefault(key, deque(maxlen=1000))
        while history and now - history[0][0] > timedelta(seconds=self.policy.history_s):
            history.popleft()
        history.append((now, event.xid, job))
        info = XID_CATALOGUE.get(event.xid)
        if info is None:
            if event.xid > MAX_KNOWN_XID:
                log.warning("XID %d on %s GPU %s is far beyond known codes: recorded as unknown", event.xid, event.node_id, event.gpu_index)
            return [self._unknown(event)]
        if info.bucket in QUIET:
            return []  # a consequence of the errors before it, or nothing to do (NVIDIA's IGNORE)
        remap = fingerprint(event.node_id, IncidentKind.ROW_REMAP, event.gpu_index, None)
        if event.xid in MEMORY_XIDS and incidents.get(remap) is not None:
            return []  # the memory fault row_remap's open incident already drains and resets for
        if info.bucket == "application":
            jobs = {j for _, xid, j in history if j and XID_CATALOGUE.get(xid, info).bucket == "application"}
            if len(jobs) < self.policy.repeat_jobs:
                return []  # the job's fault: it is the owner's to restart
            return [self._finding(event, info, IncidentKind.GPU_XID, history, jobs=len(jobs))]
        kind = IncidentKind.GPU_LOST if event.xid == 79 else IncidentKind.GPU_XID
        return [self._finding(event, info, kind, history)]

    def _finding(self, event: GpuXidReported, info: XidInfo, kind: IncidentKind, history: deque[Entry], jobs: int = 0) -> Finding:
        where = "a GPU" if event.gpu_index is None else f"GPU {event.gpu_index}"
        seen = sum(1 for _, xid, _ in history if xid == event.xid)
        codes = sorted({xid for _, xid, _ in history})
        summary = f"XID {event.xid} ({info.meaning}) on {where}"
        if jobs:
            summary += f", under {jobs} different jobs: the GPU is the common factor"
        elif seen > 1:
            summary += f", {seen} times in {self.policy.history_s / 3600:g}h"
        return Finding(
            kind=kind,
            node_id=event.node_id,
            gpu_index=event.gpu_index,
            summary=summary,
            evidence={
                "xid": event.xid,
                "meaning": info.meaning,
                "mnemonic": info.mnemonic or None,
                "nvidia_action": info.nvidia_action or None,
                "bucket": info.bucket,
                "times_seen": seen,
                "xids_on_gpu": " ".join(map(str, codes)),
                "gpu_uuid": event.gpu_uuid or None,
            },
            severity="critical" if jobs else info.severity,
            recommended_action=ACTIONS[info.bucket],
            # The ladder drains first; a reset follows only where the XID calls for one (the
            # remediator still refuses it while anything holds the GPU). The rest is a person's.
            operations={"gpu_reset": GpuReset(gpu_index=event.gpu_index)}
            if info.bucket in RESETTABLE and event.gpu_index is not None
            else {},
            unsafe=f"NVIDIA's catalogue says {info.nvidia_action or 'no action'} for XID {event.xid}: a person decides"
            if info.bucket == "person"
            else "",
            occurrence=True,
        )

    def _unknown(self, event: GpuXidReported) -> Finding:
        where = "a GPU" if event.gpu_index is None else f"GPU {event.gpu_index}"
        return Finding(
            kind=IncidentKind.GPU_XID,
            node_id=event.node_id,
            gpu_index=event.gpu_index,
            summary=f"XID {event.xid} on {where}, a code gpumedic does not know",
            evidence={"xid": event.xid, "meaning": event.description or None, "bucket": "unknown", "gpu_uuid": event.gpu_uuid or None},
            severity="warning",
            recommended_action=f"look XID {event.xid} up in NVIDIA's XID catalogue (docs.nvidia.com/deploy/xid-errors)",
            unsafe=f"XID {event.xid} is not in gpumedic's catalogue: a person decides whether to drain or reset",
            occurrence=True,
        )


def _jobs(sample: Sample) -> dict[int, str]:
    """A name for the job on each GPU: its main process's pid and start time."""
    jobs = {}
    for gpu in sample.gpus:
        if gpu.processes:
            p = gpu.processes[0]
            jobs[gpu.index] = f"{p.pid}@{p.start_ticks}"
    return jobs
