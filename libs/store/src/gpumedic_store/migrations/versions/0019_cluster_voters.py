"""Each cluster check keeps the voters the daemons count (alive and configured), so the quorum
margin is the voters' as the runbook's log writes it ("Voters 5/7 (quorum OK)"), not all peers'.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-27 15:20:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | Sequence[str] | None = "0018"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("cluster_checks") as batch:
        batch.add_column(sa.Column("voters_alive", sa.Integer(), nullable=True, comment="Voters alive as the daemons count them (the leader's count, else the most common); None when they report none."))
        batch.add_column(sa.Column("voters_total", sa.Integer(), nullable=True, comment="Voters configured as the daemons count them; None when they report none."))


def downgrade() -> None:
    with op.batch_alter_table("cluster_checks") as batch:
        batch.drop_column("voters_total")
        batch.drop_column("voters_alive")
