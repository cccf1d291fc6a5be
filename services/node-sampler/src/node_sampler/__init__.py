"""node-sampler: runs on every GPU node and publishes one `NodeSampled` per interval.

Its sources (NVML, the process table, job probes) sit behind small interfaces, so the simulated
node in `gpumedic_sim` can stand where NVML and /proc would be while this code runs unchanged.
"""
