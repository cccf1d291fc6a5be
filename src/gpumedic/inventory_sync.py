"""`gpumedic inventory sync`: the provider already knows every rented pod's address and SSH port,
so the inventory's entries for them are written from its list instead of by hand.

- A pod that runs and gives SSH details becomes (or updates) the node named by its pod name, when
  that is a valid node id, else by its pod id (`restart_worker` finds a node's pod by either), in
  the group given, with the labels `pod` (its id) and `synced` (the provider's kind). Only entries
  that carry the `synced` label of this provider are ever changed: a node you wrote by hand keeps
  its entry, and a pod named like it is reported and left out.
- A synced entry whose pod the provider no longer lists is marked `gone: "true"`, never dropped: a
  person decides (the remediator still reads it; `gpumedic inventory check` will say it fails).
- The file keeps its comments and order (ruamel.yaml's round trip), is checked with the
  remediator's own loader before it is replaced, and is replaced in one rename.
"""

from __future__ import annotations

import io
import os
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap

from gpumedic_nodes.inventory import InventoryError, load_inventory
from gpumedic_providers.base import Provider, Worker

NODE_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_-]{0,62}$")
"""What a pod name must look like to be a node id (a subject token and an inventory name)."""
MAX_INVENTORY_BYTES = 1024 * 1024


@dataclass
class SyncReport:
    added: list[str] = field(default_factory=list)
    updated: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    gone: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    """One line per pod left out, saying why."""

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.gone)

    def lines(self) -> list[str]:
        out = [f"added {n}" for n in self.added] + [f"updated {n}" for n in self.updated]
        out += [f"marked gone {n} (its pod is no longer listed; remove the entry when you are sure)" for n in self.gone]
        out += [f"skipped {line}" for line in self.skipped]
        out.append(f"{len(self.added)} added, {len(self.updated)} updated, {len(self.unchanged)} unchanged, "
                   f"{len(self.gone)} marked gone, {len(self.skipped)} skipped")
        return out


def node_id_of(worker: Worker) -> str:
    return worker.name if NODE_ID.match(worker.name or "") else worker.worker_id


async def sync(inventory: Path, provider: Provider, *, kind: str, group: str, user: str, dry_run: bool = False) -> SyncReport:
    """Bring `inventory`'s entries for `provider`'s pods up to date; the file is written unless `dry_run`."""
    yaml, document = _load(inventory)
    groups = document.setdefault("groups", CommentedMap())
    nodes = document.setdefault("nodes", CommentedMap())
    if not isinstance(groups, dict) or not isinstance(nodes, dict):
        raise InventoryError(f"inventory {inventory}: `groups` and `nodes` must be mappings")
    if group not in groups:
        groups[group] = CommentedMap(user=user, labels=CommentedMap(provider=kind))

    report = SyncReport()
    listed = await provider.workers()
    seen: set[str] = set()
    for worker in listed:
        node = node_id_of(worker)
        if worker.status != "running" or worker.ssh is None:
            report.skipped.append(f"{node} (pod {worker.worker_id}): {worker.status}, no SSH details yet")
            continue
        current = nodes.get(node)
        if current is not None and _synced_by(current) != kind:
            report.skipped.append(f"{node} (pod {worker.worker_id}): the inventory has a node of that name it did not write")
            continue
        seen.add(node)
        wanted = {"host": worker.ssh.host, "port": worker.ssh.port, "group": group}
        labels = {"pod": worker.worker_id, "synced": kind}
        if current is None:
            nodes[node] = CommentedMap({**wanted, "labels": CommentedMap(labels)})
            report.added.append(node)
            continue
        before = (dict(current), dict(current.get("labels") or {}))
        current.update(wanted)
        entry_labels = current.setdefault("labels", CommentedMap())
        entry_labels.update(labels)
        entry_labels.pop("gone", None)
        (report.updated if (dict(current), dict(entry_labels)) != before else report.unchanged).append(node)
    for node, entry in nodes.items():
        if node not in seen and isinstance(entry, dict) and _synced_by(entry) == kind:
            labels = entry.setdefault("labels", CommentedMap())
            if labels.get("gone") != "true":
                labels["gone"] = "true"
                report.gone.append(node)

    out = io.StringIO()
    yaml.dump(document, out)
    if report.changed and not dry_run:
        _replace_checked(inventory, out.getvalue())
    return report


def set_node_setting(inventory: Path, node: str, key: str, value: object | None) -> bool:
    """Set one setting of one node's own entry (None: remove it), keeping the rest of the file as
    it is (what `gpumedic enroll` records: the node's service manager); whether anything changed."""
    yaml, document = _load(inventory)
    entry = (document.get("nodes") or {}).get(node)
    if not isinstance(entry, dict):
        raise InventoryError(f"unknown node {node!r}: not in inventory {inventory}")
    if entry.get(key) == value or (value is None and key not in entry):
        return False
    if value is None:
        del entry[key]
    else:
        entry[key] = value
    out = io.StringIO()
    yaml.dump(document, out)
    _replace_checked(inventory, out.getvalue())
    return True


def _load(inventory: Path) -> tuple[YAML, CommentedMap]:
    """The inventory as a round-trip document (comments and order kept), and the YAML that writes it back."""
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    try:
        text = inventory.read_text() if inventory.exists() else ""
    except OSError as exc:
        raise InventoryError(f"inventory {inventory} cannot be read: {exc.strerror or exc}") from None
    if len(text) > MAX_INVENTORY_BYTES:
        raise InventoryError(f"inventory {inventory} is larger than {MAX_INVENTORY_BYTES} bytes")
    document = yaml.load(text) if text.strip() else CommentedMap()
    if not isinstance(document, dict):
        raise InventoryError(f"inventory {inventory} is not a mapping at the top")
    return yaml, document


def _synced_by(entry: object) -> str | None:
    labels = entry.get("labels") if isinstance(entry, dict) else None
    return labels.get("synced") if isinstance(labels, dict) else None


def _replace_checked(inventory: Path, text: str) -> None:
    """Write `text` beside the inventory, load it as the remediator does, then rename it over."""
    inventory.parent.mkdir(parents=True, exist_ok=True)
    mode = inventory.stat().st_mode & 0o777 if inventory.exists() else 0o644
    fd, name = tempfile.mkstemp(prefix=f".{inventory.name}.", dir=inventory.parent)
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(text)
        os.chmod(name, mode)
        try:
            load_inventory(Path(name))  # what the remediator would refuse is never put in place
        except InventoryError as exc:
            raise InventoryError(f"the changed {inventory} would not load, so it was not written: {exc}") from None
        os.replace(name, inventory)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
