"""The ledger keeps why each action was asked for, and by whom: a pre-flight clean is asked for
by a job launcher, not by an incident's detector, and the audit log must say so.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-23 21:00:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | Sequence[str] | None = "0005"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.add_column(sa.Column("requested_by", sa.String(63), nullable=False, server_default="", comment="The service that asked."))
        batch.add_column(sa.Column("reason", sa.Text(), nullable=False, server_default="", comment="Why it was asked for."))


def downgrade() -> None:
    with op.batch_alter_table("actions") as batch:
        batch.drop_column("reason")
        batch.drop_column("requested_by")
