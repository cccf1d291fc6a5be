"""A silence may recur (a weekly maintenance window): its period, and when its last window ends
(the list of silences in force reads that, not the first window's end).

Revision ID: 0022
Revises: 0021
Create Date: 2026-11-27 17:30:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0022"
down_revision: str | Sequence[str] | None = "0021"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("silences") as batch:
        batch.add_column(sa.Column("every_s", sa.Integer(), nullable=True, comment="A recurring window's period; NULL: one window."))
        batch.add_column(sa.Column("last_ends_at", sa.DateTime(timezone=True), nullable=True, comment="When its last window ends; NULL: at ends_at."))


def downgrade() -> None:
    with op.batch_alter_table("silences") as batch:
        batch.drop_column("last_ends_at")
        batch.drop_column("every_s")
