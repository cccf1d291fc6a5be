"""The policy file: thresholds, remediation ladders and limits, in one validated YAML file.

Policy is data. Every service that decides reads the same file (GPUMEDIC_POLICY_FILE, or the
default shipped beside this module, whose values follow the runbooks): the detectors take their
thresholds and ladders from it, the remediator its per-node limit. It is the only place attempt
caps and retry limits are set. A mistake stops the service at start with the file and the line:

    policy.yaml:24: kinds.zombie_job.ladder.0.attempts: Input should be greater than or equal to 1

The schema is split by the file's sections: `kinds` (thresholds and ladders per incident kind),
`actions` (per operation: mode, allow-lists, limits), `gate` (fleet, gate, validation, preflight)
and `status` (peer_status); `base` holds what they share. `Policy` puts them together, and every
name is imported from here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_events import IncidentKind
from gpumedic_incidents.policy.base import (
    Action,
    CHECK_COMMAND,
    HEALTH_URL,
    HOOK_URL,
    MAX_ASKS_WHILE_IN_USE,
    Mode,
    NodeSelector,
    PolicyError,
    SAMPLER_UNIT,
    SELECTOR,
    Strict,
    selects,
)
from gpumedic_incidents.policy.kinds import (
    BehindPolicy,
    BlackHolePolicy,
    FailureJumpPolicy,
    NicDegradedPolicy,
    FileMissingPolicy,
    UnknownPeerPolicy,
    NicFlappingPolicy,
    BurnInPolicy,
    ContainerPolicy,
    DiskPolicy,
    EccPolicy,
    FlappingPolicy,
    HARDWARE_KINDS,
    IdleJobsPolicy,
    JobHungPolicy,
    Kinds,
    MemoryPolicy,
    NoLeaderPolicy,
    NvLinkPolicy,
    OrphanPolicy,
    PartitionPolicy,
    PciePolicy,
    BlockedPeerPolicy,
    PeerPolicy,
    PhantomPolicy,
    RepeatPolicy,
    RepeatRule,
    RowRemapPolicy,
    SamplesLostPolicy,
    SilentPolicy,
    SlowPeerPolicy,
    SplitPolicy,
    SshPolicy,
    StalledPolicy,
    StragglerPolicy,
    StuckPolicy,
    TargetPolicy,
    ThermalPolicy,
    ThrottlePolicy,
    WorkerPolicy,
    XidPolicy,
    ZombiePolicy,
)
from gpumedic_incidents.policy.ladder import CheckpointPolicy, KindPolicy, Step
from gpumedic_incidents.policy.operator import CheckFailedPolicy, CheckPolicy, LogPatternPolicy, PatternPolicy
from gpumedic_incidents.policy.gate import FleetPolicy, GatePolicy, PreflightPolicy, ValidationPolicy
from gpumedic_incidents.policy.actions import (
    AcceptPolicy,
    ActionPolicy,
    Actions,
    AdminEndpoint,
    AdminPolicy,
    BODY_FIELDS,
    BODY_KEY,
    BODY_TEXT,
    DrainPolicy,
    JobRestart,
    KillPolicy,
    PatternKillPolicy,
    LogFile,
    LogsPolicy,
    ProcessPattern,
    MarkEndedPolicy,
    NodeScoped,
    PrunePolicy,
    RequeuePolicy,
    RestartJobPolicy,
    RestartPolicy,
    RestartWorkerPolicy,
    SQL_PARAM,
    SpawnPolicy,
    TaskDbPolicy,
    TerminatePolicy,
    UndrainPolicy,
    UnitRule,
    loopback_url,
)
from gpumedic_incidents.policy.status import PeerStatusPolicy, STATUS_PRESETS, StatusFields

DEFAULT_POLICY = Path(__file__).parent.with_name("policy.yaml")
MAX_POLICY_BYTES = 1024 * 1024


class Policy(Strict):
    version: Literal[1] = 1
    fleet: FleetPolicy = FleetPolicy()
    gate: GatePolicy = GatePolicy()
    actions: Actions = Actions()
    preflight: PreflightPolicy = PreflightPolicy()
    logs: LogsPolicy = LogsPolicy()
    validation: ValidationPolicy = ValidationPolicy()
    peer_status: PeerStatusPolicy = PeerStatusPolicy()
    kinds: Kinds = Kinds()

    def of(self, kind: IncidentKind | str, key: str | None = None) -> KindPolicy:
        return self.kinds.of(kind, key)

    def unconfigured(self) -> dict[str, str]:
        """Kinds whose ladder needs something only the operator knows, and what: until it is set,
        they escalate to a person."""
        missing = {}
        endpoint = self.kinds.no_leader.election_endpoint
        if self.kinds.no_leader.ladder and endpoint not in self.actions.http_admin.endpoints:
            missing["no_leader"] = f"actions.http_admin.endpoints.{endpoint}"
        reset = self.kinds.phantom_jobs.reset_endpoint
        if self.kinds.phantom_jobs.ladder and reset not in self.actions.http_admin.endpoints:
            missing["phantom_jobs"] = f"actions.http_admin.endpoints.{reset}"
        for name in ("peer_blocked", "peer_down", "slow_peer"):
            if getattr(self.kinds, name).ladder and getattr(self.kinds, name).daemon_unit is None:
                missing[name] = f"kinds.{name}.daemon_unit"
        if self.kinds.capacity_short.ladder and not self.actions.spawn_worker.gpu_types:
            missing["capacity_short"] = "actions.spawn_worker.gpu_types"
        for kind, action in (("orphaned_tasks", "requeue_tasks"), ("vanished_worker", "mark_worker_ended")):
            if getattr(self.kinds, kind).ladder and self.actions.of(action).statement is None:
                missing[kind] = f"actions.{action}.statement"
        return missing

    @model_validator(mode="after")
    def _ladders_fit_the_actions(self) -> Policy:
        for name in type(self.kinds).model_fields:
            if any(step.action == "undrain_node" for step in getattr(self.kinds, name).ladder):
                raise ValueError(
                    f"kinds.{name}: undrain_node follows validation (the validation section), never a ladder step"
                )
        for name in ("zombie_job", "job_hung"):
            job = getattr(self.kinds, name).restart_job
            if job is not None and job not in self.actions.restart_job.jobs:
                raise ValueError(f"kinds.{name} restarts the job {job}, which actions.restart_job.jobs does not list; add it there")
        zombie = self.kinds.zombie_job
        if zombie.kill_pattern is not None and zombie.kill_pattern not in self.actions.kill_pattern.patterns:
            raise ValueError(f"kinds.zombie_job ends the pattern {zombie.kill_pattern}, which actions.kill_pattern.patterns does "
                             "not list; add it there")
        if any(step.action == "kill_pattern" for step in zombie.ladder) and zombie.kill_pattern is None:
            raise ValueError("kinds.zombie_job's ladder has kill_pattern, but kinds.zombie_job.kill_pattern names no pattern")
        restarted = [("node_silent", self.kinds.node_silent.sampler_unit, self.kinds.node_silent.ladder)]
        restarted += [(name, getattr(self.kinds, name).daemon_unit, getattr(self.kinds, name).ladder)
                      for name in ("peer_blocked", "peer_down", "slow_peer")]
        checks, patterns = self.kinds.check_failed, self.kinds.log_pattern
        restarted += [("check_failed", checks.unit, checks.ladder), ("log_pattern", patterns.unit, patterns.ladder)]
        restarted += [(f"check_failed.checks.{name}", check.unit, check.ladder) for name, check in checks.checks.items()]
        restarted += [(f"log_pattern.patterns.{name}", rule.unit, rule.ladder) for name, rule in patterns.patterns.items()]
        for name, unit, ladder in restarted:
            restarts = any(step.action == "restart_unit" for step in ladder)
            if unit is not None and restarts and unit not in self.actions.restart_unit.units:
                raise ValueError(f"kinds.{name} restarts {unit}, which actions.restart_unit.units does not allow; add it there")
        return self


def dump_policy(policy: Policy, path: Path) -> None:
    """Write `policy` as a policy file (`load_policy` reads it back equal)."""
    path.write_text(
        "# Written by gpumedic; see the shipped policy.yaml for what each setting means.\n"
        + yaml.safe_dump(policy.model_dump(mode="json"), sort_keys=False)
    )


def load_policy(path: Path | str | None = None) -> Policy:
    """The policy in `path` (the shipped default when None); PolicyError names file and line."""
    path = Path(path) if path is not None else DEFAULT_POLICY
    try:
        if path.stat().st_size > MAX_POLICY_BYTES:
            raise PolicyError(f"{path}: larger than {MAX_POLICY_BYTES} bytes")
        text = path.read_text()
    except OSError as exc:
        raise PolicyError(f"{path}: cannot be read: {exc.strerror or exc}") from None
    try:
        tree = yaml.compose(text)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise PolicyError(f"{where}: not valid YAML: {getattr(exc, 'problem', exc)}") from None
    if not isinstance(data, dict):
        raise PolicyError(f"{path}: a policy is a mapping (version, fleet, gate, kinds)")
    try:
        return Policy.model_validate(data)
    except ValidationError as exc:
        problems = []
        for err in exc.errors(include_url=False, include_input=False)[:5]:
            loc = ".".join(str(p) for p in err["loc"])
            problems.append(f"{path}:{_line(tree, err['loc'])}: {loc or '<file>'}: {err['msg']}")
        raise PolicyError("\n".join(problems)) from None


def _line(node: Any, loc: tuple) -> int:
    """The 1-based line of the deepest YAML node on `loc` that exists."""
    line = node.start_mark.line + 1 if node is not None else 1
    for part in loc:
        child = None
        if isinstance(node, yaml.MappingNode):
            child = next((value for key, value in node.value if key.value == part), None)
        elif isinstance(node, yaml.SequenceNode) and isinstance(part, int) and part < len(node.value):
            child = node.value[part]
        if child is None:
            break
        node, line = child, child.start_mark.line + 1
    return line


class PolicySettings(BaseSettings):
    """Where the policy file is: GPUMEDIC_POLICY_FILE, the same for every service that decides."""

    model_config = SettingsConfigDict(env_prefix="GPUMEDIC_POLICY_", extra="ignore")

    file: Path | None = Field(default=None, description="The policy file; empty: the shipped default.")

    @field_validator("file", mode="before")
    @classmethod
    def _empty_is_default(cls, value: object) -> object:
        return None if value == "" else value

    def load(self) -> Policy:
        return load_policy(self.file)


__all__ = [
    "AcceptPolicy",
    "Action",
    "ActionPolicy",
    "Actions",
    "AdminEndpoint",
    "AdminPolicy",
    "BODY_FIELDS",
    "BODY_KEY",
    "BODY_TEXT",
    "BehindPolicy",
    "BlackHolePolicy",
    "FailureJumpPolicy",
    "NicDegradedPolicy",
    "CheckFailedPolicy",
    "CheckPolicy",
    "LogPatternPolicy",
    "PatternPolicy",
    "UnknownPeerPolicy",
    "FileMissingPolicy",
    "NicFlappingPolicy",
    "BurnInPolicy",
    "CHECK_COMMAND",
    "CheckpointPolicy",
    "ContainerPolicy",
    "DEFAULT_POLICY",
    "DiskPolicy",
    "DrainPolicy",
    "EccPolicy",
    "FlappingPolicy",
    "FleetPolicy",
    "GatePolicy",
    "HARDWARE_KINDS",
    "HEALTH_URL",
    "HOOK_URL",
    "IdleJobsPolicy",
    "JobHungPolicy",
    "JobRestart",
    "KillPolicy",
    "PatternKillPolicy",
    "LogFile",
    "LogsPolicy",
    "ProcessPattern",
    "KindPolicy",
    "Kinds",
    "MAX_ASKS_WHILE_IN_USE",
    "MAX_POLICY_BYTES",
    "MarkEndedPolicy",
    "MemoryPolicy",
    "Mode",
    "NoLeaderPolicy",
    "NodeScoped",
    "NodeSelector",
    "NvLinkPolicy",
    "OrphanPolicy",
    "PartitionPolicy",
    "PciePolicy",
    "BlockedPeerPolicy",
    "PeerPolicy",
    "PeerStatusPolicy",
    "PhantomPolicy",
    "Policy",
    "PolicyError",
    "PolicySettings",
    "PreflightPolicy",
    "PrunePolicy",
    "RepeatPolicy",
    "RepeatRule",
    "RequeuePolicy",
    "RestartJobPolicy",
    "RestartPolicy",
    "RestartWorkerPolicy",
    "RowRemapPolicy",
    "SAMPLER_UNIT",
    "SELECTOR",
    "SQL_PARAM",
    "STATUS_PRESETS",
    "SamplesLostPolicy",
    "SilentPolicy",
    "SlowPeerPolicy",
    "SpawnPolicy",
    "SplitPolicy",
    "SshPolicy",
    "StalledPolicy",
    "StatusFields",
    "Step",
    "StragglerPolicy",
    "Strict",
    "StuckPolicy",
    "TargetPolicy",
    "TaskDbPolicy",
    "TerminatePolicy",
    "ThermalPolicy",
    "ThrottlePolicy",
    "UndrainPolicy",
    "UnitRule",
    "ValidationPolicy",
    "WorkerPolicy",
    "XidPolicy",
    "ZombiePolicy",
    "dump_policy",
    "load_policy",
    "loopback_url",
    "selects",
]
