"""Each node's finished minutes as rows of their own until their hour is folded into its
`node_history` row: rewriting the hour's row each minute cost an hour's encoding per node.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-27 15:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0017"
down_revision: str | Sequence[str] | None = "0016"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_minutes",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("minute", sa.DateTime(timezone=True), primary_key=True, comment="Start of the minute (UTC)."),
        sa.Column("figures", sa.LargeBinary(), nullable=False, comment="zlib-compressed JSON: gpumedic_store.history.Columns of one minute."),
    )
    op.create_index("ix_node_minutes_minute", "node_minutes", ["minute"])


def downgrade() -> None:
    op.drop_index("ix_node_minutes_minute", table_name="node_minutes")
    op.drop_table("node_minutes")
