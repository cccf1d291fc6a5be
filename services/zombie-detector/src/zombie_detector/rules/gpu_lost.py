"""gpu_lost: the GPU fell off the bus (NVML: GPU is lost, the GpuLost event, or XID 79 from the
XID rule). It does not come back by itself: drain the node and reboot it; killing jobs would
only loop. It clears when a sample shows the GPU answering again (after that reboot), and only a
sample taken after the node last reported the loss: one taken just before it (the XID comes while a
sample is on its way) shows the GPU answering and would clear it, and the next sample would open
the same fault again as a second incident (which a repeat-offender rule counts)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import GpuLost, GpuXidReported, IncidentKind
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding
from zombie_detector.rules.base import Incidents

KIND = IncidentKind.GPU_LOST
ACTION = "drain the node and reboot it (the GPU is off the bus); if it falls off again, have it checked (RMA)"


def lost(node_id: str, gpu: int, why: str) -> Finding:
    return Finding(
        kind=KIND,
        node_id=node_id,
        gpu_index=gpu,
        summary=f"GPU {gpu} fell off the bus ({why})",
        evidence={"why": why},
        severity="critical",
        recommended_action=ACTION,
    )


class GpuLostRule:
    inputs = (GpuLost, GpuXidReported, Sample)

    def __init__(self) -> None:
        self._reported: dict[tuple[str, int], datetime] = {}
        """(node, GPU) -> the node's time of its latest report that the GPU is lost."""

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, GpuXidReported):  # the XID rule opens the incident; this one remembers when
            if event.xid == 79 and event.gpu_index is not None:
                self._report(event.node_id, event.gpu_index, event.occurred_at)
            return []
        if isinstance(event, GpuLost):
            self._report(event.node_id, event.gpu_index, event.occurred_at)
            return [lost(event.node_id, event.gpu_index, event.reason)]
        findings = []
        for gpu in event.gpus:
            if gpu.lost:
                self._report(event.node_id, gpu.index, event.occurred_at)
                findings.append(lost(event.node_id, gpu.index, "NVML: GPU is lost"))
        open_gpus = {i.gpu_index for i in incidents.open_on(event.node_id) if i.kind is KIND} if event.gpus else set()
        for gpu in event.gpus:
            reported = self._reported.get((event.node_id, gpu.index))
            if gpu.index in open_gpus and not gpu.lost and (reported is None or event.occurred_at > reported):
                self._reported.pop((event.node_id, gpu.index), None)
                findings.append(Finding(KIND, event.node_id, gpu.index, present=False, summary=f"GPU {gpu.index} answers again"))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()

    def _report(self, node_id: str, gpu: int, at: datetime) -> None:
        key = (node_id, gpu)
        self._reported[key] = max(at, self._reported.get(key, at))
