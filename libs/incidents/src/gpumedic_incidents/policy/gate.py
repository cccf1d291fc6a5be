"""The policy's `fleet`, `gate`, `validation` and `preflight`: when a signal is the fleet's, how many
actions a node may take, and when a GPU is free and healthy."""

from __future__ import annotations

from pydantic import Field

from gpumedic_incidents.policy.base import Strict

class FleetPolicy(Strict):
    share: float = Field(default=0.3, gt=0, le=1, description="Share of the nodes seen lately with one kind open.")
    min_nodes: int = Field(default=3, ge=2, description="And at least this many nodes.")
    window_s: float = Field(default=600.0, gt=0)
    hold_s: float = Field(default=15.0, ge=0, description="A new node incident waits this long before its first action.")


class GatePolicy(Strict):
    max_actions_per_node: int = Field(default=3, ge=1, le=100, description="Actions on one node within node_window_s.")
    node_window_s: float = Field(default=3600.0, gt=0)


class ValidationPolicy(Strict):
    """Before a drained node gets jobs again: how many samples in a row must show its GPUs free and
    healthy (present, no process, memory under preflight.max_memory_mib, nothing pending a reset),
    and how long to wait for them before a person must look (the node stays drained)."""

    ready_samples: int = Field(default=3, ge=1, le=100, description="Healthy samples in a row.")
    within_s: float = Field(default=900.0, gt=0, description="Escalate if they have not come by then.")


class PreflightPolicy(Strict):
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
