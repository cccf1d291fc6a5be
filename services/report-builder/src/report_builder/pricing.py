"""What report-builder prices an incident's lost GPU time with: the inventory's `gpus` and
`price_per_gpu_hour` for the node (the file is read again when it changes), and, where the
inventory gives no GPU count, as many GPUs as the node's last sample had. A rented worker's price
is its provider's, which its incident's evidence carries (`gpumedic_store.cost`)."""

from __future__ import annotations

import logging
from pathlib import Path

from gpumedic_events import NodeSampled
from gpumedic_nodes.inventory import InventoryError, NodeAddress, load_inventory
from gpumedic_store.cost import Price

log = logging.getLogger(__name__)


class Pricing:
    def __init__(self, inventory: Path | None = None) -> None:
        self.inventory = inventory
        self._nodes: dict[str, NodeAddress] = {}
        self._read: tuple[float, int] | None = None
        """The inventory file's (mtime, size) when it was last read."""
        self._gpus_seen: dict[str, int] = {}
        self._failed: str | None = None
        """Why the inventory last could not be read, once said."""

    async def on_sample(self, sample: NodeSampled) -> None:
        if sample.gpus:
            self._gpus_seen[sample.node_id] = len(sample.gpus)

    def price(self, node_id: str) -> Price:
        node = self._nodes_now().get(node_id)
        gpus = (node.gpus if node else None) or self._gpus_seen.get(node_id)
        if node is None:
            return Price(gpus=gpus)
        return Price(gpus=gpus, per_gpu_hour=node.price_per_gpu_hour, provider=node.provider)

    def _nodes_now(self) -> dict[str, NodeAddress]:
        if self.inventory is None:
            return {}
        try:
            stat = self.inventory.stat()
            if self._read != (stat.st_mtime, stat.st_size):
                self._nodes, self._read, self._failed = load_inventory(self.inventory), (stat.st_mtime, stat.st_size), None
        except (OSError, InventoryError) as exc:
            if str(exc) != self._failed:  # said once, not on every price asked for
                log.warning("pricing: %s; incidents are priced with what was read before", exc)
                self._failed = str(exc)
            self._read = None
        return self._nodes
