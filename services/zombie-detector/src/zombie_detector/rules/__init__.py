"""Every node rule, registered in one table. A new incident kind is a module here and a line in
`build_rules`; the lifecycle, fleet correlation and silences come with the book."""

from __future__ import annotations

from gpumedic_incidents import Policy
from zombie_detector.rules.base import Incidents, Rule
from zombie_detector.rules.checks import CheckRule
from zombie_detector.rules.control_plane import BehindRule, SamplesLostRule
from zombie_detector.rules.container import ContainerRule
from zombie_detector.rules.container_rate import ContainerRateRule
from zombie_detector.rules.files import FileRule
from zombie_detector.rules.gpu_health import GpuHealthRule
from zombie_detector.rules.gpu_lost import GpuLostRule
from zombie_detector.rules.host import HostRule
from zombie_detector.rules.job import JobRule
from zombie_detector.rules.logs import LogRule
from zombie_detector.rules.nic import NicRule
from zombie_detector.rules.node import NodeRule
from zombie_detector.rules.orphan import OrphanRule
from zombie_detector.rules.phantom import PhantomRule
from zombie_detector.rules.readiness import ReadinessRule
from zombie_detector.rules.straggler import StragglerRule
from zombie_detector.rules.stuck import StuckRule
from zombie_detector.rules.xid import XidRule
from zombie_detector.rules.zombie import ZombieRule


def build_rules(policy: Policy) -> list[Rule]:
    """The node rules, each with its part of the policy."""
    kinds = policy.kinds
    jobs = JobRule(kinds.job_hung, policy.actions.stop_job)  # the ranks of a job across nodes are its, not the per-rank rules'
    zombie = ZombieRule(kinds.zombie_job, policy.actions.kill_gpu_processes, pattern_kill=policy.actions.kill_pattern,
                        rank_of_wider_job=jobs.spans_nodes)
    return [
        jobs,
        zombie,
        OrphanRule(kinds.orphan_gpu_holder, policy.actions.kill_gpu_processes),
        PhantomRule(kinds.phantom_jobs, kinds.idle_jobs, policy.actions.http_admin),
        StuckRule(kinds.stuck_process, policy.actions.kill_gpu_processes, rank_of_wider_job=jobs.spans_nodes, zombie_counting=zombie.counting),
        XidRule(kinds.gpu_xid),
        GpuLostRule(),
        GpuHealthRule(kinds.gpu_thermal, kinds.gpu_throttled, kinds.ecc_errors, kinds.row_remap, kinds.pcie_degraded, kinds.nvlink_degraded),
        StragglerRule(kinds.gpu_straggler),
        NicRule(kinds.nic_degraded, kinds.nic_flapping),
        FileRule(kinds.file_missing),
        CheckRule(kinds.check_failed),
        LogRule(kinds.log_pattern),
        ContainerRule(kinds.container_died, stopping=jobs.stopping),
        ContainerRateRule(kinds.container_died, stopping=jobs.stopping),
        HostRule(kinds.disk_pressure, kinds.host_memory_pressure),
        NodeRule(kinds.node_silent, kinds.ssh_unreachable, behind=kinds.control_plane_behind),
        BehindRule(kinds.control_plane_behind),
        SamplesLostRule(kinds.samples_lost),
        ReadinessRule(policy.preflight),
    ]


DECIDERS: tuple[type, ...] = (JobRule, PhantomRule, StragglerRule, FileRule, ContainerRateRule, BehindRule, SamplesLostRule)
"""The rules that compare a node with the rest of the fleet or read the fleet's own facts (a job's
ranks on several nodes, a cluster leader's count of each node's jobs, a GPU model's speed, the
copy of a file most nodes have, the container deaths' rate, the services' lag, the bus's losses):
the decider runs them, over every sample. The others look at one node at a time: detector cells
run them over their partitions (`zombie_detector.cell`)."""


def decider_rules(policy: Policy) -> list[Rule]:
    return [rule for rule in build_rules(policy) if isinstance(rule, DECIDERS)]


__all__ = ["DECIDERS", "Incidents", "Rule", "build_rules", "decider_rules"]
