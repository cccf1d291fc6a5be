"""The fleet's nodes as gpumedic reaches them: the inventory and SSH. The remediator acts through
them; the operator's commands (`gpumedic inventory`, `gpumedic report`) check them read-only."""
