"""Each node's sample figures minute by minute, one row per node and hour, so history outlives the
samples stream.

Revision ID: 0013
Revises: 0012
Create Date: 2026-11-26 11:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | Sequence[str] | None = "0012"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_history",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("hour", sa.DateTime(timezone=True), primary_key=True, comment="Start of the hour (UTC)."),
        sa.Column("figures", sa.LargeBinary(), nullable=False, comment="zlib-compressed JSON: gpumedic_store.history.Columns."),
    )
    op.create_index("ix_node_history_hour", "node_history", ["hour"])


def downgrade() -> None:
    op.drop_index("ix_node_history_hour", table_name="node_history")
    op.drop_table("node_history")
