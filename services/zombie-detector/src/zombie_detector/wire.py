"""A rule's `Finding` on the bus and back: what a detector cell sends the decider (`NodeFindings`)."""

from __future__ import annotations

from gpumedic_events import Found, IncidentKind
from gpumedic_incidents import Finding
from gpumedic_incidents.state import masked


def wire(finding: Finding) -> Found:
    """A finding as a cell sends it (masked: whatever it copies of a job goes on the bus)."""
    finding = masked(finding)
    return Found(
        kind=IncidentKind(finding.kind), node_id=finding.node_id, gpu_index=finding.gpu_index, key=finding.key, present=finding.present,
        summary=finding.summary[:1000], evidence=dict(finding.evidence), severity=finding.severity, diagnosis=finding.diagnosis,
        recommended_action=finding.recommended_action[:500], operations=dict(finding.operations), unsafe=finding.unsafe[:500],
        occurrence=finding.occurrence, related_incident_id=finding.related_incident_id, ready=finding.ready,
    )


def finding_of(found: Found) -> Finding:
    """A finding as the book takes it, from the wire."""
    return Finding(
        kind=found.kind, node_id=found.node_id, gpu_index=found.gpu_index, key=found.key, present=found.present, summary=found.summary,
        evidence=dict(found.evidence), severity=found.severity, diagnosis=found.diagnosis, recommended_action=found.recommended_action,
        operations=dict(found.operations), unsafe=found.unsafe, occurrence=found.occurrence,
        related_incident_id=found.related_incident_id, ready=found.ready,
    )
