"""Incidents as every detector keeps them: one lifecycle, one policy file, one store.

- `state`: the frozen `IncidentState` a detector persists, and the `Finding` a rule reports.
- `lifecycle`: the pure state machine (open, act, verify, retry, resolve or escalate).
- `book`: one detector's open incidents, with fleet correlation and silences above every kind.
- `policy`: thresholds, ladders and limits from one validated YAML file.
- `store`: the JetStream KV bucket the detector writes and the remediator's gate reads.
"""

from gpumedic_incidents.book import FLEET_NODE, IncidentBook, fleet_fingerprint
from gpumedic_incidents.lifecycle import Span, Transition
from gpumedic_incidents.policy import Policy, PolicyError, PolicySettings, load_policy
from gpumedic_incidents.state import (
    Finding,
    IncidentState,
    Operation,
    PendingAction,
    Phase,
    cleared,
    fingerprint,
    operation_digest,
)
from gpumedic_incidents.store import IncidentStates, state_key

__all__ = [
    "FLEET_NODE",
    "Finding",
    "IncidentBook",
    "IncidentState",
    "IncidentStates",
    "Operation",
    "PendingAction",
    "Phase",
    "Policy",
    "PolicyError",
    "PolicySettings",
    "Span",
    "Transition",
    "cleared",
    "fingerprint",
    "fleet_fingerprint",
    "load_policy",
    "operation_digest",
    "state_key",
]
