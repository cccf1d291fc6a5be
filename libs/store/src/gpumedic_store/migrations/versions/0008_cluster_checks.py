"""The peer cluster's monitoring log: every check leader-health publishes, kept by report-builder,
so that `gpumedic cluster log` can show the cluster over hours as the runbook's hand-kept log did.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-23 14:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | Sequence[str] | None = "0007"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "cluster_checks",
        sa.Column("event_id", sa.String(36), primary_key=True),
        sa.Column("cluster", sa.String(128), nullable=False),
        sa.Column("checked_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("peers_total", sa.Integer(), nullable=False),
        sa.Column("peers_answering", sa.Integer(), nullable=False),
        sa.Column("leader", sa.String(256), nullable=True),
        sa.Column("healthy", sa.Boolean(), nullable=False),
        sa.Column("summary", sa.Text(), nullable=False),
        sa.Column("problems", sa.JSON(), nullable=False, comment="Peers without a usable status, and why."),
    )
    op.create_index("ix_cluster_checks_cluster_time", "cluster_checks", ["cluster", "checked_at"])


def downgrade() -> None:
    op.drop_index("ix_cluster_checks_cluster_time", table_name="cluster_checks")
    op.drop_table("cluster_checks")
