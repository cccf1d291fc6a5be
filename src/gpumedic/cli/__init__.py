"""`gpumedic`: the front door. Start the embedded stack, run one service, read incidents.

`core` is the frame (the group, how a command is registered, the shared options, `main`); each
other module registers one group of commands when imported: `stack` (up, run, migrate, init,
policy, proto), `records` (incidents, actions, report, drained, cluster, cost, silence), `nodes`
(inventory, enroll, unenroll, preflight, provision) and `control` (breaker, pause, resume,
dead-letters). Installed packages add theirs through the `gpumedic.commands` entry points.
"""

from gpumedic.cli import control, nodes, records, stack  # noqa: F401  (each registers its commands)
from gpumedic.cli.core import DEFAULT_VAR, EXTENSIONS, PATH, cluster_option, command, fleet_options, main, replicas_option, run_until_done

__all__ = ["DEFAULT_VAR", "EXTENSIONS", "PATH", "cluster_option", "command", "fleet_options", "main", "replicas_option", "run_until_done"]
