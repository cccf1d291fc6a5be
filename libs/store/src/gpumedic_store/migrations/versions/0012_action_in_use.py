"""An action blocked only because its target was in use (a GPU reset while a process holds the GPU)
says so, so the detector asks again once it may be free instead of calling a person at once.

Revision ID: 0012
Revises: 0011
Create Date: 2026-11-26 09:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | Sequence[str] | None = "0011"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("in_use", sa.Boolean(), nullable=False, server_default=sa.false(),
                                   comment="Blocked only because the target was in use (ActionCompleted.in_use)."))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("in_use")
