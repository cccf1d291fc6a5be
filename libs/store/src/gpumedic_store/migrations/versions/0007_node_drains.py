"""Drained nodes: one row per incident that holds a node out of service, so the node returns to
the scheduler only when the last of them was fixed and validated.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-23 10:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op


revision: str = "0007"
down_revision: str | Sequence[str] | None = "0006"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_drains",
        sa.Column("node_id", sa.String(63), primary_key=True),
        sa.Column("incident_id", sa.String(36), primary_key=True),
        sa.Column("action_id", sa.String(36), nullable=False, comment="The drain_node action."),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("drained_at", sa.DateTime(timezone=True), nullable=False),
    )


def downgrade() -> None:
    op.drop_table("node_drains")
