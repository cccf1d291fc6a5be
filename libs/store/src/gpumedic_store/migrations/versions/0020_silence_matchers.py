"""A silence keeps its matchers (`node=~gpu-0[34]`, `kind!=gpu_xid`) as an operator wrote them.

Revision ID: 0020
Revises: 0019
Create Date: 2026-11-27 17:40:00
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0020"
down_revision: str | Sequence[str] | None = "0019"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    with op.batch_alter_table("silences") as batch:
        batch.add_column(sa.Column("matchers", sa.JSON(), nullable=True, comment="Conditions on the incident's labels, as written (node=~REGEX, kind!=KIND); NULL: none."))


def downgrade() -> None:
    with op.batch_alter_table("silences") as batch:
        batch.drop_column("matchers")
