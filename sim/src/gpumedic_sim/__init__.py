"""The simulated GPU fleet: nodes that answer what real nodes answer, with scripted faults.

Three wings over one table. `faults` is the table of what can be scripted (and the answer key);
`machine/` stands where a node's own interfaces would be (NVML, /proc, the kernel log, the Docker
engine, SSH, the peer daemon's status endpoint), `fleet/` holds the nodes together with a
provider and a task queue, and `runs/` scripts and scores whole runs (scenarios, the demo, the
simulation, chaos, a fleet served for compose). Each wing imports only those below it, and only
`runs/` and the command entry (`commands`) import the CLI's stack.

Part of the product: the demo runs on it, and the tests use it to drive the real services. See
`SimFleet` (the fleet and its inventory files) and `SimNode` (one node and its fault helpers).
"""

import importlib

_WHERE = {
    "SSH_USER": "fleet.nodes", "SimFleet": "fleet.nodes", "SimNode": "machine.node", "CommandResult": "machine.ssh", "interpret": "machine.ssh",
    **dict.fromkeys(("CLK_TCK", "GPU_NAME", "GPU_TOTAL_MIB", "SimGpu", "SimProcess"), "machine.parts"),
    **dict.fromkeys(("Benign", "FAULTS", "Fault", "InjectedFault"), "faults"),
}


def __getattr__(name: str):
    # imported when first asked for: the CLI loads this package's commands without the fleet
    if name in _WHERE:
        return getattr(importlib.import_module(f"gpumedic_sim.{_WHERE[name]}"), name)
    raise AttributeError(f"module 'gpumedic_sim' has no attribute {name!r}")


__all__ = [
    "CLK_TCK",
    "FAULTS",
    "GPU_NAME",
    "GPU_TOTAL_MIB",
    "SSH_USER",
    "Benign",
    "CommandResult",
    "Fault",
    "InjectedFault",
    "SimFleet",
    "SimGpu",
    "SimNode",
    "SimProcess",
    "interpret",
]
