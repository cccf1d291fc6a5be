"""The simulated GPU fleet: nodes that answer what real nodes answer, with scripted faults.

Part of the product: the demo runs on it, and the tests use it to drive the real services. See
`SimFleet` (the fleet and its inventory files) and `SimNode` (one node and its fault helpers).
"""

from gpumedic_sim.fleet import SSH_USER, SimFleet
from gpumedic_sim.node import SimNode
from gpumedic_sim.ssh import CommandResult, interpret
from gpumedic_sim.state import CLK_TCK, GPU_NAME, GPU_TOTAL_MIB, Fault, InjectedFault, SimGpu, SimProcess

__all__ = [
    "CLK_TCK",
    "GPU_NAME",
    "GPU_TOTAL_MIB",
    "SSH_USER",
    "CommandResult",
    "Fault",
    "InjectedFault",
    "SimFleet",
    "SimGpu",
    "SimNode",
    "SimProcess",
    "interpret",
]
