"""Each node's day in figures (observed and busy GPU-minutes), kept for the reliability report.

Revision ID: 0015
Revises: 0014
Create Date: 2026-11-26 12:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | Sequence[str] | None = "0014"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "node_days",
        sa.Column("node_id", sa.String(128), primary_key=True),
        sa.Column("day", sa.DateTime(timezone=True), primary_key=True, comment="00:00 UTC of the day."),
        sa.Column("provider", sa.String(128), nullable=True, comment="Who rents it out, as the inventory says (its provider label or group)."),
        sa.Column("sampled_minutes", sa.Integer(), nullable=False, comment="Minutes with at least one sample."),
        sa.Column("gpu_minutes", sa.Integer(), nullable=False, comment="GPU-minutes observed: each sampled minute, its GPU count."),
        sa.Column("busy_gpu_minutes", sa.Integer(), nullable=False, comment="GPU-minutes at work (utilisation at least BUSY_PCT)."),
    )
    op.create_index("ix_node_days_day", "node_days", ["day"])


def downgrade() -> None:
    op.drop_index("ix_node_days_day", table_name="node_days")
    op.drop_table("node_days")
