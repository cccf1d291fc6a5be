"""Where every CLI command finds the remediator's files (its inventory, known_hosts and client key):
the command's own option, else the remediator's setting (GPUMEDIC_REMEDIATOR_<NAME>), else the
embedded stack's under `--var` (`gpumedic up`'s VAR/ssh, `up --demo`'s VAR/demo/ssh, a simulated
fleet's VAR/fleet), else compose's place under /etc/gpumedic. One resolver, so `enroll`, `inventory`,
`report` and `silence --match group=` never look in different places for the same file."""

from __future__ import annotations

import os
from pathlib import Path

EMBEDDED = {
    "INVENTORY": ("ssh/inventory.yaml", "demo/ssh/inventory.yaml", "fleet/inventory.yaml"),
    "KNOWN_HOSTS": ("ssh/known_hosts", "demo/ssh/known_hosts", "fleet/known_hosts"),
    "CLIENT_KEY": ("ssh/id_ed25519", "demo/ssh/id_ed25519", "fleet/client_key"),
}
COMPOSE = {"INVENTORY": "inventory.yaml", "KNOWN_HOSTS": "known_hosts", "CLIENT_KEY": "id_ed25519"}


def remediator_file(name: str, var: Path | None, option: Path | None = None, *, fallback: bool = True) -> Path | None:
    """The file `name` (INVENTORY, KNOWN_HOSTS or CLIENT_KEY) as above; without `fallback`, None
    where neither an option, a setting nor an embedded stack names one."""
    if option:
        return option
    if setting := os.environ.get(f"GPUMEDIC_REMEDIATOR_{name}", "").strip():
        return Path(setting)
    for place in EMBEDDED[name] if var is not None else ():
        if (var / place).exists():
            return var / place
    return Path("/etc/gpumedic") / COMPOSE[name] if fallback else None
