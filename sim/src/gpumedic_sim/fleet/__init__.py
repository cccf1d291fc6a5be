"""The simulated fleet: the nodes and their inventory files (`nodes`), a provider served over
RunPod's API (`runpod`), and the rented worker pool with its task queue (`workers`, `pool`)."""
