"""Whole runs on the simulated fleet: scenarios and their scoring, the demo, the simulation, chaos,
and a fleet served for a control plane elsewhere."""
