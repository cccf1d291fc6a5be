"""The worker pool's capacity over time: every round the autoscaler publishes, kept by
report-builder, so that the console can draw queue depth, workers and cost over hours.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-23 22:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0009"
down_revision: str | Sequence[str] | None = "0008"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "capacity_checks",
        sa.Column("event_id", sa.String(36), primary_key=True),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("decision", sa.String(16), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("gpus_total", sa.Integer(), nullable=False),
        sa.Column("gpus_busy", sa.Integer(), nullable=False),
        sa.Column("gpus_wanted", sa.Integer(), nullable=True),
        sa.Column("queued", sa.Integer(), nullable=True),
        sa.Column("in_progress", sa.Integer(), nullable=True),
        sa.Column("workers", sa.Integer(), nullable=True),
        sa.Column("workers_in_service", sa.Integer(), nullable=True),
        sa.Column("cost_per_h", sa.Float(), nullable=True),
        sa.Column("cost_total", sa.Float(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True, comment="Why no decision was made (demand source or provider)."),
    )
    op.create_index("ix_capacity_checks_checked_at", "capacity_checks", ["checked_at"])


def downgrade() -> None:
    op.drop_index("ix_capacity_checks_checked_at", table_name="capacity_checks")
    op.drop_table("capacity_checks")
