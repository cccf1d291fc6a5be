"""The policy's `kinds`: per incident kind, its thresholds and its remediation ladder (what every
kind has is in `ladder`; the operator's own checks and log patterns in `operator`)."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from gpumedic_events import ENDPOINT_PATTERN, UNIT_PATTERN, WHOLE_KINDS, IncidentKind
from gpumedic_incidents.policy.base import SAMPLER_UNIT, Strict
from gpumedic_incidents.policy.ladder import KindPolicy, Step
from gpumedic_incidents.policy.operator import CheckFailedPolicy, LogPatternPolicy


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
    kill_pattern: str | None = Field(
        default=None, pattern=ENDPOINT_PATTERN,
        description="The pattern of actions.kill_pattern.patterns that a kill_pattern step of the ladder ends (runbook 000's "
        "pkill -f 'python.*selfplay', when the job's launcher starts its killed processes again); null: none.",
    )


class JobHungPolicy(_IdleBelow):
    """Most ranks of a job across nodes idle together, none writing, for `idle_for_s`."""

    idle_for_s: float = Field(default=300.0, gt=0, description="How long most of the job's ranks idle together (NCCL's and "
                              "PyTorch's own watchdogs wait 10 to 30 minutes, and name no node).")
    idle_share: float = Field(default=0.75, gt=0.5, le=1, description="The share of the job's ranks seen that idle.")
    restart_job: str | None = Field(
        default=None, pattern=ENDPOINT_PATTERN,
        description="Once stop_job is verified (no rank of the job left on any node), start this job of "
        "actions.restart_job.jobs again without the node that stopped; null: the job's own launcher starts it again "
        "(torchrun's agents, a scheduler's requeue), or a person.",
    )
    restart_on: Literal["every_node", "first_node"] = Field(
        default="every_node",
        description="every_node: the restart runs on each node of the job but the one that stopped (a launcher agent per "
        "node, such as torchrun's in a systemd unit); first_node: once, on the node of the job's lowest rank but the one "
        "that stopped (one command starts the whole job: a scheduler's requeue, a head node's launch script).",
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


class NicDegradedPolicy(KindPolicy):
    """A port that was up is down, or runs below the highest rate it ran at (or `min_rate_gbps`)."""

    for_s: float = Field(default=60.0, ge=0, description="How long it stays so (a link retrains in seconds).")
    min_rate_gbps: float | None = Field(default=None, gt=0, description="Below this rate a port is degraded even with no sibling to compare.")


class FileMissingPolicy(KindPolicy):
    """An expected file missing on a node, or differing from the copy most nodes have, for `for_s`."""

    for_s: float = Field(default=300.0, ge=0, description="How long it stays so (a sync in progress takes a while).")


class NicFlappingPolicy(KindPolicy):
    """A link that went down `link_downs` times within `window_s`, or counts errors faster than `errors_per_hour`."""

    window_s: float = Field(default=3600.0, ge=60, le=86_400)
    link_downs: int = Field(default=2, ge=1, description="Times the link went down (link_downed) within the window.")
    errors_per_hour: float = Field(
        default=1000.0, gt=0, description="Symbol, receive, link-recovery, link-integrity and buffer-overrun errors per hour.",
    )


class StragglerPolicy(_BusyFrom):
    below_share: float = Field(
        default=0.85, gt=0, lt=1, description="A GPU whose SM clock or power is below this share of its siblings' median is slow."
    )
    min_siblings: int = Field(default=3, ge=2, description="Busy GPUs of the same job on the node to compare (itself included).")
    for_s: float = Field(default=60.0, ge=0, description="How long it stays slow.")


class NodeRatePolicy(Strict):
    """A node whose containers die far more often than the rest of the fleet's, judged like a black
    hole's tasks (`gpumedic_incidents.rates`) where no task database says how work ends: each
    container (by name) that ran on it within `window_s` is a try, one that died abnormally a failure."""

    window_s: float = Field(default=3600.0, ge=60, le=7 * 86_400, description="How far back containers are counted.")
    min_containers: int = Field(default=10, ge=2, description="Containers (by name) that ended on the node in the window before it is judged.")
    min_died: int = Field(default=3, ge=1, description="And died abnormally among them, at least.")
    min_ratio: float = Field(default=3.0, ge=1, description="Its rate at least this many times the rest of the fleet's.")
    alpha: float = Field(default=0.001, gt=0, lt=1, description="Shared among the nodes judged (Bonferroni).")


class ContainerPolicy(KindPolicy):
    settle_s: float = Field(default=10.0, ge=0, description="How long related facts may follow an exit.")
    node_rate: NodeRatePolicy | None = Field(
        default=NodeRatePolicy(), description="A node whose containers die far more than the fleet's (null: not judged)."
    )


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
    busy_after_intervals: float = Field(
        default=12.0, ge=1, description="The same for a node whose last sample said its sampler runs late (it missed "
        "ticks, was taken more than half an interval late, or its CPUs are pressed): a busy node's sampler waits for a CPU.",
    )
    sampler_unit: str = Field(
        default=SAMPLER_UNIT, pattern=UNIT_PATTERN, description="The node-sampler's systemd unit, which restart_unit restarts."
    )


class BehindPolicy(KindPolicy):
    after_s: float = Field(
        default=10.0, gt=0, description="A service whose newest handled sample is older than this while more wait is behind "
        "(two of the shipped 5 s intervals); it is caught up again below half of it.",
    )
    loop_lag_s: float = Field(
        default=2.0, gt=0, description="A service whose event loop has run later than this for 5 s is behind "
        "too: what it times (SSH logins, peer probes, silence) is its own lateness. Past 1 s it already judges no timeout.",
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


class BlockedPeerPolicy(PeerPolicy):
    backlog_from: int = Field(
        default=8, ge=1, description="Connections waiting unaccepted on the peer daemon's port, as its own node-sampler "
        "reads them (runbook 002: 26-33 on a blocked daemon), from which the first blocked round is enough, and a peer "
        "whose probe gets no TCP answer (its queue full) is a blocked daemon, not a host that is down.",
    )


class SlowPeerPolicy(PeerPolicy):
    slower_than_s: float = Field(
        default=5.0, gt=0, description="A /status answer slower than this is slow (the runbook restarts a daemon lagging > 5 s)."
    )


class UnknownPeerPolicy(KindPolicy):
    after_checks: int = Field(default=3, ge=1, description="Probe rounds in a row a stranger is counted before an incident.")


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


class BlackHolePolicy(KindPolicy):
    """A worker whose tasks fail far more than the rest of the pool's (`autoscaler.outcomes`): read
    from the task database's finished tasks (the demand's `outcomes_query`)."""

    min_tasks: int = Field(default=10, ge=2, description="Tasks a worker finished in the query's window before it is judged.")
    min_failed: int = Field(default=3, ge=1, description="And failed tasks among them, at least.")
    min_ratio: float = Field(default=3.0, ge=1, description="Its failure rate at least this many times the rest of the pool's.")
    alpha: float = Field(
        default=0.001, gt=0, lt=1,
        description="So many failures by chance (a one-sided binomial tail at the rest's rate) rarer than this, shared among "
        "the workers tested (Bonferroni).",
    )
    ladder: tuple[Step, ...] = (Step(action="drain_node"), Step(action="terminate_worker", attempts=2, verify_within_s=120))


class FailureJumpPolicy(KindPolicy):
    """The pool's failure rate now (black holes left out: they are their own incidents) against
    its rate `baseline_age_s` before, from the same outcomes query: a rise no worker explains."""

    baseline_age_s: float = Field(
        default=3600.0, ge=10, le=7 * 86_400,
        description="How old the rate compared with is: at least the outcomes query's window, so the two count different tasks.",
    )
    min_tasks: int = Field(default=20, ge=2, description="Tasks the pool finished in the window before it is judged.")
    min_failed: int = Field(default=5, ge=1, description="And failed tasks among them, at least.")
    min_ratio: float = Field(default=3.0, ge=1, description="Its failure rate at least this many times the baseline's.")
    alpha: float = Field(default=0.001, gt=0, lt=1, description="So many failures at the baseline's rate rarer than this (a binomial tail).")
    clear_after_s: float | None = Field(default=600.0, gt=0)


HARDWARE_KINDS = (
    IncidentKind.GPU_XID, IncidentKind.GPU_LOST, IncidentKind.ECC_ERRORS, IncidentKind.ROW_REMAP, IncidentKind.PCIE_DEGRADED,
    IncidentKind.NVLINK_DEGRADED, IncidentKind.BURN_IN_FAILED,
)
"""A GPU's hardware faults, and a failed burn-in: the same again on the same machine is the
machine, not bad luck."""


class RepeatRule(Strict):
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


class Kinds(Strict):
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
    peer_blocked: BlockedPeerPolicy = BlockedPeerPolicy(after_checks=2, ladder=(Step(action="restart_unit", verify_within_s=120),))
    peer_down: PeerPolicy = PeerPolicy(ladder=(Step(action="restart_unit", verify_within_s=120),))
    slow_peer: SlowPeerPolicy = SlowPeerPolicy(after_checks=3, ladder=(Step(action="restart_unit", verify_within_s=120),))
    phantom_jobs: PhantomPolicy = PhantomPolicy(ladder=(Step(action="http_admin", verify_within_s=120),))
    idle_jobs: IdleJobsPolicy = IdleJobsPolicy()
    stuck_process: StuckPolicy = StuckPolicy()
    peer_partitioned: PartitionPolicy = PartitionPolicy()
    peers_below_target: TargetPolicy = TargetPolicy()
    unknown_peer: UnknownPeerPolicy = UnknownPeerPolicy()
    capacity_short: KindPolicy = KindPolicy(ladder=(Step(action="spawn_worker", attempts=3, verify_within_s=120),))
    capacity_surplus: KindPolicy = KindPolicy(
        # none is ended if a worker chosen as idle took a task since: the surplus asks again
        ladder=(Step(action="terminate_worker", verify_within_s=120, wait_while_in_use_s=900, ask_again_every_s=60),)
    )
    queue_stalled: StalledPolicy = StalledPolicy()
    stuck_spawning: WorkerPolicy = WorkerPolicy(ladder=(Step(action="terminate_worker", attempts=2, verify_within_s=120),))
    stale_heartbeat: WorkerPolicy = WorkerPolicy(after_s=600, ladder=(Step(action="terminate_worker", verify_within_s=120),))
    orphaned_tasks: KindPolicy = KindPolicy(ladder=(Step(action="requeue_tasks", verify_within_s=120),))
    unrecorded_worker: WorkerPolicy = WorkerPolicy(ladder=(Step(action="terminate_worker", verify_within_s=120),))
    vanished_worker: KindPolicy = KindPolicy(ladder=(Step(action="mark_worker_ended", verify_within_s=120),))
    burn_in: BurnInPolicy = BurnInPolicy()
    burn_in_failed: KindPolicy = KindPolicy(ladder=(Step(action="terminate_worker", attempts=2, verify_within_s=120),))
    repeat_offender: RepeatPolicy = RepeatPolicy()
    black_hole: BlackHolePolicy = BlackHolePolicy()
    job_hung: JobHungPolicy = JobHungPolicy(ladder=(Step(action="drain_node"),))
    nic_degraded: NicDegradedPolicy = NicDegradedPolicy()
    nic_flapping: NicFlappingPolicy = NicFlappingPolicy()
    file_missing: FileMissingPolicy = FileMissingPolicy()
    check_failed: CheckFailedPolicy = CheckFailedPolicy()
    log_pattern: LogPatternPolicy = LogPatternPolicy()
    failure_jump: FailureJumpPolicy = FailureJumpPolicy()
    control_plane_behind: BehindPolicy = BehindPolicy()
    samples_lost: SamplesLostPolicy = SamplesLostPolicy()

    def of(self, kind: IncidentKind | str, key: str | None = None) -> KindPolicy:
        """The kind's settings; for one of the operator's checks or log patterns (`key`: its name), its own."""
        kind = IncidentKind(kind)
        if kind is IncidentKind.CHECK_FAILED:
            return self.check_failed.of(key)
        if kind is IncidentKind.LOG_PATTERN:
            return self.log_pattern.of(key)
        return getattr(self, kind.value)
