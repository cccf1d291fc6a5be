"""The policy's kinds of the operator's own: their check scripts (`check_failed`) and their log
patterns (`log_pattern`), each with settings of its own per check or pattern, ladder included."""

from __future__ import annotations

import re
from typing import Any

from pydantic import Field, field_validator, model_validator

from gpumedic_events import UNIT_PATTERN
from gpumedic_events.incident import Severity
from gpumedic_events.node import CHECK_NAME
from gpumedic_incidents.policy.ladder import KindPolicy

OPERATOR_ACTIONS = ("drain_node", "restart_unit", "reboot_node")
"""What the ladder of an operator's own check or log pattern may do: it says only that something on its node is wrong."""


class OperatorRule(KindPolicy):
    """What the operator's own checks and log patterns have: how bad, what a person should do, and a
    ladder of their own (a person's by default): drain_node, restart_unit of `unit`, reboot_node."""

    severity: Severity = "warning"
    advice: str = Field(default="", max_length=500, description="What a person should do, as the incident's recommended action.")
    unit: str | None = Field(default=None, pattern=UNIT_PATTERN, description="The unit a restart_unit step restarts.")

    @model_validator(mode="after")
    def _a_ladder_for_a_node(self) -> OperatorRule:
        for step in self.ladder:
            if step.action not in OPERATOR_ACTIONS:
                raise ValueError(f"an operator's check or pattern may {', '.join(OPERATOR_ACTIONS)}, not {step.action}")
            if step.action == "restart_unit" and self.unit is None:
                raise ValueError("restart_unit needs unit: the service whose restart fixes it")
        return self


def _names(value: dict[str, Any], what: str) -> dict[str, Any]:
    for name in value:
        if not re.fullmatch(CHECK_NAME, name):
            raise ValueError(f"{name[:80]!r} is not {what} (letters, digits, _ -)")
    return value


class CheckPolicy(OperatorRule):
    """One of the operator's own checks (node-sampler's GPUMEDIC_SAMPLER_CHECKS_DIR)."""

    for_s: float = Field(default=120.0, ge=0, le=7 * 86400, description="How long the check must keep saying 'problem' (exit 1).")


class CheckFailedPolicy(CheckPolicy):
    """Every check has these settings but those named in `checks`, which have their own (by the
    check's name: its script's file name without the extension, `nfs-mounted` for nfs-mounted.sh)."""

    checks: dict[str, CheckPolicy] = Field(default_factory=dict, max_length=64)

    @field_validator("checks")
    @classmethod
    def _named_as_checks(cls, value: dict[str, CheckPolicy]) -> dict[str, CheckPolicy]:
        return _names(value, "a check's name (its script's file name without the extension)")

    def of(self, check: str | None) -> CheckPolicy:
        return self.checks.get(check or "", self)


class PatternPolicy(OperatorRule):
    """One of the operator's log patterns (node-sampler's GPUMEDIC_SAMPLER_LOG_PATTERNS)."""

    count: int = Field(default=1, ge=1, le=1_000_000, description="Matching lines within window_s that make an incident.")
    window_s: float = Field(default=600.0, ge=1, le=7 * 86400, description="The window; fewer than `count` in it clears the incident.")


class LogPatternPolicy(PatternPolicy):
    """Every pattern has these settings but those named in `patterns`, which have their own (by the pattern's name)."""

    patterns: dict[str, PatternPolicy] = Field(default_factory=dict, max_length=32)

    @field_validator("patterns")
    @classmethod
    def _named_as_patterns(cls, value: dict[str, PatternPolicy]) -> dict[str, PatternPolicy]:
        return _names(value, "a log pattern's name")

    def of(self, pattern: str | None) -> PatternPolicy:
        return self.patterns.get(pattern or "", self)
