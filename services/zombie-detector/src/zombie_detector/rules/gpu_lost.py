"""gpu_lost: the GPU fell off the bus (NVML: GPU is lost, the GpuLost event, or XID 79 from the
XID rule). It does not come back by itself: drain the node and reboot it; killing jobs would
only loop. It clears when a sample shows the GPU answering again (after that reboot)."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import GpuLost, IncidentKind, NodeSampled
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
    inputs = (GpuLost, NodeSampled)

    def observe(self, event, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        if isinstance(event, GpuLost):
            return [lost(event.node_id, event.gpu_index, event.reason)]
        findings = [lost(event.node_id, g.index, "NVML: GPU is lost") for g in event.gpus if g.lost]
        open_gpus = {i.gpu_index for i in incidents.open_on(event.node_id) if i.kind is KIND} if event.gpus else set()
        for gpu in event.gpus:
            if gpu.index in open_gpus and not gpu.lost:
                findings.append(Finding(KIND, event.node_id, gpu.index, present=False, summary=f"GPU {gpu.index} answers again"))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()
