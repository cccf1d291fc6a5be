"""The remediator: the only gpumedic service with side effects on nodes, behind one gate and one ledger."""
