"""`gpumedic inventory`: can gpumedic reach every node of the inventory, and does each have the
tools the remediator's catalogue calls? A login and one `which` per node, nothing else runs."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from pathlib import Path

from gpumedic_nodes.inventory import InventoryError, load_inventory
from gpumedic_nodes.ssh import NodeError, SshExecutor


def failure_of(exc: Exception) -> tuple[str, str]:
    """(cause, detail) of a failed login, in NodeSshChecked's words."""
    if isinstance(exc, NodeError):
        return exc.code, exc.cause
    if isinstance(exc, InventoryError):
        return "not_in_inventory", str(exc)
    return "unreachable", f"{type(exc).__name__}: {exc}"[:300]


TOOLS = {
    "nvidia-smi": "kill_gpu_processes and gpu_reset fail",
    "fuser": "gpu_reset is refused (no way to see who holds the GPU)",
    "systemctl": "restart_unit and reboot_node fail",
    "docker": "docker_prune fails",
    "curl": "restart_unit cannot check a health URL",
}
TOOLS_PROBE = "which " + " ".join(TOOLS)
"""Read-only: which of the tools the catalogue calls the node's login shell finds."""


@dataclass(frozen=True)
class NodeCheck:
    """What `gpumedic inventory check` found on one node."""

    node_id: str
    address: str
    cause: str
    """ok, or why the login failed (NodeSshChecked's causes)."""
    detail: str = ""
    missing: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.cause == "ok"


async def check_inventory(executor: SshExecutor, inventory: Path, *, concurrency: int = 16) -> list[NodeCheck]:
    """Log in to every node of the inventory and ask which catalogue tools it has; runs nothing else.
    Raises InventoryError when the file itself cannot be used."""
    nodes = load_inventory(inventory)
    limit = asyncio.Semaphore(concurrency)

    async def check(node_id: str) -> NodeCheck:
        where = nodes[node_id].describe()
        async with limit:
            try:
                result = await executor.run(node_id, TOOLS_PROBE)
            except Exception as exc:  # never let one node stop the check
                return NodeCheck(node_id, where, *failure_of(exc))
        found = {line.strip().rsplit("/", 1)[-1] for line in result.stdout.splitlines()}
        return NodeCheck(node_id, where, "ok", missing=tuple(tool for tool in TOOLS if tool not in found))

    return list(await asyncio.gather(*(check(node) for node in sorted(nodes))))


def check_report(checks: list[NodeCheck]) -> str:
    """The check's table: one line per node, what is missing and what that breaks, then a summary."""
    width = max((len(c.node_id) for c in checks), default=0)
    lines = []
    for c in checks:
        head = f"{c.node_id:<{width}}  {c.address}  "
        if not c.ok:
            lines.append(f"{head}FAIL {c.cause}: {c.detail}")
            continue
        lines.append(f"{head}ok")
        lines.extend(f"{'':<{width}}    no {tool}: {TOOLS[tool]}" for tool in c.missing)
    failing = sum(not c.ok for c in checks)
    lines.append(f"{len(checks)} node(s): {len(checks) - failing} reachable, {failing} failing")
    return "\n".join(lines)
