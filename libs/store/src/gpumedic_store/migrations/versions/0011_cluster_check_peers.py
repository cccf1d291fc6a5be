"""A cluster check keeps its per-peer table (state, role, voter, answer time, the leader's count of
its jobs and GPU %), as the runbook's monitoring log shows it.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-26 01:10:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0011"
down_revision: str | Sequence[str] | None = "0010"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster_checks") as batch:
        batch.add_column(sa.Column("peers", sa.JSON(), nullable=False, server_default="[]",
                                   comment="Every probed peer: state, role, voter, answer time, jobs and GPU % (the leader's)."))


def downgrade() -> None:
    with op.batch_alter_table("cluster_checks") as batch:
        batch.drop_column("peers")
