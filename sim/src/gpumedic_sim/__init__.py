"""The simulated GPU fleet: nodes that answer what real nodes answer, with scripted faults.

Part of the product: the demo runs on it, and the tests use it to drive the real services. See
`SimFleet` (the fleet and its inventory files) and `SimNode` (one node and its fault helpers).
"""

import importlib

_WHERE = {
    "SSH_USER": "fleet", "SimFleet": "fleet", "SimNode": "node", "CommandResult": "ssh", "interpret": "ssh",
    **dict.fromkeys(("CLK_TCK", "GPU_NAME", "GPU_TOTAL_MIB", "SimGpu", "SimProcess"), "state"),
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
