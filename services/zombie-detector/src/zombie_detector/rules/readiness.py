"""Readiness: may a drained node's GPUs take jobs again? Validation before capacity returns.

For every incident that drained its node and is now verifying a fix or validating, each sample of
the node gives a verdict (`Finding.ready`): the incident's GPU (every GPU for a node-wide
incident) answers NVML, is not lost, runs no compute process, is held by no process but the
daemons pre-flight ignores, has at most `preflight.max_memory_mib` in use, admits jobs (compute
mode not Prohibited) and has no row remap or page retirement waiting for a reset. A GPU reset
that worked is verified by exactly this, and the lifecycle undrains the node only after
`validation.ready_samples` such samples in a row. A value NVML could not read counts as not
ready: capacity returns on evidence, never on its absence. A hung job's stop is verified by its own
rule (no rank of the job left on any node), never by the node that stopped being free: readiness
speaks for `job_hung` only once it validates.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from gpumedic_events import ComputeMode, IncidentKind
from gpumedic_events.views import Sample
from gpumedic_incidents import Finding, IncidentState
from gpumedic_incidents.policy import PreflightPolicy
from zombie_detector.rules.base import Incidents


class ReadinessRule:
    inputs = (Sample,)

    def __init__(self, preflight: PreflightPolicy) -> None:
        self.preflight = preflight

    def observe(self, event: Sample, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        findings = []
        for incident in incidents.open_on(event.node_id):
            if not incident.drained or incident.phase not in ("verifying", "validating"):
                continue
            if incident.kind is IncidentKind.JOB_HUNG and incident.phase == "verifying":
                continue
            why = not_ready(event, incident.gpu_index, self.preflight)
            findings.append(_verdict(incident, why))
        return findings

    def tick(self, now: datetime, incidents: Incidents) -> Sequence[Finding]:
        return ()


def not_ready(sample: Sample, gpu_index: int | None, preflight: PreflightPolicy) -> str:
    """Why the GPU (every GPU when None) may not take a job now, '' when it may."""
    if sample.nvml_error:
        return f"NVML does not answer ({sample.nvml_error[:200]})"
    gpus = {g.index: g for g in sample.gpus}
    if not gpus:
        return "the sample lists no GPU"
    wanted = sorted(gpus) if gpu_index is None else [gpu_index]
    ignored = set(preflight.ignore_holders)
    for index in wanted:
        gpu = gpus.get(index)
        if gpu is None:
            return f"GPU {index} is missing from the sample"
        if gpu.lost:
            return f"GPU {index} is lost"
        if gpu.processes:
            return f"GPU {index} runs pid {', '.join(str(p.pid) for p in gpu.processes[:8])}"
        device = f"/dev/nvidia{index}"
        holders = [h.pid for h in sample.device_holders if device in h.devices and _comm(h.command) not in ignored]
        if holders:
            return f"{device} is held by pid {', '.join(map(str, holders[:8]))}"
        if gpu.memory_used_mib is None:
            return f"GPU {index}'s memory use is unknown"
        if gpu.memory_used_mib > preflight.max_memory_mib:
            return f"GPU {index} has {gpu.memory_used_mib} MiB in use (limit {preflight.max_memory_mib})"
        if gpu.compute_mode is ComputeMode.PROHIBITED:
            return f"GPU {index}'s compute mode is Prohibited"
        if gpu.remapped_rows_failed:
            return f"GPU {index} failed a row remap: it needs service"
        if gpu.remapped_rows_pending or gpu.retired_pages_pending:
            return f"GPU {index} has {'row remaps' if gpu.remapped_rows_pending else 'page retirements'} waiting for a reset"
    return ""


def _comm(command: str) -> str:
    """The 15-character name the kernel gives a process, from its command line (as pre-flight reads it)."""
    program = command.split(" ", 1)[0]
    return program.rsplit("/", 1)[-1][:15]


def _verdict(incident: IncidentState, why: str) -> Finding:
    where = "every GPU" if incident.gpu_index is None else f"GPU {incident.gpu_index}"
    return Finding(
        kind=incident.kind,
        node_id=incident.node_id,
        gpu_index=incident.gpu_index,
        key=incident.key,
        present=False,
        ready=not why,
        summary=f"{where} free and healthy" if not why else f"not ready: {why}",
    )
