"""The pace of a run on the simulated fleet: the stack's rounds and the policy in seconds instead
of the runbooks' minutes, the remediator enforcing and traces on the bus, so that a story that
takes an hour on a real fleet takes a minute. The demo, the simulation and chaos run at it."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

from gpumedic_incidents import Policy
from gpumedic_incidents.policy import FleetPolicy, Kinds, Step, ZombiePolicy, dump_policy

ZOMBIE_AFTER_S = 5.0


DEMO_POLICY = Policy(
    fleet=FleetPolicy(hold_s=2),
    kinds=Kinds(
        zombie_job=ZombiePolicy(
            idle_for_s=ZOMBIE_AFTER_S,
            action_timeout_s=60,
            ladder=(Step(action="kill_gpu_processes", attempts=2, verify_within_s=10),),
        )
    ),
)
"""The shipped policy with the demo's seconds instead of the runbooks' minutes."""


def demo_env(fleet_env: Mapping[str, str], workdir: Path) -> dict[str, str]:
    """Settings that make a run's story take seconds instead of the production minutes, for a stack
    that watches the fleet `fleet_env` locates (`SimFleet.control_plane_env`); the policy file goes
    into `workdir`, beside the fleet's files."""
    policy_file = workdir / "policy.yaml"
    workdir.mkdir(parents=True, exist_ok=True)
    dump_policy(DEMO_POLICY, policy_file)
    return {
        **fleet_env,
        "GPUMEDIC_SAMPLER_INTERVAL_S": "5",
        "GPUMEDIC_POLICY_FILE": str(policy_file),
        "GPUMEDIC_REMEDIATOR_MODE": "enforce",
        "GPUMEDIC_REMEDIATOR_SSH_CHECK_INTERVAL_S": "10",
        "GPUMEDIC_LEADER_INTERVAL_S": "5",
        "GPUMEDIC_AUTOSCALER_INTERVAL_S": "5",
        **{f"GPUMEDIC_{svc}_TRACE_TO_BUS": "true" for svc in ("SAMPLER", "DETECTOR", "LEADER", "AUTOSCALER", "REMEDIATOR", "REPORTS")},
    }
