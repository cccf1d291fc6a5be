"""Every node rule, registered in one table. A new incident kind is a module here and a line in
`build_rules`; the lifecycle, fleet correlation and silences come with the book."""

from __future__ import annotations

from gpumedic_incidents import Policy
from zombie_detector.rules.base import Incidents, Rule
from zombie_detector.rules.zombie import ZombieRule


def build_rules(policy: Policy) -> list[Rule]:
    """The node rules, each with its part of the policy."""
    return [
        ZombieRule(policy.kinds.zombie_job),
    ]


__all__ = ["Incidents", "Rule", "build_rules"]
