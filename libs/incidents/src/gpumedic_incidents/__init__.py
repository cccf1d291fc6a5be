"""Open incidents: what a detector remembers of each one, kept in a JetStream KV bucket.

The detector that opened an incident writes its state before it publishes anything about it,
and only detectors may write the bucket (NATS permissions). The remediator's gate reads it to
check that a request belongs to an incident that is open, on that node and GPU, and waiting
for exactly that action: a forged or stale request finds no such state and is refused.
"""

from gpumedic_incidents.state import IncidentState, PendingAction, Phase, operation_digest
from gpumedic_incidents.store import IncidentStates, state_key

__all__ = ["IncidentState", "IncidentStates", "PendingAction", "Phase", "operation_digest", "state_key"]
