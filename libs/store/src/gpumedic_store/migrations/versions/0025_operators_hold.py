"""Drains that fleet operations made are one hold per node, the operators' (`OPERATORS_HOLD`):
before, each rollout's drains were held under that rollout's own id, which no later rollout's
undrain could release. Those holds (the rollout's reason says so) become the operators' hold,
the oldest kept where a node had several.

Revision ID: 0025
Revises: 0024
Create Date: 2026-12-07 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0025"
down_revision: str | Sequence[str] | None = "0024"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_HOLD = "rollout"  # gpumedic_store.models.OPERATORS_HOLD as this revision wrote it
_DRAINS = sa.table("node_drains", sa.column("node_id", sa.String), sa.column("incident_id", sa.String),
                   sa.column("reason", sa.Text), sa.column("drained_at", sa.DateTime))


def upgrade() -> None:
    bind = op.get_bind()
    rows = bind.execute(
        sa.select(_DRAINS.c.node_id, _DRAINS.c.incident_id)
        .where(_DRAINS.c.reason.like("rollout drain_node by %"), _DRAINS.c.incident_id != _HOLD)
        .order_by(_DRAINS.c.node_id, _DRAINS.c.drained_at)
    ).all()
    held = set(bind.execute(sa.select(_DRAINS.c.node_id).where(_DRAINS.c.incident_id == _HOLD)).scalars())
    for node_id, incident_id in rows:
        where = (_DRAINS.c.node_id == node_id) & (_DRAINS.c.incident_id == incident_id)
        if node_id in held:
            bind.execute(sa.delete(_DRAINS).where(where))
        else:
            bind.execute(sa.update(_DRAINS).where(where).values(incident_id=_HOLD))
            held.add(node_id)


def downgrade() -> None:
    """The operators' holds stay as they are: an older release sees them as one more holder, which
    it cannot release either (as before this revision)."""
