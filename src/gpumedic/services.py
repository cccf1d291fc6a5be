"""The six services by name, and the package whose `main.run` starts each: light to import, so
the CLI starts fast (`gpumedic.stack`, which runs them, pulls in the bus)."""

SERVICES: dict[str, str] = {
    "node-sampler": "node_sampler",
    "zombie-detector": "zombie_detector",
    "leader-health": "leader_health",
    "autoscaler": "autoscaler",
    "remediator": "remediator",
    "report-builder": "report_builder",
}
"""Service name -> the package whose `main.run` starts it."""
