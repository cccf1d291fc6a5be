"""The policy file: thresholds, remediation ladders and limits, in one validated YAML file.

Policy is data. Every service that decides reads the same file (GPUMEDIC_POLICY_FILE, or the
default shipped beside this module, whose values follow the runbooks): the detectors take their
thresholds and ladders from it, the remediator its per-node limit. It is the only place attempt
caps and retry limits are set. A mistake stops the service at start with the file and the line:

    policy.yaml:24: kinds.zombie_job.ladder.0.attempts: Input should be greater than or equal to 1
"""

from __future__ import annotations

import re
import string
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal

import jmespath
import yaml
from jmespath.exceptions import JMESPathError
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from gpumedic_events import ENDPOINT_PATTERN, UNIT_PATTERN, WHOLE_KINDS, IncidentKind

DEFAULT_POLICY = Path(__file__).with_name("policy.yaml")
MAX_POLICY_BYTES = 1024 * 1024

Action = Literal[
    "kill_gpu_processes", "restart_unit", "gpu_reset", "docker_prune", "reboot_node", "http_admin", "drain_node",
    "undrain_node", "spawn_worker", "terminate_worker", "restart_worker", "requeue_tasks", "mark_worker_ended", "restart_job",
    "accept_worker",
]
"""The catalogue's operations a ladder may name."""
Mode = Literal["observe", "enforce"]
SAMPLER_UNIT = "gpumedic-node-sampler.service"
MAX_ASKS_WHILE_IN_USE = 80
"""An incident's actions are numbered up to 100 (ActionRequested.attempt): waiting must leave room."""

HOOK_URL = re.compile(r"^https?://[A-Za-z0-9.-]+(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
"""The scheduler's drain hook, POSTed by the remediator: a plain URL, no user info, no query."""
CHECK_COMMAND = re.compile(r"^(/[A-Za-z0-9_.-]+)+$")
"""The node's own readiness check: an absolute path to an executable, no arguments, no `..`."""

HEALTH_URL = re.compile(r"^http://(127\.0\.0\.1|localhost|\[::1\])(:[0-9]{1,5})?(/[A-Za-z0-9._~/-]*)?$")
"""A unit's health endpoint, fetched by `curl` on the node itself: loopback, plain characters only."""


_NAME = r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}"
SELECTOR = re.compile(rf"^(?:group:(?P<group>{_NAME})|label:(?P<key>{_NAME})=(?P<value>[A-Za-z0-9_.:/-]{{0,63}})|(?P<node>{_NAME}))$")


@dataclass(frozen=True)
class NodeSelector:
    """Which nodes a rule covers: `gpu-node-07` (one node), `group:lambda` (an inventory group) or
    `label:role=p2p` (nodes with that label). The inventory says which group and labels a node has."""

    text: str

    def __post_init__(self) -> None:
        if not SELECTOR.match(self.text):
            raise ValueError(f"{self.text[:100]!r} is not a node selector (NODE, group:NAME or label:KEY=VALUE)")

    def matches(self, node_id: str, group: str | None = None, labels: Mapping[str, str] | None = None) -> bool:
        found = SELECTOR.match(self.text)
        assert found is not None
        if found["group"] is not None:
            return group == found["group"]
        if found["key"] is not None:
            return (labels or {}).get(found["key"]) == found["value"]
        return node_id == found["node"]


def selects(selectors: tuple[NodeSelector, ...] | frozenset[NodeSelector], node_id: str, group: str | None, labels: Mapping[str, str] | None) -> bool:
    return any(s.matches(node_id, group, labels) for s in selectors)


class PolicyError(ValueError):
    """The policy file cannot be used; the message names the file and, where known, the line."""


class _Strict(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class Step(_Strict):
    """One rung of a remediation ladder."""

    action: Action
    attempts: int = Field(default=1, ge=1, le=10, description="Tries at this step before the next.")
    verify_within_s: float = Field(default=60.0, gt=0, description="How long the samples may take to show it worked.")
    wait_while_in_use_s: float = Field(
        default=0, ge=0, le=7 * 86400,
        description="A refusal only because the target is in use (a GPU reset while a job still holds the GPU) is asked "
        "again every `ask_again_every_s` for this long before a person is called; 0: a person at once.",
    )
    ask_again_every_s: float = Field(default=900.0, ge=60, description="How often a step waiting for its target to be free asks again.")

    @model_validator(mode="after")
    def _asks_within_the_attempt_limit(self) -> Step:
        if self.wait_while_in_use_s / self.ask_again_every_s > MAX_ASKS_WHILE_IN_USE:
            raise ValueError(f"{self.action} would ask {self.wait_while_in_use_s / self.ask_again_every_s:.0f} times while its "
                             f"target is in use; at most {MAX_ASKS_WHILE_IN_USE}: ask less often or wait less")
        return self


class KindPolicy(_Strict):
    """What every kind has: a ladder (empty: a person from the start) and when a quiet incident closes."""

    ladder: tuple[Step, ...] = ()
    action_timeout_s: float = Field(default=300.0, gt=0, description="How long to wait for the remediator's answer.")
    clear_after_s: float | None = Field(
        default=None, gt=0, description="Resolved 'cleared' (or, on a drained node, validated) after this long with the fault not seen: no new event, and no sample that still shows it."
    )

    @property
    def attempts(self) -> int:
        return sum(step.attempts for step in self.ladder)


class _IdleBelow(KindPolicy):
    idle_below_pct: int = Field(
        default=5, ge=1, le=100, description="A GPU below this utilisation is idle, as the runbook writes it (gpu_percent < 5): "
        "5 % is busy. A kill is safe only on a GPU below it.",
    )

    @model_validator(mode="before")
    @classmethod
    def _renamed(cls, data: Any) -> Any:
        if isinstance(data, dict) and "idle_util_pct" in data:
            raise ValueError(
                "idle_util_pct is now idle_below_pct: a GPU below it is idle, as the runbook writes it (gpu_percent < 5); "
                f"idle_util_pct: {data['idle_util_pct']} is idle_below_pct: {_plus_one(data['idle_util_pct'])}"
            )
        return data


def _plus_one(value: Any) -> Any:
    return value + 1 if isinstance(value, int | float) and not isinstance(value, bool) else "(one more)"


class PhantomPolicy(_IdleBelow):
    idle_for_s: float = Field(default=600.0, gt=0, description="How long jobs are counted with nothing behind them (600 s).")
    reset_endpoint: str = Field(
        default="reset_job_count", pattern=ENDPOINT_PATTERN,
        description="The actions.http_admin endpoint that resets a node's job count (the runbook's "
        "POST /admin/reset_node_jobs on the leader, body {node_id}).",
    )


class IdleJobsPolicy(_IdleBelow):
    idle_for_s: float = Field(default=600.0, gt=0, description="How long the leader counts jobs on an idle peer (600 s).")


class StuckPolicy(_IdleBelow):
    older_than_s: float = Field(default=7200.0, gt=0, description="A holder older than this is old (7200 s: the runbook's 2 hours).")
    idle_for_s: float = Field(default=600.0, gt=0, description="How long its GPU idles under it.")


class ZombiePolicy(_IdleBelow):
    idle_for_s: float = Field(default=600.0, gt=0, description="How long a held GPU stays idle to be a zombie (600 s: 10 minutes).")
    restart_job: str | None = Field(
        default=None, pattern=ENDPOINT_PATTERN,
        description="After a verified kill, start this job of actions.restart_job.jobs again (the runbook's "
        "--cleanup-zombies restarts the work); null: the kill is the fix.",
    )


class OrphanPolicy(_IdleBelow):
    held_for_s: float = Field(default=30.0, ge=0, description="How long a holder is seen before it is an orphan.")


class XidPolicy(KindPolicy):
    history_s: float = Field(default=86_400.0, gt=0, description="How long a GPU's XIDs are remembered.")
    repeat_jobs: int = Field(default=2, ge=2, description="Application XIDs under this many different jobs: hardware.")


class ThermalPolicy(KindPolicy):
    for_s: float = Field(default=60.0, ge=0, description="How long a GPU stays hot (or slowed for heat) to be an incident.")
    clear_margin_c: float = Field(
        default=5.0, ge=0, description="It clears this far below the slowdown temperature, with no thermal slowdown."
    )


class _BusyFrom(KindPolicy):
    busy_from_pct: int = Field(default=50, ge=1, le=100, description="A GPU at or above this utilisation is busy.")


class ThrottlePolicy(_BusyFrom):
    for_s: float = Field(default=60.0, ge=0, description="How long a busy GPU stays held down by hardware.")


class EccPolicy(KindPolicy):
    corrected_per_hour: float = Field(
        default=1000.0, gt=0, description="Corrected (single-bit) ECC errors per hour above which the memory is failing."
    )


class RowRemapPolicy(KindPolicy):
    after_samples: int = Field(
        default=2, ge=1, description="Samples in a row that show it (the XID that comes with it is the same fault, and first)."
    )


class PciePolicy(_BusyFrom):
    """A link may train down while its GPU idles: it is judged while busy."""

    for_s: float = Field(default=60.0, ge=0, description="How long a busy GPU's link stays below its maximum.")
    replays_per_minute: float = Field(
        default=8.0, gt=0, description="PCIe replays per minute above which the link is failing (DCGM's health watch: 8)."
    )


class NvLinkPolicy(KindPolicy):
    errors_per_hour: float = Field(
        default=1000.0, gt=0, description="NVLink replay, recovery and CRC errors per hour above which a link is failing."
    )


class StragglerPolicy(_BusyFrom):
    below_share: float = Field(
        default=0.85, gt=0, lt=1, description="A GPU whose SM clock or power is below this share of its siblings' median is slow."
    )
    min_siblings: int = Field(default=3, ge=2, description="Busy GPUs of the same job on the node to compare (itself included).")
    for_s: float = Field(default=60.0, ge=0, description="How long it stays slow.")


class ContainerPolicy(KindPolicy):
    settle_s: float = Field(default=10.0, ge=0, description="How long related facts may follow an exit.")


class DiskPolicy(KindPolicy):
    open_at_pct: float = Field(default=95.0, gt=0, le=100)
    clear_below_pct: float = Field(default=90.0, gt=0, le=100)

    @model_validator(mode="after")
    def _hysteresis(self) -> DiskPolicy:
        if self.clear_below_pct >= self.open_at_pct:
            raise ValueError(f"clear_below_pct ({self.clear_below_pct:g}) must be below open_at_pct ({self.open_at_pct:g})")
        return self


class MemoryPolicy(KindPolicy):
    open_below_available_pct: float = Field(default=5.0, gt=0, lt=100)
    clear_above_available_pct: float = Field(default=10.0, gt=0, lt=100)

    @model_validator(mode="after")
    def _hysteresis(self) -> MemoryPolicy:
        if self.clear_above_available_pct <= self.open_below_available_pct:
            raise ValueError(
                f"clear_above_available_pct ({self.clear_above_available_pct:g}) must be above "
                f"open_below_available_pct ({self.open_below_available_pct:g})"
            )
        return self


class SilentPolicy(KindPolicy):
    after_intervals: float = Field(default=3.0, ge=1, description="Missed sample intervals before a node is silent.")
    sampler_unit: str = Field(
        default=SAMPLER_UNIT, pattern=UNIT_PATTERN, description="The node-sampler's systemd unit, which restart_unit restarts."
    )


class BehindPolicy(KindPolicy):
    after_s: float = Field(
        default=10.0, gt=0, description="A service whose newest handled sample is older than this while more wait is behind "
        "(two of the shipped 5 s intervals); it is caught up again below half of it.",
    )


class SamplesLostPolicy(KindPolicy):
    min_nodes: int = Field(default=3, ge=1, description="Nodes whose samples the bus did not take, within window_s, for an incident.")
    window_s: float = Field(default=60.0, gt=0, description="How far back losses count; the incident resolves once none is this recent.")


class SshPolicy(KindPolicy):
    after_checks: int = Field(default=2, ge=1, description="Failed read-only logins in a row before an incident.")


class NoLeaderPolicy(KindPolicy):
    grace_s: float = Field(default=60.0, ge=0, description="Quorum without a leader this long (an election takes a while).")
    election_endpoint: str = Field(
        default="force_election", pattern=ENDPOINT_PATTERN, description="The actions.http_admin endpoint that forces an election."
    )


class SplitPolicy(KindPolicy):
    after_checks: int = Field(
        default=2, ge=1, description="Probe rounds in a row naming the same leaders: an election converging names the old "
        "and the new leader for a round, a split keeps naming both.",
    )


class FlappingPolicy(KindPolicy):
    max_changes: int = Field(default=3, ge=1, description="Leader changes within window_s that are too many.")
    window_s: float = Field(default=600.0, gt=0)


class PeerPolicy(KindPolicy):
    after_checks: int = Field(default=2, ge=1, description="Probe rounds in a row before an incident.")
    daemon_unit: str | None = Field(
        default=None, pattern=UNIT_PATTERN, description="The peer daemon's systemd unit, which restart_unit restarts."
    )


class SlowPeerPolicy(PeerPolicy):
    slower_than_s: float = Field(
        default=5.0, gt=0, description="A /status answer slower than this is slow (the runbook restarts a daemon lagging > 5 s)."
    )


class PartitionPolicy(KindPolicy):
    max_unseen_share: float = Field(
        default=0.25, ge=0, lt=1, description="Share of the other answering peers that may not see a peer."
    )
    for_s: float = Field(default=300.0, ge=0, description="Unseen by more than that this long (membership converges first).")


class TargetPolicy(KindPolicy):
    target: int = Field(default=0, ge=0, description="Peers the cluster should have (its leader's count); 0: no target.")
    for_s: float = Field(default=600.0, ge=0, description="Below the target this long before an incident.")


class StalledPolicy(KindPolicy):
    for_s: float = Field(default=600.0, ge=0, description="Tasks wait while the GPUs in service idle this long.")


class WorkerPolicy(KindPolicy):
    after_s: float = Field(default=300.0, gt=0, description="How long the worker is in that state before an incident.")


class BurnInPolicy(KindPolicy):
    """A newly rented worker's trial (`autoscaler.burnin`): its samples, then `accept_worker`."""

    required: bool = Field(
        default=False,
        description="Rented workers are capacity only once they pass their burn-in (their samples, then accept_worker on the "
        "node: it needs the sampler and the remediator's SSH on the workers).",
    )
    within_s: float = Field(
        default=900.0, gt=0, description="Accepted this long after it came up, or ended (the provider's grace: a rental is billed)."
    )
    min_free_disk_gib: float = Field(default=10.0, ge=0, description="Free space each disk the sampler watches must have.")
    min_available_memory_pct: float = Field(default=10.0, ge=0, lt=100, description="Host memory that must be available.")
    ladder: tuple[Step, ...] = (Step(action="accept_worker", verify_within_s=60),)
    action_timeout_s: float = Field(default=1200.0, gt=0, description="DCGM's diagnostic takes minutes.")


HARDWARE_KINDS = (
    IncidentKind.GPU_XID, IncidentKind.GPU_LOST, IncidentKind.ECC_ERRORS, IncidentKind.ROW_REMAP, IncidentKind.PCIE_DEGRADED,
    IncidentKind.NVLINK_DEGRADED, IncidentKind.BURN_IN_FAILED,
)
"""A GPU's hardware faults, and a failed burn-in: the same again on the same machine is the
machine, not bad luck."""


class RepeatRule(_Strict):
    """`count` incidents of one kind on one host within `window_s` make it a repeat offender."""

    kinds: tuple[IncidentKind, ...] = Field(default=(), description="The kinds counted; empty: every kind one host can cause.")
    count: int = Field(ge=1, le=100)
    window_s: float = Field(gt=0, le=90 * 86_400, description="At most 90 days: the incident stream keeps no more.")

    @field_validator("kinds")
    @classmethod
    def _a_host_can_cause_them(cls, value: tuple[IncidentKind, ...]) -> tuple[IncidentKind, ...]:
        whole = sorted(k.value for k in value if k in WHOLE_KINDS or k is IncidentKind.REPEAT_OFFENDER)
        if whole:
            raise ValueError(f"{', '.join(whole)} are not one host's doing: they are never counted against one")
        return value


class RepeatPolicy(KindPolicy):
    """A host is a rented worker's machine (the provider's machine id, so it is known again under a
    new pod) or an owned node. The first rule that a host's incidents of one kind meet makes the
    incident; it lasts while they do."""

    rules: tuple[RepeatRule, ...] = Field(
        default=(RepeatRule(kinds=HARDWARE_KINDS, count=2, window_s=7 * 86_400), RepeatRule(count=3, window_s=3600)),
        max_length=20,
    )
    ladder: tuple[Step, ...] = (Step(action="drain_node"), Step(action="terminate_worker", attempts=2, verify_within_s=120))


class Kinds(_Strict):
    zombie_job: ZombiePolicy = ZombiePolicy(ladder=(Step(action="kill_gpu_processes", attempts=2),))
    orphan_gpu_holder: OrphanPolicy = OrphanPolicy(
        ladder=(Step(action="kill_gpu_processes", attempts=2), Step(action="restart_worker", verify_within_s=900)),
        action_timeout_s=900.0,
    )
    gpu_xid: XidPolicy = XidPolicy(
        ladder=(Step(action="drain_node"), Step(action="gpu_reset", verify_within_s=120, wait_while_in_use_s=86400, ask_again_every_s=1800)),
        clear_after_s=3600,
    )
    gpu_lost: KindPolicy = KindPolicy(ladder=(Step(action="drain_node"),), clear_after_s=600)
    gpu_thermal: ThermalPolicy = ThermalPolicy()
    gpu_throttled: ThrottlePolicy = ThrottlePolicy()
    ecc_errors: EccPolicy = EccPolicy(ladder=(Step(action="drain_node"),), clear_after_s=3600)
    row_remap: RowRemapPolicy = RowRemapPolicy(
        ladder=(Step(action="drain_node"), Step(action="gpu_reset", verify_within_s=120, wait_while_in_use_s=86400, ask_again_every_s=1800))
    )
    pcie_degraded: PciePolicy = PciePolicy(clear_after_s=3600)
    nvlink_degraded: NvLinkPolicy = NvLinkPolicy(clear_after_s=3600)
    gpu_straggler: StragglerPolicy = StragglerPolicy(clear_after_s=3600)
    container_died: ContainerPolicy = ContainerPolicy(clear_after_s=3600)
    disk_pressure: DiskPolicy = DiskPolicy(ladder=(Step(action="docker_prune", verify_within_s=120),))
    host_memory_pressure: MemoryPolicy = MemoryPolicy()
    node_silent: SilentPolicy = SilentPolicy(ladder=(Step(action="restart_unit", verify_within_s=120),))
    nvml_unavailable: KindPolicy = KindPolicy()
    ssh_unreachable: SshPolicy = SshPolicy()
    fleet_anomaly: KindPolicy = KindPolicy()
    no_leader: NoLeaderPolicy = NoLeaderPolicy(ladder=(Step(action="http_admin", attempts=2, verify_within_s=60),))
    quorum_lost: KindPolicy = KindPolicy()
    split_brain: SplitPolicy = SplitPolicy()
    leader_flapping: FlappingPolicy = FlappingPolicy()
    peer_blocked: PeerPolicy = PeerPolicy(after_checks=2, ladder=(Step(action="restart_unit", verify_within_s=120),))
    peer_down: PeerPolicy = PeerPolicy(ladder=(Step(action="restart_unit", verify_within_s=120),))
    slow_peer: SlowPeerPolicy = SlowPeerPolicy(after_checks=3, ladder=(Step(action="restart_unit", verify_within_s=120),))
    phantom_jobs: PhantomPolicy = PhantomPolicy(ladder=(Step(action="http_admin", verify_within_s=120),))
    idle_jobs: IdleJobsPolicy = IdleJobsPolicy()
    stuck_process: StuckPolicy = StuckPolicy()
    peer_partitioned: PartitionPolicy = PartitionPolicy()
    peers_below_target: TargetPolicy = TargetPolicy()
    capacity_short: KindPolicy = KindPolicy(ladder=(Step(action="spawn_worker", attempts=3, verify_within_s=120),))
    capacity_surplus: KindPolicy = KindPolicy(ladder=(Step(action="terminate_worker", verify_within_s=120),))
    queue_stalled: StalledPolicy = StalledPolicy()
    stuck_spawning: WorkerPolicy = WorkerPolicy(ladder=(Step(action="terminate_worker", attempts=2, verify_within_s=120),))
    stale_heartbeat: WorkerPolicy = WorkerPolicy(after_s=600, ladder=(Step(action="terminate_worker", verify_within_s=120),))
    orphaned_tasks: KindPolicy = KindPolicy(ladder=(Step(action="requeue_tasks", verify_within_s=120),))
    unrecorded_worker: WorkerPolicy = WorkerPolicy(ladder=(Step(action="terminate_worker", verify_within_s=120),))
    vanished_worker: KindPolicy = KindPolicy(ladder=(Step(action="mark_worker_ended", verify_within_s=120),))
    burn_in: BurnInPolicy = BurnInPolicy()
    burn_in_failed: KindPolicy = KindPolicy(ladder=(Step(action="terminate_worker", attempts=2, verify_within_s=120),))
    repeat_offender: RepeatPolicy = RepeatPolicy()
    control_plane_behind: BehindPolicy = BehindPolicy()
    samples_lost: SamplesLostPolicy = SamplesLostPolicy()

    def of(self, kind: IncidentKind | str) -> KindPolicy:
        return getattr(self, IncidentKind(kind).value)


class FleetPolicy(_Strict):
    share: float = Field(default=0.3, gt=0, le=1, description="Share of the nodes seen lately with one kind open.")
    min_nodes: int = Field(default=3, ge=2, description="And at least this many nodes.")
    window_s: float = Field(default=600.0, gt=0)
    hold_s: float = Field(default=15.0, ge=0, description="A new node incident waits this long before its first action.")


class GatePolicy(_Strict):
    max_actions_per_node: int = Field(default=3, ge=1, le=100, description="Actions on one node within node_window_s.")
    node_window_s: float = Field(default=3600.0, gt=0)


class ActionPolicy(_Strict):
    mode: Mode = Field(
        default="enforce",
        description="observe: the remediator decides and records, never runs it. The remediator's own "
        "GPUMEDIC_REMEDIATOR_MODE=observe overrides every action.",
    )


class KillPolicy(ActionPolicy):
    grace_s: float = Field(default=10.0, ge=0, le=300, description="SIGTERM, this long to exit, then SIGKILL.")


class NodeScoped(_Strict):
    """An allow-list entry that may be limited to some nodes."""

    nodes: tuple[str, ...] = Field(
        default=(),
        description="Where it may be used: node selectors (NODE, group:NAME, label:KEY=VALUE); empty: every node.",
    )

    @field_validator("nodes")
    @classmethod
    def _selectors(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for text in value:
            NodeSelector(text)
        return value

    def allowed_on(self, node_id: str, group: str | None, labels: Mapping[str, str] | None) -> bool:
        return not self.nodes or selects(tuple(map(NodeSelector, self.nodes)), node_id, group, labels)


def loopback_url(value: str, name: str) -> str:
    if not HEALTH_URL.match(value):
        raise ValueError(f"{name} {value[:100]!r} must be http://127.0.0.1|localhost|[::1][:port][/plain/path]")
    return value


class UnitRule(NodeScoped):
    health_url: str | None = Field(
        default=None, description="Checked with curl on the node after the restart, e.g. http://127.0.0.1:9400/healthz."
    )

    @field_validator("health_url")
    @classmethod
    def _loopback(cls, value: str | None) -> str | None:
        return value if value is None else loopback_url(value, "health_url")


class RestartPolicy(ActionPolicy):
    units: dict[str, UnitRule] = Field(
        default_factory=lambda: {SAMPLER_UNIT: UnitRule()},
        description="The allow-list: only these units are ever restarted.",
    )

    @field_validator("units")
    @classmethod
    def _unit_names(cls, value: dict[str, UnitRule]) -> dict[str, UnitRule]:
        for unit in value:
            if not re.match(UNIT_PATTERN, unit):
                raise ValueError(f"{unit[:100]!r} is not a systemd service name (letters, digits, :_.@-, ending .service)")
        return value


BODY_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
BODY_FIELDS = frozenset({"node_id"})
"""What an admin endpoint's body may be filled with, from the incident."""
BODY_TEXT = re.compile(r"^[A-Za-z0-9 _.:/@-]{0,128}$")


class AdminEndpoint(NodeScoped):
    url: str = Field(description="POSTed with curl on the node it is called on, e.g. http://127.0.0.1:8770/force_election.")
    target: Literal["node", "leader"] = Field(
        default="node",
        description="Where it is called: on the incident's node, or on the peer cluster's leader as the detector knows "
        "it (the runbook resets a node's job count on the leader).",
    )
    body: dict[str, str] = Field(
        default_factory=dict,
        description="The JSON object POSTed, each value a text that may name {node_id} (the incident's node), e.g. "
        '{node_id: "{node_id}"}; no other placeholders, plain characters only.',
    )

    @field_validator("url")
    @classmethod
    def _loopback(cls, value: str) -> str:
        return loopback_url(value, "url")

    @field_validator("body")
    @classmethod
    def _template(cls, value: dict[str, str]) -> dict[str, str]:
        if len(value) > 8:
            raise ValueError("a body of at most 8 fields")
        for key, text in value.items():
            if not BODY_KEY.match(key):
                raise ValueError(f"{key[:100]!r} is not a body field name (letters, digits, _)")
            try:
                parts = list(string.Formatter().parse(text))
            except ValueError as exc:
                raise ValueError(f"body.{key}: {text[:100]!r} is not a template ({exc})") from None
            for literal, field, spec, conversion in parts:
                if not BODY_TEXT.match(literal):
                    raise ValueError(f"body.{key}: {literal[:100]!r} has characters other than letters, digits and ' _.:/@-'")
                if field is not None and (field not in BODY_FIELDS or spec or conversion):
                    raise ValueError(f"body.{key}: {{{field}}} is not a placeholder it may use ({', '.join(sorted(BODY_FIELDS))})")
        return value

    def fill(self, node_id: str) -> dict[str, str]:
        """The body for an incident on `node_id`."""
        return {key: text.format(node_id=node_id) for key, text in self.body.items()}


class AdminPolicy(ActionPolicy):
    endpoints: dict[str, AdminEndpoint] = Field(
        default_factory=dict, description="The closed list: only these endpoints are ever called, by name."
    )

    @field_validator("endpoints")
    @classmethod
    def _names(cls, value: dict[str, AdminEndpoint]) -> dict[str, AdminEndpoint]:
        for name in value:
            if not re.match(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not an endpoint name (lower-case letters, digits and _)")
        return value


class JobRestart(NodeScoped):
    """One job the remediator may start again after a verified kill: exactly one of a systemd unit
    (restarted, then `systemctl is-active`) or an executable (an absolute path, run without arguments)."""

    unit: str | None = Field(default=None, pattern=UNIT_PATTERN, description="e.g. selfplay.service")
    command: str | None = Field(default=None, description="e.g. /opt/selfplay/bin/restart (exit 0: started)")

    @field_validator("command")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and (not CHECK_COMMAND.match(value) or "/../" in f"{value}/"):
            raise ValueError(f"command {value[:100]!r} must be an absolute path to an executable, no arguments, no '..'")
        return value

    @model_validator(mode="after")
    def _one_of(self) -> JobRestart:
        if (self.unit is None) == (self.command is None):
            raise ValueError("give exactly one of unit and command")
        return self


class RestartJobPolicy(ActionPolicy):
    jobs: dict[str, JobRestart] = Field(default_factory=dict, description="The allow-list, by name: only these are ever started.")

    @field_validator("jobs")
    @classmethod
    def _names(cls, value: dict[str, JobRestart]) -> dict[str, JobRestart]:
        for name in value:
            if not re.match(ENDPOINT_PATTERN, name):
                raise ValueError(f"{name[:100]!r} is not a job name (lower-case letters, digits and _)")
        return value


class PrunePolicy(ActionPolicy):
    volumes: bool = Field(default=False, description="Whether a prune may remove unused volumes (data!).")


class DrainPolicy(ActionPolicy):
    hook_url: str | None = Field(
        default=None,
        description="Your scheduler's drain hook: the remediator POSTs {node_id, drained, reason, incident_id, "
        "action_id} here on every drain and undrain, with the bearer token of GPUMEDIC_REMEDIATOR_HOOK_TOKEN_FILE.",
    )

    @field_validator("hook_url")
    @classmethod
    def _plain_url(cls, value: str | None) -> str | None:
        if value is not None and not HOOK_URL.match(value):
            raise ValueError(f"hook_url {value[:100]!r} must be a plain http(s)://host[:port][/path] (no user, query or fragment)")
        return value


class UndrainPolicy(ActionPolicy):
    check_command: str | None = Field(
        default=None,
        description="An executable on the node that exits 0 when it may take jobs again (e.g. a short GPU burn), "
        "run before the undrain; absolute path, no arguments.",
    )
    dcgm_diag: Literal[0, 1, 2] = Field(
        default=1,
        description="DCGM's diagnostics (`dcgmi diag -r N`) before the undrain, where the node has DCGM: 1 (about a "
        "minute), 2 (a few, with short PCIe and memory tests), 0: never. A failed test keeps the node drained.",
    )
    dcgm_diag_timeout_s: float = Field(default=900.0, gt=0, le=3600, description="How long the diagnostics may run.")

    @field_validator("check_command")
    @classmethod
    def _plain_path(cls, value: str | None) -> str | None:
        if value is not None and (not CHECK_COMMAND.match(value) or "/../" in f"{value}/" or "/./" in f"{value}/"):
            raise ValueError(f"check_command {value[:100]!r} must be an absolute path of plain names, without arguments")
        return value


class SpawnPolicy(ActionPolicy):
    gpu_types: tuple[str, ...] = Field(
        default=(), description="The provider's GPU types a worker may be rented with; empty: no worker is ever rented."
    )
    max_gpus: int = Field(default=8, ge=1, le=8, description="GPUs per rented worker, at most.")
    max_count: int = Field(default=4, ge=1, le=16, description="Workers rented by one action, at most.")


class TerminatePolicy(ActionPolicy):
    max_count: int = Field(default=4, ge=1, le=16, description="Workers ended by one action, at most.")


class RestartWorkerPolicy(ActionPolicy):
    back_within_s: float = Field(
        default=600.0, gt=0, le=3600,
        description="How long the restarted pod has to be running again (the provider's start time past the request's).",
    )
    poll_s: float = Field(default=10.0, gt=0, le=300, description="How often the provider is asked meanwhile.")


SQL_PARAM = re.compile(r":([A-Za-z_][A-Za-z0-9_]*)")


class TaskDbPolicy(ActionPolicy):
    """A write to the user's task database (GPUMEDIC_REMEDIATOR_TASK_DB_URL_FILE): one statement,
    written here by the operator, whose only parameter is bound by the driver, never formatted in."""

    statement: str | None = Field(default=None, max_length=2000, description="The SQL statement; null: never run.")
    parameter: ClassVar[str] = ""

    @model_validator(mode="after")
    def _one_bound_parameter(self) -> TaskDbPolicy:
        if self.statement is not None and set(SQL_PARAM.findall(self.statement)) != {self.parameter}:
            raise ValueError(f"the statement must use exactly one bound parameter, :{self.parameter}")
        return self


class RequeuePolicy(TaskDbPolicy):
    parameter: ClassVar[str] = "task_ids"


class MarkEndedPolicy(TaskDbPolicy):
    parameter: ClassVar[str] = "worker_id"


class AcceptPolicy(MarkEndedPolicy):
    """A new worker's on-node checks, then its promotion (`statement`, e.g. the runbook's
    `UPDATE workers SET status = 'active' WHERE id = :worker_id`; null: nothing is promoted)."""

    dcgm_diag: Literal[0, 1, 2] = Field(default=1, description="DCGM's diagnostics level where the node has DCGM; 0: never.")
    dcgm_diag_timeout_s: float = Field(default=900.0, gt=0, le=3600, description="How long the diagnostics may run.")


class Actions(_Strict):
    """Per catalogue operation: observe or enforce, and its own limits."""

    kill_gpu_processes: KillPolicy = KillPolicy()
    restart_unit: RestartPolicy = RestartPolicy()
    gpu_reset: ActionPolicy = ActionPolicy()
    docker_prune: PrunePolicy = PrunePolicy()
    reboot_node: ActionPolicy = ActionPolicy(mode="observe")
    http_admin: AdminPolicy = AdminPolicy()
    restart_job: RestartJobPolicy = RestartJobPolicy()
    drain_node: DrainPolicy = DrainPolicy()
    undrain_node: UndrainPolicy = UndrainPolicy()
    spawn_worker: SpawnPolicy = SpawnPolicy()
    terminate_worker: TerminatePolicy = TerminatePolicy()
    restart_worker: RestartWorkerPolicy = RestartWorkerPolicy()
    requeue_tasks: RequeuePolicy = RequeuePolicy()
    mark_worker_ended: MarkEndedPolicy = MarkEndedPolicy()
    accept_worker: AcceptPolicy = AcceptPolicy()

    def of(self, operation: str) -> ActionPolicy:
        return getattr(self, operation)


class ValidationPolicy(_Strict):
    """Before a drained node gets jobs again: how many samples in a row must show its GPUs free and
    healthy (present, no process, memory under preflight.max_memory_mib, nothing pending a reset),
    and how long to wait for them before a person must look (the node stays drained)."""

    ready_samples: int = Field(default=3, ge=1, le=100, description="Healthy samples in a row.")
    within_s: float = Field(default=900.0, gt=0, description="Escalate if they have not come by then.")


class PreflightPolicy(_Strict):
    """When `gpumedic preflight` calls a GPU ready for the next job, and what `--clean` may remove."""

    max_memory_mib: int = Field(default=1024, ge=0, description="More memory in use than this: not ready.")
    idle_util_pct: float = Field(
        default=5, ge=0, le=100, description="--clean kills leftovers only on a GPU at most this busy (never a live job)."
    )
    ignore_holders: tuple[str, ...] = Field(
        default=("nvidia-persistenced", "nv-hostengine", "dcgm-exporter", "nvidia-smi", "gpumedic-node-s"),
        description="Daemons that keep /dev/nvidiaN open without blocking a job (by their 15-character comm); "
        "never counted, never killed.",
    )
    min_free_disk_gib: float = Field(
        default=10, ge=0, description="Less free than this on Docker's data directory (else /): not ready; 0: not checked "
        "(runbook 004, before a run: df -h /var/lib/docker).",
    )
    min_available_memory_gib: float = Field(
        default=2, ge=0, description="Less host memory available than this (MemAvailable): not ready; 0: not checked "
        "(runbook 004, before a run: free -h).",
    )


class StatusFields(_Strict):
    """JMESPath expressions (jmespath.org) that read a peer daemon's `GET /status`. The cluster's
    fields are read from the document; the `peer_*` fields from each value of a `peers` object
    keyed by node id (a list of ids carries no more than the ids). `not_null(a, b)` takes the first
    field present, so one preset reads several spellings."""

    node_id: str = Field(description="The answering peer's own node id.")
    leader: str = Field(description="The leader it follows; null when it knows none.")
    role: str
    peers: str = Field(description="Its peers: a list of node ids (those it sees alive) or an object keyed by node id.")
    voters_alive: str = Field(description="The voters it counts alive (a number), or the list of their ids.")
    voters_total: str = Field(description="The voters the cluster has.")
    quorum: str = Field(description="Its own verdict on quorum (a boolean), used when it reports no voters.")
    uptime_s: str
    peer_alive: str = Field(description="Whether it counts that peer alive (absent: alive, as it is listed).")
    peer_voter: str = Field(description="Whether that peer votes.")
    peer_jobs: str = Field(description="The jobs that peer runs, as this daemon knows (the leader's view).")
    peer_gpu_percent: str = Field(description="That peer's GPU utilisation in percent, as this daemon knows.")

    @field_validator("*")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            jmespath.compile(value)
        except JMESPathError as exc:
            raise ValueError(f"{value!r} is not a JMESPath expression ({str(exc).splitlines()[0]})") from None
        return value


STATUS_PRESETS: dict[str, StatusFields] = {
    # The runbooks' daemon: `curl -s http://leader:8770/status | jq '.peers["NODE_ID"]'`, each peer
    # with its `selfplay_jobs` and `gpu_percent`; the other names as such daemons spell them.
    "runbook": StatusFields(
        node_id="not_null(node_id, self.node_id, node)",
        leader="not_null(leader_id, leader)",
        role="not_null(role, state)",
        peers="peers",
        voters_alive="not_null(voters_alive, alive_voters, voters.alive, voters)",
        voters_total="not_null(voters_total, total_voters, voters.total, voter_count)",
        quorum="not_null(quorum_ok, has_quorum, quorum)",
        uptime_s="not_null(uptime_s, uptime_seconds, uptime)",
        peer_alive="not_null(alive, is_alive)",
        peer_voter="not_null(is_voter, voter)",
        peer_jobs="not_null(selfplay_jobs, jobs)",
        peer_gpu_percent="not_null(gpu_percent, gpu_utilization)",
    ),
    # gpumedic's first shape: `peers` a list of the ids seen alive, voters as two numbers.
    "plain": StatusFields(
        node_id="node_id", leader="leader", role="role", peers="peers", voters_alive="voters", voters_total="voters_total",
        quorum="quorum", uptime_s="uptime_s", peer_alive="alive", peer_voter="voter", peer_jobs="jobs", peer_gpu_percent="gpu_percent",
    ),
}


class PeerStatusPolicy(_Strict):
    """How leader-health reads the peer daemons' `/status`: a preset, and any field changed."""

    preset: Literal["runbook", "plain"] = "runbook"
    fields: dict[str, str] = Field(default_factory=dict, description="Expressions that replace the preset's, by field name.")

    @model_validator(mode="after")
    def _fields_are_known(self) -> PeerStatusPolicy:
        self.expressions()
        return self

    def expressions(self) -> StatusFields:
        unknown = sorted(set(self.fields) - set(StatusFields.model_fields))
        if unknown:
            raise ValueError(f"unknown field(s) {', '.join(unknown)}; a status has: {', '.join(StatusFields.model_fields)}")
        return StatusFields.model_validate({**STATUS_PRESETS[self.preset].model_dump(), **self.fields})


class Policy(_Strict):
    version: Literal[1] = 1
    fleet: FleetPolicy = FleetPolicy()
    gate: GatePolicy = GatePolicy()
    actions: Actions = Actions()
    preflight: PreflightPolicy = PreflightPolicy()
    validation: ValidationPolicy = ValidationPolicy()
    peer_status: PeerStatusPolicy = PeerStatusPolicy()
    kinds: Kinds = Kinds()

    def of(self, kind: IncidentKind | str) -> KindPolicy:
        return self.kinds.of(kind)

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
        job = self.kinds.zombie_job.restart_job
        if job is not None and job not in self.actions.restart_job.jobs:
            raise ValueError(f"kinds.zombie_job restarts the job {job}, which actions.restart_job.jobs does not list; add it there")
        units = {"node_silent": self.kinds.node_silent.sampler_unit}
        units |= {name: getattr(self.kinds, name).daemon_unit for name in ("peer_blocked", "peer_down", "slow_peer")}
        for name, unit in units.items():
            restarts = any(step.action == "restart_unit" for step in getattr(self.kinds, name).ladder)
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
